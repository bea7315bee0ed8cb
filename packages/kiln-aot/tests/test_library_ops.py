"""Ops with no decomposition that return new tensors stay in the graph as library calls
(DESIGN.md contract 3): the graph is traced whole, the op is marked, the contract holds."""

from __future__ import annotations

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
    assert not core_ops.is_library_callable(aten.nonzero.default)  # data-dependent shape
