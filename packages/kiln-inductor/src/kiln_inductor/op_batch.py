"""Op sweeps for backends' tests: many small ATen programs compiled as one graph, each
output compared with eager.

One graph per batch keeps the number of kernel builds (or interpreter runs) small, while
results are still checked op by op. A case whose ops ran as library calls instead of
generated kernels fails ``assert_case`` (unless the test says it expects that), so deleting
a lowering fails the sweep instead of passing through eager's kernel.

    results = run_batch([Case("exp", lambda a: aten.exp.default(a), (x,))])
    assert_case(results["exp"])
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from .compile import compile_aten_graph
from .passes import fill_meta


@dataclass(frozen=True)
class Case:
    label: str
    fn: Callable[..., Any]
    inputs: tuple[Any, ...]


class CaseResult(list):
    """A case's (expected, got) pairs, and its ops that ran as library calls."""

    fallbacks: frozenset[str] = frozenset()


_tracer: list[Any] = []


def factory(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a factory op (no tensor arguments): a graph node while building, eager otherwise."""
    if _tracer:
        return _tracer[-1].create_proxy("call_function", op, args, kwargs)
    return op(*args, **kwargs)


def build_graph(
    cases: Sequence[Case],
) -> tuple[torch.fx.GraphModule, list[Any], list[tuple[str, int]], dict[str, set[str]]]:
    """The batch's graph, its flat inputs, (label, output index) per graph output, and the
    ops each case's nodes call."""
    graph = torch.fx.Graph()
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)
    flat: list[Any] = []
    outs: list[torch.fx.Node] = []
    labels: list[tuple[str, int]] = []
    ops: dict[str, set[str]] = {}
    for case in cases:
        before = set(graph.nodes)
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
        ops[case.label] = {  # the ATen ops under test (not getattr of a proxy's .shape)
            str(n.target)
            for n in graph.nodes
            if n not in before and isinstance(n.target, torch._ops.OpOverload)
        }
        items = result if isinstance(result, (tuple, list)) else (result,)
        for k, item in enumerate(items):
            outs.append(item.node)
            labels.append((case.label, k))
    graph.output(tuple(outs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fill_meta(gm)
    return gm, flat, labels, ops


def run_batch(
    cases: Sequence[Case], context: Callable[[], Any] = contextlib.nullcontext
) -> dict[str, Any]:
    """label -> ``CaseResult``, or the exception compiling raised (for every case);
    ``context()`` is entered around compiling and running (a backend override)."""
    gm, flat, labels, ops = build_graph(cases)
    try:
        with context():
            compiled = compile_aten_graph(gm, flat)
            got = compiled(*flat)
    except Exception as e:  # reported by every op of the batch
        return {c.label: e for c in cases}
    fell_back = set(compiled.stats["fallbacks"])
    results: dict[str, Any] = {}
    for c in cases:
        results[c.label] = CaseResult()
        results[c.label].fallbacks = frozenset(ops[c.label] & fell_back)
    expected: list[Any] = []
    for case in cases:
        r = case.fn(*case.inputs)
        expected.extend(r if isinstance(r, (tuple, list)) else (r,))
    for (label, _), e, g in zip(labels, expected, got):
        results[label].append((e, g))
    return results


def tolerance(dtype: torch.dtype, float32: tuple[float, float] = (1.3e-5, 1e-5)) -> dict:
    if dtype in (torch.bfloat16, torch.float16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype == torch.float32:
        return {"rtol": float32[0], "atol": float32[1]}
    return {}


def assert_case(
    result: Any,
    dtype: torch.dtype | None = None,
    allow_fallback: bool = False,
    float32: tuple[float, float] = (1.3e-5, 1e-5),
    **tol: float,
) -> None:
    if isinstance(result, Exception):
        raise result
    assert result, "no outputs"
    if not allow_fallback:
        ran = sorted(getattr(result, "fallbacks", ()))
        assert not ran, f"{ran} ran as library calls, not generated kernels (a lowering is missing)"
    for e, g in result:
        assert g.shape == e.shape, (g.shape, e.shape)
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        torch.testing.assert_close(g, e, equal_nan=True, **(tol or tolerance(e.dtype, float32)))


def make(
    shape: Sequence[int], dtype: torch.dtype, domain: str = "any", device: str = "cpu"
) -> torch.Tensor:
    """Random (never all-zero) inputs in a domain: any, pos (>0), unit (-0.9..0.9), ge1
    (>= 1.05), seeded by shape, dtype and domain."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((tuple(shape), str(dtype), domain)).encode()))
    if dtype == torch.bool:
        t = torch.rand(shape, generator=g) > 0.5
    elif not dtype.is_floating_point:
        lo, hi = {"pos": (1, 9), "unit": (0, 2)}.get(domain, (-9, 9))
        t = torch.randint(lo, hi, shape, generator=g).to(dtype)
    else:
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        if domain == "pos":
            t = t.abs() + 0.1
        elif domain == "unit":
            t = torch.tanh(t) * 0.9
        elif domain == "ge1":
            t = t.abs() + 1.05
        t = t.to(dtype)
    return t.to(device)
