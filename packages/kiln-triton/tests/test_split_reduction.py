"""Reductions into few outputs over many elements are split in two kernels (kiln-inductor's
lowering/reduction.py, "Split reductions"; TritonBackend.reduction_splits): partial results
of equal pieces, then their reduction. Results equal eager's, under the interpreter and on
the GPU."""

from __future__ import annotations

import pytest
import torch

from kiln_inductor import compile_aten_graph
from kiln_inductor.graph import GraphLowering
from kiln_inductor.ir.nodes import Reduction
from kiln_inductor.testing import aten_graph
from kiln_triton.backend import TritonBackend
from kiln_triton.testing import use_triton_for_cpu

aten = torch.ops.aten


def weight_grad_and_loss(x, w, ids):
    """A bias/weight-style gradient (sum over batch and tokens), a max over everything, a
    boolean any, and a mean cross-entropy-style loss."""
    col = aten.sum.dim_IntList(aten.mul.Tensor(x, w), [0, 1])
    big = aten.amax.default(x, [0, 1, 2])
    anyneg = aten.any.default(aten.lt.Scalar(x, -4.5))
    picked = aten.gather.default(aten.view.default(x, [4096, 768]), 1, ids)
    loss = aten.mean.default(picked)
    return (col, big, anyneg, loss)


def _inputs(device):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 512, 768, generator=g)
    w = torch.randn(8, 512, 768, generator=g)
    ids = torch.randint(0, 768, (4096, 1), generator=g)
    return [t.to(device) for t in (x, w, ids)]


def _reductions(fn, inputs):
    with use_triton_for_cpu():
        ir = GraphLowering(aten_graph(fn, inputs), inputs).run()
    return [n.body for n in ir.nodes if isinstance(getattr(n, "body", None), Reduction)]


def test_the_hint_splits_few_outputs_over_many_elements():
    b, cpu = TritonBackend(), torch.device("cpu")
    assert b.reduction_splits(cpu, 768, 4096, False) == 16  # columns, pieces of 256 rows
    assert b.reduction_splits(cpu, 3072, 4096, False) == 16
    assert b.reduction_splits(cpu, 1, 4096, True) == 16
    assert b.reduction_splits(cpu, 30522, 4096, False) == 1  # enough outputs already
    assert b.reduction_splits(cpu, 4096, 32000, True) == 1  # a program per row fills it
    assert b.reduction_splits(cpu, 4096, 768, True) == 1  # rows too short to split
    assert b.reduction_splits(cpu, 768, 4097, False) == 1  # no power of two divides it


def test_split_reductions_are_two_and_equal_eager():
    inputs = _inputs("cpu")
    bodies = _reductions(weight_grad_and_loss, inputs)
    # each of the four reductions is a partial one and a final one
    partial = [r for r in bodies if len(r.size) >= 1 and r.size[0] == 16 and r.reduction_ranges]
    assert len(bodies) == 8 and len(partial) >= 1
    assert {r.reduction_type for r in bodies} == {"sum", "max", "any"}
    with use_triton_for_cpu():
        compiled = compile_aten_graph(aten_graph(weight_grad_and_loss, inputs), inputs)
    # every reduction ran in generated kernels: partial and final ones, no fallback
    stats = compiled.artifact.stats
    assert stats["kernels"] >= 5 and not stats["fallbacks"] and not stats["externs"], stats
    for got, expected in zip(compiled(*inputs), weight_grad_and_loss(*inputs)):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


def test_split_keeps_nan_and_short_reductions_whole():
    x = torch.randn(4, 4096)
    x[2, 1000] = float("nan")

    def fn(x):
        return (aten.amax.default(x, [1]), aten.sum.dim_IntList(x, [0]))

    bodies = _reductions(fn, [x])
    assert len(bodies) == 3  # the row max is split (4 outputs), the column sum is not
    with use_triton_for_cpu():
        compiled = compile_aten_graph(aten_graph(fn, [x]), [x])
        got = compiled(x)
    assert compiled.artifact.stats["kernels"] >= 2 and not compiled.artifact.stats["fallbacks"]
    for g, e in zip(got, fn(x)):
        torch.testing.assert_close(g, e, equal_nan=True)


@pytest.mark.gpu
def test_split_reductions_on_the_gpu():
    inputs = _inputs("cuda")
    compiled = compile_aten_graph(aten_graph(weight_grad_and_loss, inputs), inputs)
    for got, expected in zip(compiled(*inputs), weight_grad_and_loss(*inputs)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


def batch_norm_stats(x):
    """Batch norm's training statistics: var_mean over (N, H, W) for each channel."""
    var, mean = aten.var_mean.correction(x, [0, 2, 3], correction=0, keepdim=True)
    return (aten.mul.Tensor(aten.sub.Tensor(x, mean), aten.rsqrt.default(var)), mean, var)


def test_split_welford_equals_eager():
    """Welford's mean and M2 over pieces, combined as Chan et al. do: batch norm's
    statistics over 8 x 32 x 32 positions of 48 channels are pieces of 256."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 48, 32, 32, generator=g) * 3 + 10  # far from zero: M2 matters
    bodies = _reductions(batch_norm_stats, [x])
    kinds = sorted(r.reduction_type for r in bodies)
    assert kinds == ["sum", "sum", "sum", "welford_m2", "welford_mean"], kinds
    with use_triton_for_cpu():
        compiled = compile_aten_graph(aten_graph(batch_norm_stats, [x]), [x])
    assert compiled.artifact.stats["kernels"] >= 2 and not compiled.artifact.stats["fallbacks"]
    with use_triton_for_cpu():
        got = compiled(x)
    for g_, e in zip(got, batch_norm_stats(x)):
        torch.testing.assert_close(g_, e, rtol=1e-4, atol=1e-4)


def test_layer_norm_rows_are_not_split():
    """512 rows of 4096: a program per row fills a GPU already."""
    x = torch.randn(512, 4096)
    bodies = _reductions(lambda x: aten.var_mean.correction(x, [1], correction=0), [x])
    assert sorted(r.reduction_type for r in bodies) == ["welford_m2", "welford_mean"]


@pytest.mark.gpu
def test_split_welford_and_batch_norm_training_on_the_gpu():
    """Batch norm statistics split on the GPU, and a conv + batch norm training step (split
    weight/bias gradients, split statistics) against eager."""
    import kiln

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(8, 48, 32, 32, generator=g) * 3 + 10).cuda()
    got = compile_aten_graph(aten_graph(batch_norm_stats, [x]), [x])(x)
    for g_, e in zip(got, batch_norm_stats(x)):
        torch.testing.assert_close(g_, e, rtol=1e-4, atol=1e-4)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU()
    ).cuda()
    ref = __import__("copy").deepcopy(net)
    img = torch.randn(16, 3, 64, 64, device="cuda")
    kiln.compile(net)(img).square().mean().backward()
    ref(img).square().mean().backward()
    assert kiln.stats()["graphs"] >= 1 and kiln.stats()["fallbacks"] == 0
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)
    torch.testing.assert_close(net[1].running_var, ref[1].running_var)
