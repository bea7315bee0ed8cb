"""Ops with no decomposition that return new tensors stay in the graph as library calls
(DESIGN.md contract 3): the graph is traced whole, the op is marked, the contract holds."""

from __future__ import annotations

import re

import pytest
import torch

import kiln_aot
from kiln_aot import core_ops, trace


def _library_nodes(gm):
    return [n for n in gm.graph.nodes if n.meta.get("kiln_library_op")]


def test_ops_without_decomposition_stay_as_library_calls():
    def f(x, y):
        a = torch.fmax(x, y) + 1
        b = torch.special.digamma(x.abs() + 1)
        c = torch.fft.rfft(x, dim=1).abs()
        return a, b, c

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    gm = trace(f, [x, y])
    kiln_aot.verify_graph(gm)
    library = _library_nodes(gm)
    assert library, gm.code
    for n in library:
        assert core_ops.is_library_callable(n.target)
        assert not core_ops.is_allowed(n.target)
    for got, want in zip(gm(x, y), f(x, y)):
        torch.testing.assert_close(got, want)


def test_training_through_a_library_op():
    def f(x):
        return (torch.special.digamma(x.abs() + 1) * x.sin()).sum()

    x = torch.randn(5, 3, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    seen = []

    def compiler(gm, inputs):
        kiln_aot.verify_graph(gm)
        seen.append(gm)
        return gm

    out = kiln_aot.aot_function(f, compiler, compiler)(x)
    out.backward()
    f(ref).backward()
    torch.testing.assert_close(x.grad, ref.grad)
    assert len(seen) == 2 and any(_library_nodes(g) for g in seen)


def test_library_callable_excludes_writes_and_aliases():
    aten = torch.ops.aten
    assert core_ops.is_library_callable(aten.fmax.default)
    assert not core_ops.is_library_callable(aten.add_.Tensor)  # writes its argument
    assert not core_ops.is_library_callable(aten.alias.default)  # returns an alias
    assert not core_ops.is_library_callable(aten.bincount.default)  # an unknown shape
    # a data-dependent shape kiln-shapes sizes with an unbacked symbol
    assert core_ops.is_library_callable(aten.nonzero.default)


def _shapes(out):
    out = out if isinstance(out, (tuple, list)) else [out]
    return [(tuple(t.shape), t.stride(), t.dtype) for t in out]


def test_meta_kernels_of_library_ops_match_eager_layouts():
    """geqrf and the histogram ops have no meta kernel in torch; kiln_aot registers one
    (decompositions/meta.py) with eager's shapes, strides (geqrf: column-major) and errors."""
    aten = torch.ops.aten
    b2, b4 = torch.tensor([0.0, 1.0]), torch.tensor([-1.0, 0.0, 1.0, 2.0])
    calls = [
        *[(aten.geqrf.default, torch.randn(s)) for s in [(5, 3), (3, 5), (2, 4, 3), (4, 0, 2)]],
        (aten.geqrf.default, torch.randn(3, 5).t()),
        (lambda x: aten.histogram.bin_ct(x, 4), torch.randn(4, 5)),
        (lambda x: aten.histogram.bins_tensor(x, b4), torch.randn(7)),
        (lambda x: aten._histogramdd_bin_edges.default(x, [3, 4]), torch.randn(6, 2)),
        (lambda x: aten._histogramdd_from_bin_cts.default(x, [3, 4]), torch.randn(2, 3, 2)),
        (lambda x: aten._histogramdd_from_bin_tensors.default(x, [b2, b4]), torch.randn(6, 2)),
    ]
    for op, x in calls:
        assert _shapes(op(x.to("meta"))) == _shapes(op(x))
    for bad in (torch.zeros(3), torch.zeros(3, 3, dtype=torch.long)):
        with pytest.raises(RuntimeError) as eager:
            aten.geqrf.default(bad)
        with pytest.raises(RuntimeError, match=re.escape(str(eager.value).splitlines()[0])):
            aten.geqrf.default(bad.to("meta"))


def test_ops_without_a_torch_meta_kernel_stay_as_library_calls():
    def f(x, b):
        a, tau = torch.geqrf(x * 2)
        hist, edges = torch.histogram(x.flatten(), 5)
        dd, dd_edges = torch.histogramdd(x[:, :2], [b, b])
        return a + 1, tau, hist, edges, dd, *dd_edges

    x, b = torch.randn(6, 3), torch.tensor([-1.0, 0.0, 0.5, 1.0])
    gm = trace(f, [x, b])
    kiln_aot.verify_graph(gm)
    assert {str(n.target) for n in _library_nodes(gm)} >= {
        "aten.geqrf.default",
        "aten.histogram.bin_ct",
        "aten._histogramdd_from_bin_tensors.default",
    }
    for got, want in zip(gm(x, b), f(x, b)):
        torch.testing.assert_close(got, want)


def test_random_ops_outside_the_core_set_draw_eagers_numbers():
    """cauchy/exponential/geometric/log_normal stay whole (library calls drawing from ATen's
    generator in program order): their decompositions draw other numbers than eager's."""

    def f(x):
        a = torch.ops.aten.exponential.default(x) + torch.ops.aten.cauchy.default(x)
        return (
            a * 2 + torch.ops.aten.log_normal.default(x) + torch.ops.aten.geometric.default(x, 0.3)
        )

    x = torch.rand(5, 4)
    torch.manual_seed(3)
    want = f(x)
    gm = trace(f, [x])
    library = {n.target for n in _library_nodes(gm)}
    assert torch.ops.aten.cauchy.default in library, gm.code
    assert torch.ops.aten.exponential.default in library, gm.code
    torch.manual_seed(3)
    (got,) = gm(x)
    torch.testing.assert_close(got, want)
