"""Loops split so that a reduction and a reshaped consumer of its rows share a kernel
(scheduler/refine.py), checked on schedules (kiln-cpp's test_refine_fusion.py checks the
results)."""

from __future__ import annotations

import sympy
import torch

from kiln_inductor.graph import GraphLowering
from kiln_inductor.ir.nodes import ComputedBuffer
from kiln_inductor.scheduler.access import node_access
from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
from kiln_inductor.scheduler.refine import refine
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten


def _layer_norm_then_matmul(x, w, b, m):
    """A layer_norm over (2, 7, 32) whose output the matmul reads as (14, 32), as
    transformers' linear layers do."""
    y = aten.native_layer_norm.default(x, [32], w, b, 1e-5)[0]
    return (aten.mm.default(aten.view.default(y, [14, 32]), m),)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in ((2, 7, 32), (32,), (32,), (32, 16))]


def test_refine_splits_a_loop_into_the_finer_ranges():
    inputs = _inputs()
    ir = GraphLowering(aten_graph(_layer_norm_then_matmul, inputs), inputs).run()
    (flat,) = [
        n for n in ir.nodes if isinstance(n, ComputedBuffer) and list(n.body.size) == [14, 32]
    ]
    acc = node_access(flat)
    assert acc.ranges == (14, 32)
    fine = refine(acc, (2, 7, 32))
    assert fine is not None and fine.ranges == (2, 7, 32)
    i0_0, i0_1, i1 = fine.vars
    # the same element at the same iteration: row i0 = 7 * i0_0 + i0_1
    assert sympy.expand(fine.store - acc.store.xreplace({acc.vars[0]: 7 * i0_0 + i0_1})) == 0
    assert refine(acc, (3, 5, 32)) is None  # 14 is no product of a prefix of (3, 5, 32)
    assert refine(acc, (14, 32)) is None  # nothing to split


def test_layer_norm_statistics_and_reshaped_output_are_one_kernel():
    inputs = _inputs()
    ir = GraphLowering(aten_graph(_layer_norm_then_matmul, inputs), inputs).run()
    kernels = [s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]
    assert len(kernels) == 1
    (k,) = kernels
    assert [int(n) for n in k.outer] == [2, 7]
    kinds = {b.kind for b in k.blocks}
    assert "pointwise" in kinds and kinds & {"welford", "reduction"}


def test_no_group_reduces_rows_one_after_another():
    """A layer_norm over C of an NCHW value (timm's LayerNorm2d: permute, layer_norm,
    permute back) and its NCHW consumer share only the loop over N: as one kernel each of N
    programs reduced all H*W rows in turn. They stay two kernels with their own loops."""

    def layer_norm_2d(x, w, b):  # as kiln-aot decomposes it
        p = aten.permute.default(x, [0, 2, 3, 1])
        mean = aten.div.Tensor(aten.sum.dim_IntList(p, [3], True), 32)
        d = aten.sub.Tensor(p, mean)
        var = aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(d, d), [3], True), 32)
        y = aten.mul.Tensor(d, aten.rsqrt.default(aten.add.Tensor(var, 1e-6)))
        y = aten.add.Tensor(aten.mul.Tensor(y, w), b)
        return (aten.mul.Tensor(aten.permute.default(y, [0, 3, 1, 2]), 2.0),)

    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=g) for s in ((2, 32, 16, 16), (32,), (32,))]
    ir = GraphLowering(aten_graph(layer_norm_2d, inputs), inputs).run()
    kernels = [s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]
    for k in kernels:
        for b in k.blocks:
            assert b.kind == "pointwise" or sympy.prod(b.inner) <= 8, (k.outer, b.inner)
    reducing = [k for k in kernels if any(b.kind != "pointwise" for b in k.blocks)]
    assert [int(n) for n in reducing[0].outer] == [2, 16, 16]
