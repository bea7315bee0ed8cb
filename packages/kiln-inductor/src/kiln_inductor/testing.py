"""Helpers for tests of kiln-inductor and its backends: ATen graphs without a tracer.

``aten_graph(fn, inputs)`` symbolically traces a function that calls ``torch.ops.aten.*``
overloads explicitly (DESIGN.md contract 3 form) and fills ``meta['val']`` by running it on
the meta device. ``check_compiled(fn, inputs)`` compiles such a graph and compares every
output with eager.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .compile import compile_aten_graph
from .graph import fill_meta


def aten_graph(fn: Callable[..., Any], inputs: Sequence[Any]) -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(fn)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, x in zip(placeholders, inputs):
        n.meta["val"] = x
    out = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(out.args[0], (tuple, list)):
        out.args = ((out.args[0],),)
    gm.recompile()
    fill_meta(gm)
    return gm


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flat(v)]
    return [x]


def check_compiled(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    rtol: float | None = None,
    atol: float | None = None,
) -> Any:
    """Compile ``fn`` (an ATen-op function), run it, assert it matches eager; returns the
    CompiledGraph."""
    gm = aten_graph(fn, inputs)
    compiled = compile_aten_graph(gm, inputs)
    expected = _flat(fn(*inputs))
    got = _flat(compiled(*inputs))
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        if isinstance(e, torch.Tensor):
            assert isinstance(g, torch.Tensor), (e, g)
            assert e.shape == g.shape, (e.shape, g.shape)
            assert e.dtype == g.dtype, (e.dtype, g.dtype)
            kw = {} if rtol is None else {"rtol": rtol, "atol": atol if atol is not None else rtol}
            torch.testing.assert_close(g, e, equal_nan=True, **kw)
        else:
            assert e == g
    return compiled
