"""Channels-last layout for convolution graphs (kiln_inductor.layout), run through the CPU
backend with KILN_CHANNELS_LAST=cpu (off by default): results match eager,
the kernels between convolutions write channels-last, outputs keep eager's strides."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
from models import ResNet

import kiln_cpp
from kiln_inductor.wrapper import _restride


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
