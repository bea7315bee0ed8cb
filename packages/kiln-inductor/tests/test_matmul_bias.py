"""Bias adds that only library kernels read are folded back into addmm (matmul_bias.py)."""

from __future__ import annotations

import torch

from kiln_inductor.graph import GraphLowering
from kiln_inductor.ir.nodes import ExternKernel
from kiln_inductor.passes import fill_meta
from kiln_inductor.passes.matmul_bias import fold_matmul_bias
from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten


def qkv_attention(x, w, b):
    """A qkv projection viewed, split and permuted into fused attention, as transformers do."""
    qkv = aten.add.Tensor(aten.mm.default(x, w), b)
    q, k, v = aten.split.Tensor(aten.view.default(qkv, [2, 8, 3 * 16]), 16, 2)
    heads = [
        aten.permute.default(aten.view.default(t, [2, 8, 2, 8]), [0, 2, 1, 3]) for t in (q, k, v)
    ]
    return (aten._scaled_dot_product_flash_attention_for_cpu.default(*heads)[0],)


def bias_then_relu(x, w, b):
    return (aten.relu.default(aten.add.Tensor(aten.mm.default(x, w), b)),)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in ((16, 32), (32, 48), (48,))]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_qkv_bias_goes_into_addmm_and_leaves_no_kernel():
    inputs = _inputs()
    gm = aten_graph(qkv_attention, inputs)
    fill_meta(gm)
    assert fold_matmul_bias(gm) == 1
    assert aten.addmm.default in _targets(gm) and aten.mm.default not in _targets(gm)
    ir = GraphLowering(aten_graph(qkv_attention, inputs), inputs).run()
    steps = fuse_nodes(ir)
    assert not [s for s in steps if isinstance(s, FusedGroup)]
    assert [s.op for s in steps if isinstance(s, ExternKernel)][0] is aten.addmm.default


def test_bias_read_by_a_pointwise_op_stays_in_the_kernel():
    inputs = _inputs()
    gm = aten_graph(bias_then_relu, inputs)
    fill_meta(gm)
    assert fold_matmul_bias(gm) == 0  # the relu kernel adds the bias for free
    assert aten.mm.default in _targets(gm)


def bias_saved_and_activated(x, w, b):
    """A forward graph's MLP: the biased pre-activation is saved (an output) and activated."""
    pre = aten.add.Tensor(aten.mm.default(x, w), b)
    return (aten.gelu.default(pre, approximate="tanh"), pre)


def test_bias_of_a_saved_sum_goes_into_addmm():
    """The sum is written anyway (a graph output): addmm writes it, the GELU kernel reads it
    and writes only its own result, so no kernel re-reads the matmul's output."""
    inputs = _inputs()
    gm = aten_graph(bias_saved_and_activated, inputs)
    fill_meta(gm)
    assert fold_matmul_bias(gm) == 1
    assert aten.addmm.default in _targets(gm) and aten.mm.default not in _targets(gm)
    ir = GraphLowering(aten_graph(bias_saved_and_activated, inputs), inputs).run()
    groups = [s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]
    assert len(groups) == 1 and len(groups[0].outputs) == 1


def test_saved_sum_stays_in_the_kernel_when_matmuls_take_epilogues():
    """With matmul templates (max-autotune) the product is never written: no folding."""
    inputs = _inputs()
    gm = aten_graph(bias_saved_and_activated, inputs)
    fill_meta(gm)
    assert fold_matmul_bias(gm, templates=True) == 0
