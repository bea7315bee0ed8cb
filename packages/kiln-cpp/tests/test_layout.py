"""Channels-last layout for convolution graphs (kiln_inductor.passes.layout), run through the CPU
backend with KILN_CHANNELS_LAST=cpu (off on the CPU by default): results match eager,
the kernels between convolutions write channels-last, outputs keep eager's strides."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
from models import ResNet
from test_codegen import assert_in_order, kernel_sources

import kiln_cpp
from kiln_inductor.runtime.layout_copies import layout_copies, reset_layout_copies
from kiln_inductor.testing import ConvMeanHW, channels_last_models, check_compiled
from kiln_inductor.wrapper import _restride

aten = torch.ops.aten


@pytest.fixture
def channels_last(monkeypatch):
    monkeypatch.setenv("KILN_CHANNELS_LAST", "cpu")


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    model = ResNet().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return model


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class ConvOut(nn.Module):
    """A graph whose outputs are a convolution's result and a pointwise value after it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x):
        y = self.conv(x)
        return y, torch.relu(self.bn(y)) * 2


def test_resnet_matches_eager_in_channels_last(channels_last, caplog):
    model = _resnet()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        compiled = kiln_cpp.compile_fx(model, [x])
        for _ in range(2):
            x = torch.randn(2, 3, 32, 32)
            torch.testing.assert_close(_first(compiled(x)), model(x), rtol=1e-4, atol=1e-4)


def test_kernels_between_convolutions_write_channels_last(channels_last, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    model = _resnet()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        kiln_cpp.compile_fx(model, [x])(x)
    wrapper = next(tmp_path.rglob("wrapper.py")).read_text()
    # 4-D buffers the wrapper allocates: all channels-last (stride 1 on the channel dim)
    allocs = re.findall(
        r"empty_strided\(\((\d+), (\d+), (\d+), (\d+)\), \((\d+), (\d+), (\d+), (\d+)\)", wrapper
    )
    assert allocs
    for n, c, h, w, _sn, sc, _sh, _sw in allocs:
        if int(c) > 1 and int(h) * int(w) > 1:
            assert int(sc) == 1, f"NCHW buffer ({n}, {c}, {h}, {w}) in:\n{wrapper}"
    # every convolution checks the strides its backend returned
    assert wrapper.count("aten.convolution") == wrapper.count("restride(")


def test_outputs_keep_eager_strides(channels_last):
    torch.manual_seed(0)
    model = ConvOut().eval()
    model.bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, 10, 10)
    with torch.no_grad():
        got = kiln_cpp.compile_fx(model, [x])(x)
        want = model(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        assert g.stride() == w.stride()


def test_graph_without_convolutions_is_unchanged(channels_last, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    lin = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(_first(kiln_cpp.compile_fx(lin, [x])(x)), lin(x))
    assert "restride" not in next(tmp_path.rglob("wrapper.py")).read_text()


def test_off_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("KILN_CHANNELS_LAST", raising=False)
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    model = _resnet()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            _first(kiln_cpp.compile_fx(model, [x])(x)), model(x), rtol=1e-4, atol=1e-4
        )
    assert "restride" not in next(tmp_path.rglob("wrapper.py")).read_text()


def test_restride_copies_only_when_strides_differ():
    t = torch.randn(2, 3, 4, 5)
    cl = t.contiguous(memory_format=torch.channels_last)
    assert _restride(cl, cl.stride()) is cl
    back = _restride(t, cl.stride())
    assert back.stride() == cl.stride()
    torch.testing.assert_close(back, t)


# -- kernels loop in their output's memory order (scheduler.access.loop_order) ------------


@pytest.mark.parametrize("name", list(channels_last_models()))
def test_channels_last_graphs_match_eager(channels_last, name):
    model = channels_last_models()[name]
    x = torch.randn(2, 16, 12, 10)
    with torch.no_grad():
        compiled = kiln_cpp.compile_fx(model, [x])
        for _ in range(2):
            x = torch.randn(2, 16, 12, 10)
            got, want = _first(compiled(x)), model(x)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert got.stride() == want.stride()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_scheduled_nhwc_graphs_match_eager(layout):
    """The graphs of kiln-inductor's test_access (NHWC pointwise, members of one size in
    two layouts, reductions over C and over H, W of NHWC), compiled and run."""
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(2, 8, 5, 6).contiguous(memory_format=fmt)
    y = torch.randn(2, 8, 5, 6).contiguous(memory_format=torch.channels_last)

    def pointwise(x, y):
        return (aten.relu.default(aten.add.Tensor(aten.mul.Tensor(x, 2.0), y)),)

    def two_layouts(x):
        e = aten.exp.default(x)
        return (aten.clone.default(e, memory_format=torch.channels_last), aten.mul.Tensor(e, 2.0))

    def mean_c(x):
        return (aten.mul.Tensor(x, aten.mean.dim(x, [1], True)),)

    def sum_hw(x):
        r = aten.relu.default(aten.mul.Tensor(x, 3.0))
        return (r, aten.sum.dim_IntList(r, [2, 3]), aten.amax.default(r, [2, 3], True))

    check_compiled(pointwise, [x, y], rtol=1e-5)
    for fn in (two_layouts, mean_c, sum_hw):
        check_compiled(fn, [x], rtol=1e-5)


def test_nhwc_pointwise_kernel_walks_channels_contiguously():
    x = torch.randn(2, 8, 5, 6).contiguous(memory_format=torch.channels_last)
    y = torch.randn(2, 8, 5, 6)  # NCHW: read strided (unavoidable)

    def f(x, y):
        return (aten.relu.default(aten.add.Tensor(aten.mul.Tensor(x, 2.0), y)),)

    (src,) = kernel_sources(f, [x, y])
    # loops (N, H, W, C) with C innermost and vectorized; store and NHWC load at stride 1
    assert_in_order(
        src,
        [
            "for (int64_t x1 = 0; x1 < 5L; ++x1)",
            "for (int64_t x2 = 0; x2 < 6L; ++x2)",
            "#pragma omp simd",
            "for (int64_t x3 = 0; x3 < 8L; ++x3)",
            "in_ptr0[((240L * x0) + (48L * x1) + (8L * x2) + x3)]",
            "in_ptr1[((240L * x0) + (30L * x3) + (6L * x1) + x2)]",
            "out_ptr0[((240L * x0) + (48L * x1) + (8L * x2) + x3)]",
        ],
    )


def test_training_through_channels_last_matches_eager(channels_last):
    torch.manual_seed(0)
    model = ConvMeanHW(8).train()
    ref = ConvMeanHW(8).train()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 6, 6)
    compiled = kiln_cpp.compile_fx(model, [x])
    out = _first(compiled(x))
    want = ref(x)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    out.square().sum().backward()
    want.square().sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=n)


class DepthwiseChain(nn.Module):
    """Depthwise convolutions (run channels-last by default on CPU) read by a dense
    convolution, by another depthwise one, by pointwise math and as a graph output."""

    def __init__(self):
        super().__init__()
        self.dw1 = nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.dense = nn.Conv2d(8, 8, 3, padding=1)
        self.dw2 = nn.Conv2d(8, 8, 5, padding=2, groups=8)

    def forward(self, x):
        a = self.dw1(x)
        b = self.dw2(torch.relu(self.dense(a)))
        return a, torch.tanh(self.dw2(a)) + b


@pytest.mark.parametrize("size", [(12, 10), (4, 4)])  # (4, 4): the backward stays NCHW
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_depthwise_convolutions_inference_and_training(layout, size):
    torch.manual_seed(0)
    model = DepthwiseChain()
    x = torch.randn(2, 8, *size)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        want = model(x)
        got = kiln_cpp.compile_fx(model, [x])(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    xg = x.clone().requires_grad_()
    got = kiln_cpp.compile_fx(model, [xg])(xg)
    (got[0].sin().sum() + got[1].square().sum()).backward()
    grads = [xg.grad, *(p.grad for p in model.parameters())]
    model.zero_grad(set_to_none=True)
    xe = x.clone().requires_grad_()
    want = model(xe)
    (want[0].sin().sum() + want[1].square().sum()).backward()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    for g, w in zip(grads, [xe.grad, *(p.grad for p in model.parameters())]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_training_graphs_save_and_read_channels_last(channels_last, monkeypatch, tmp_path):
    """A training forward keeps its saved activations channels-last (only what the caller
    sees is copied back) and the backward, compiled for the strides they arrive in, runs
    ``convolution_backward`` on channels-last operands: no layout copy anywhere."""
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    model = _resnet().train()
    ref = _resnet().train()
    x = torch.randn(2, 3, 64, 64)  # each convolution over > 64 output pixels (no im2col)
    reset_layout_copies()
    compiled = kiln_cpp.compile_fx(model, [x])
    out = _first(compiled(x))
    want = ref(x)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert out.stride() == want.stride()
    g = torch.randn_like(want)
    (out * g).sum().backward()
    (want * g).sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=n)
        assert p.grad.is_contiguous(), n  # as eager gives it
    assert not layout_copies()
    wrappers = [w.read_text() for w in tmp_path.rglob("wrapper.py")]
    (backward,) = [w for w in wrappers if "convolution_backward" in w]
    (forward,) = [w for w in wrappers if w is not backward]
    layouts = {"forward": _buffer_layouts(forward), "backward": _buffer_layouts(backward)}
    assert layouts["forward"]["nhwc"] and layouts["backward"]["nhwc"], layouts
    assert layouts["forward"]["nchw"] == layouts["backward"]["nchw"] == 0, layouts


def _buffer_layouts(wrapper: str, batch: int = 2) -> dict[str, int]:
    """How many 4-D activations (batch first, more than one channel and pixel; weight
    gradients are written in the weights' layout) ``wrapper`` allocates channels-last and
    how many NCHW."""
    allocs = re.findall(
        r"empty_strided\(\((\d+), (\d+), (\d+), (\d+)\), \((\d+), (\d+), (\d+), (\d+)\)", wrapper
    )
    out = {"nhwc": 0, "nchw": 0}
    for n, c, h, w, _sn, sc, _sh, _sw in allocs:
        if int(n) == batch and int(c) > 1 and int(h) * int(w) > 1:
            out["nhwc" if int(sc) == 1 else "nchw"] += 1
    return out


@pytest.mark.parametrize(
    "setting, device, dtype, training, want",
    [
        ("auto", "cuda", torch.bfloat16, True, True),
        ("auto", "cuda", torch.float16, True, True),
        ("auto", "cuda", torch.float32, True, False),  # fp32: cuDNN's NCHW kernels stay
        ("auto", "cuda", torch.bfloat16, False, False),  # inference graphs: as before
        ("auto", "cpu", torch.bfloat16, True, False),
        ("cpu", "cpu", torch.float32, False, True),
        ("none", "cuda", torch.bfloat16, True, False),
    ],
)
def test_auto_setting_picks_16_bit_cuda_training_graphs(setting, device, dtype, training, want):
    from kiln_inductor.passes.layout import _conv_operands, _wanted

    gm = torch.fx.symbolic_trace(nn.Conv2d(3, 4, 3))
    conv = torch.fx.Graph()
    x = conv.placeholder("x")
    w = conv.placeholder("w")
    x.meta["val"] = torch.empty(2, 3, 8, 8, dtype=dtype, device="meta")
    w.meta["val"] = torch.empty(4, 3, 3, 3, dtype=dtype, device="meta")
    node = conv.call_function(
        aten.convolution.default, (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    )
    conv.output(node)
    gm = torch.fx.GraphModule(gm, conv)
    if training:
        gm.meta["kiln_aot_training"] = {"role": "forward", "outputs": 1}
    convs = {node: _conv_operands(node)}
    assert _wanted(gm, torch.device(device), convs, setting) is want
