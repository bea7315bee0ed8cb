"""Common subexpression elimination before lowering (cse.py)."""

from __future__ import annotations

import torch

from kiln_inductor.passes.cse import eliminate_common_subexpressions
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten


def _count(gm, target):
    return sum(n.target is target for n in gm.graph.nodes)


def test_repeated_mask_conversions_are_computed_once():
    def f(mask, x, y):
        outs = []
        for _ in range(3):  # each layer converts the same mask again
            outs.append(aten.add.Tensor(x, aten.mul.Tensor(aten.where.self(mask, x, y), 0.5)))
        return tuple(outs)

    inputs = [torch.rand(4, 4) > 0.5, torch.randn(4, 4), torch.randn(4, 4)]
    gm = aten_graph(f, inputs)
    expected = gm(*inputs)
    assert eliminate_common_subexpressions(gm) == 6  # 2 of each: where, mul, add
    assert _count(gm, aten.where.self) == 1
    for got, want in zip(gm(*inputs), expected):
        torch.testing.assert_close(got, want)
    # different constants are different values
    g2 = aten_graph(lambda x: (aten.mul.Tensor(x, 0.5), aten.mul.Tensor(x, -0.5)), [inputs[1]])
    assert eliminate_common_subexpressions(g2) == 0


def test_random_and_uninitialized_values_are_not_merged():
    def f(x):
        a = aten.rand_like.default(x)
        b = aten.rand_like.default(x)
        e1 = aten.empty.memory_format([4], dtype=torch.float32, device="cpu")
        e2 = aten.empty.memory_format([4], dtype=torch.float32, device="cpu")
        return (a, b, e1, e2)

    gm = aten_graph(f, [torch.randn(4)])
    assert eliminate_common_subexpressions(gm) == 0


def test_nothing_after_a_mutation_merges_with_what_came_before():
    def f(x, y):
        a = aten.mul.Tensor(x, 2)
        aten.add_.Tensor(x, y)  # x changes here
        b = aten.mul.Tensor(x, 2)
        return (a, b)

    x, y = torch.randn(4), torch.randn(4)
    gm = aten_graph(f, [x.clone(), y])
    assert eliminate_common_subexpressions(gm) == 0
    a, b = gm(x.clone(), y)
    torch.testing.assert_close(b, (x + y) * 2)
    torch.testing.assert_close(a, x * 2)
