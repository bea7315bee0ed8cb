"""Compile many small ATen programs as one graph, then compare each output with eager.

One graph per batch keeps the number of C++ compilations small (outputs sharing an
iteration space fuse into one kernel), while results are still checked op by op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from kiln_inductor import compile_aten_graph
from kiln_inductor.passes import fill_meta


@dataclass(frozen=True)
class Case:
    label: str
    fn: Callable[..., Any]
    inputs: tuple[Any, ...]


_tracer: list[Any] = []


def factory(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a factory op (no tensor arguments): a graph node while building, eager otherwise."""
    if _tracer:
        return _tracer[-1].create_proxy("call_function", op, args, kwargs)
    return op(*args, **kwargs)


def build_graph(
    cases: Sequence[Case],
) -> tuple[torch.fx.GraphModule, list[Any], list[tuple[str, int]]]:
    graph = torch.fx.Graph()
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)
    flat: list[Any] = []
    outs: list[torch.fx.Node] = []
    labels: list[tuple[str, int]] = []
    for case in cases:
        proxies = []
        for x in case.inputs:
            node = graph.placeholder(f"in{len(flat)}")
            node.meta["val"] = x
            flat.append(x)
            proxies.append(torch.fx.Proxy(node, tracer))
        _tracer.append(tracer)
        try:
            result = case.fn(*proxies)
        finally:
            _tracer.pop()
        items = result if isinstance(result, (tuple, list)) else (result,)
        for k, item in enumerate(items):
            outs.append(item.node)
            labels.append((case.label, k))
    graph.output(tuple(outs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fill_meta(gm)
    return gm, flat, labels


def run_batch(cases: Sequence[Case]) -> dict[str, Any]:
    """label -> list of (expected, got) pairs, or the exception compiling raised."""
    gm, flat, labels = build_graph(cases)
    try:
        compiled = compile_aten_graph(gm, flat)
        got = compiled(*flat)
    except Exception as e:  # reported by every op of the batch
        return {c.label: e for c in cases}
    results: dict[str, Any] = {c.label: [] for c in cases}
    expected: list[Any] = []
    for case in cases:
        r = case.fn(*case.inputs)
        expected.extend(r if isinstance(r, (tuple, list)) else (r,))
    for (label, _), e, g in zip(labels, expected, got):
        results[label].append((e, g))
    return results


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.bfloat16, torch.float16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype == torch.float32:
        return {"rtol": 1.3e-5, "atol": 1e-5}
    return {}


def assert_case(result: Any, dtype: torch.dtype | None = None, **tol: float) -> None:
    if isinstance(result, Exception):
        raise result
    assert result, "no outputs"
    for e, g in result:
        assert g.shape == e.shape, (g.shape, e.shape)
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        kw = tol or tolerance(e.dtype)
        torch.testing.assert_close(g, e, equal_nan=True, **kw)


cached_batch = functools.lru_cache(maxsize=None)
