"""Compile many small ATen programs as one graph through kiln-triton, then compare each
output with eager.

One graph per batch keeps the number of kernels (and interpreter runs) small; results are
still checked op by op. ``device="cpu"`` runs the Triton kernels in Triton's interpreter.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from kiln_inductor import compile_aten_graph
from kiln_inductor.passes import fill_meta
from kiln_triton.testing import use_triton_for_cpu


@dataclass(frozen=True)
class Case:
    label: str
    fn: Callable[..., Any]
    inputs: tuple[Any, ...]


def build_graph(cases: Sequence[Case]) -> tuple[torch.fx.GraphModule, list[Any], list[str]]:
    graph = torch.fx.Graph()
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)
    flat: list[Any] = []
    outs: list[torch.fx.Node] = []
    labels: list[str] = []
    for case in cases:
        proxies = []
        for x in case.inputs:
            node = graph.placeholder(f"in{len(flat)}")
            node.meta["val"] = x
            flat.append(x)
            proxies.append(torch.fx.Proxy(node, tracer))
        result = case.fn(*proxies)
        for item in result if isinstance(result, (tuple, list)) else (result,):
            outs.append(item.node)
            labels.append(case.label)
    graph.output(tuple(outs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fill_meta(gm)
    return gm, flat, labels


def run_batch(cases: Sequence[Case]) -> dict[str, Any]:
    """label -> list of (expected, got) pairs, or the exception compiling raised."""
    gm, flat, labels = build_graph(cases)
    try:
        with use_triton_for_cpu():
            got = compile_aten_graph(gm, flat)(*flat)
    except Exception as e:  # reported by every op of the batch
        return {c.label: e for c in cases}
    expected: list[Any] = []
    for case in cases:
        r = case.fn(*case.inputs)
        expected.extend(r if isinstance(r, (tuple, list)) else (r,))
    results: dict[str, Any] = {c.label: [] for c in cases}
    for label, e, g in zip(labels, expected, got):
        results[label].append((e, g))
    return results


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.bfloat16, torch.float16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype == torch.float32:
        return {"rtol": 2e-5, "atol": 1e-5}
    return {}


def assert_case(result: Any, **tol: float) -> None:
    if isinstance(result, Exception):
        raise result
    assert result, "no outputs"
    for e, g in result:
        assert g.shape == e.shape, (g.shape, e.shape)
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        torch.testing.assert_close(g, e, equal_nan=True, **(tol or tolerance(e.dtype)))


def make(
    shape: Sequence[int], dtype: torch.dtype, domain: str = "any", device: str = "cpu"
) -> torch.Tensor:
    """Random (never all-zero) inputs in a domain: any, pos (>0), unit (-0.9..0.9), ge1."""
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
        t = t.to(dtype)
    return t.to(device)
