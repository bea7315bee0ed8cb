"""Sizes and numbers of the data on the CPU (issue #17): the wrapper runs a data-dependent
op as a library call, binds its unbacked symbol from the result right after it, and the
kernels after it take the symbol as a size argument; the same compiled graph serves every
data pattern."""

from __future__ import annotations

import torch
import torch.fx

import kiln_cpp  # noqa: F401  (registers the CPU backend)
import kiln_inductor
from kiln_inductor.testing import CountingCompiler as Counting


def _compile(fn, *inputs):
    counting = Counting()
    compiled = kiln_inductor.compile_fx(
        torch.fx.symbolic_trace(fn), list(inputs), compile_graph=counting
    )
    assert len(counting.graphs) == 1
    return compiled, counting.graphs[0]


def _in_order(text: str, fragments: list[str]) -> None:
    at = 0
    for f in fragments:
        found = text.find(f, at)
        assert found >= 0, f"{f!r} not after position {at} in:\n{text}"
        at = found + len(f)


def _masked(x):
    return (x[x > 0] * 2 + 1).sum()


def test_nonzero_count_is_bound_before_the_kernels_that_use_it():
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    compiled, graph = _compile(_masked, x)
    src = graph.wrapper_source
    # the library call, the symbol read from its result, then a kernel taking it
    _in_order(src, ["# extern aten.nonzero.default", "s0 = buf", ".size(0)", "kernel_", ", s0)"])
    assert graph.stats["kernels"] > 0 and not graph.stats["fallbacks"]
    for seed in (1, 2, 3):
        y = torch.randn(7, 5, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(compiled(y), _masked(y))


def _scaled(x, t):
    return x * t.item() + 1


def test_item_operand_is_read_by_the_kernel():
    x, t = torch.randn(4, 6), torch.tensor(2.5)
    compiled, graph = _compile(_scaled, x, t)
    assert graph.stats["kernels"] > 0 and not graph.stats["fallbacks"]
    for value in (2.5, -0.75):
        t = torch.tensor(value)
        torch.testing.assert_close(compiled(x, t), _scaled(x, t))
