"""Channels-last graphs (KILN_CHANNELS_LAST, kiln_inductor.passes.layout) through the Triton
backend under the interpreter: results match eager, and the kernel of an NHWC pointwise op
walks memory with C fastest (its loops follow its output's strides,
kiln_inductor.scheduler.access.loop_order)."""

from __future__ import annotations

import pytest
import torch
from test_kernel import in_order, kernels_of

import kiln_triton
from kiln_inductor.testing import ConvMeanHW, channels_last_models
from kiln_triton.testing import use_triton_for_cpu

aten = torch.ops.aten


@pytest.fixture
def channels_last(monkeypatch):
    # the interpreter runs kernels on CPU tensors: the layout pass is asked for on "cpu"
    monkeypatch.setenv("KILN_CHANNELS_LAST", "cpu")


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("name", list(channels_last_models(8)))
def test_channels_last_graphs_match_eager(channels_last, name):
    model = channels_last_models(8)[name]
    x = torch.randn(2, 8, 6, 5)
    with use_triton_for_cpu(), torch.no_grad():
        compiled = kiln_triton.compile_fx(model, [x])
        x = torch.randn(2, 8, 6, 5)
        got, want = _first(compiled(x)), model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.stride() == want.stride()


def test_training_through_channels_last_matches_eager(channels_last):
    torch.manual_seed(0)
    model, ref = ConvMeanHW(8).train(), ConvMeanHW(8).train()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 6, 6)
    with use_triton_for_cpu():
        out = _first(kiln_triton.compile_fx(model, [x])(x))
        want = ref(x)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        out.square().sum().backward()
    want.square().sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=n)


def _nhwc(*size):
    return torch.randn(*size).contiguous(memory_format=torch.channels_last)


def test_nhwc_pointwise_kernel_indexes_with_c_contiguous():
    def fn(x, y, z):
        return (aten.relu.default(aten.add.Tensor(aten.add.Tensor(aten.mul.Tensor(x, 2.0), y), z)),)

    # x, y NHWC; z NCHW, read strided (unavoidable, as in torch.compile)
    kernels, (src,) = kernels_of(
        fn, [_nhwc(2, 8, 5, 6), _nhwc(2, 8, 5, 6), torch.randn(2, 8, 5, 6)]
    )
    assert kernels[0].kind == "pointwise"
    in_order(
        src,
        "xmask = xindex < 480",
        "x3 = (xindex % 8)",  # the innermost loop variable is C
        "tl.load(in_ptr0 + xindex, xmask, other=0)",
        "tl.load(in_ptr1 + xindex, xmask, other=0)",
        "tl.load(in_ptr2 + ((240 * x0) + (30 * x3) + (6 * x1) + x2), xmask, other=0)",
        "tl.store(out_ptr0 + xindex,",
    )


def test_nhwc_reductions_match_eager():
    """Reductions of an NHWC value over C (one row kernel over (N, H, W)) and over H, W
    (outer loops over N, C, reduction ranges H, W as they were)."""

    def mean_c(x):
        return (aten.mul.Tensor(x, aten.mean.dim(x, [1], True)),)

    def sum_hw(x):
        r = aten.relu.default(aten.mul.Tensor(x, 3.0))
        return (r, aten.sum.dim_IntList(r, [2, 3]))

    kernels, (src,) = kernels_of(mean_c, [_nhwc(2, 8, 5, 6)])
    in_order(
        src,
        "xmask = xindex < 60",
        "rmask0 = rbase < 8",
        # a row of C is contiguous in memory; rows follow each other (N, H, W)
        "tl.load(in_ptr0 + ((240 * x0) + (48 * x1) + (8 * x2) + r0_0), (xmask & rmask0)",
        "tl.sum(",
        "tl.store(out_ptr0 + ((240 * x0) + (48 * x1) + (8 * x2) + r0_0),",
    )
    # the NHWC value and its sum over (H, W): one kernel of (N, C) rows, C along x
    kernels, (src,) = kernels_of(sum_hw, [_nhwc(2, 8, 5, 6)])
    assert kernels[0].kind == "persistent"
    in_order(
        src,
        "xmask = tl.full([XBLOCK, 1], 1, tl.int1)",  # 16 rows: every XBLOCK divides them
        "x1 = (xindex % 8)",
        "tl.load(in_ptr0 + ((240 * x0) + (48 * r0_0) + (8 * r0_1) + x1), (xmask & rmask0)",
        "tl.sum(",
        "tl.store(out_ptr0 + xindex,",
        "tl.store(out_ptr1 + ((240 * x0) + (48 * r0_0) + (8 * r0_1) + x1),",
    )
