"""bmm with a batch-broadcast right operand becomes one mm (broadcast_bmm.py)."""

from __future__ import annotations

import torch

from kiln_inductor.passes.broadcast_bmm import fold_broadcast_bmm
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten


def permuted_linear(x, w, b):
    """HF ConvNeXt's Linear over an (N, H, W, C) permute of NCHW memory, as ATen's matmul
    traces it: the weight expanded over the batch and bmm."""
    h = aten.permute.default(x, [0, 2, 3, 1])  # (2, 4, 6, 8), not viewable as rows
    rows = aten.view.default(
        aten.clone.default(h, memory_format=torch.contiguous_format), [8, 6, 8]
    )
    wt = aten.expand.default(aten.permute.default(w, [1, 0]), [2, 4, 8, 16])
    out = aten.bmm.default(rows, aten.view.default(wt, [8, 8, 16]))
    return (aten.add.Tensor(aten.view.default(out, [2, 4, 6, 16]), b),)


def batched(x, y):
    return (aten.bmm.default(x, y),)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _randn(*shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in shapes]


def test_broadcast_weight_bmm_becomes_one_mm_with_the_same_values():
    inputs = _randn((2, 8, 4, 6), (16, 8), (16,))
    gm = aten_graph(permuted_linear, inputs)
    assert fold_broadcast_bmm(gm) == 1
    targets = _targets(gm)
    assert aten.mm.default in targets and aten.bmm.default not in targets
    (got,) = gm(*inputs)
    (want,) = permuted_linear(*inputs)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want)


def test_truly_batched_bmm_stays():
    inputs = _randn((3, 4, 5), (3, 5, 6))
    gm = aten_graph(batched, inputs)
    assert fold_broadcast_bmm(gm) == 0
    assert aten.bmm.default in _targets(gm)


def test_broadcast_left_operand_stays():
    x, y = _randn((4, 5), (3, 5, 6))
    inputs = [x.expand(3, 4, 5), y]
    gm = aten_graph(batched, inputs)
    assert fold_broadcast_bmm(gm) == 0
    (got,) = gm(*inputs)
    torch.testing.assert_close(got, torch.bmm(*inputs))
