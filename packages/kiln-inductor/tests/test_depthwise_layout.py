"""Depthwise convolutions and their backward run on channels-last operands on CPU
(depthwise_layout.py)."""

from __future__ import annotations

import operator

import torch

from kiln_inductor.passes.depthwise_layout import depthwise_channels_last
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten
CPU = torch.device("cpu")


def _randn(*shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in shapes]


def depthwise(x, w, b):
    return (aten.convolution.default(x, w, b, [1, 1], [3, 3], [1, 1], False, [0, 0], 6),)


def depthwise_backward(g, x, w):
    grads = aten.convolution_backward.default(
        g, x, w, [6], [1, 1], [3, 3], [1, 1], False, [0, 0], 6, [True, True, True]
    )
    return grads[0], grads[1], grads[2]


def dense(x, w, b):
    return (aten.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),)


def _convs(gm):
    return [
        n
        for n in gm.graph.nodes
        if n.target in (aten.convolution.default, aten.convolution_backward.default)
    ]


def _check(fn, inputs, changed):
    gm = aten_graph(fn, inputs)
    assert depthwise_channels_last(gm, CPU) == changed
    assert depthwise_channels_last(gm, CPU) == 0  # once is enough
    for g, w in zip(gm(*inputs), fn(*inputs)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    return gm


def test_depthwise_convolution_reads_channels_last():
    gm = _check(depthwise, _randn((2, 6, 9, 10), (6, 1, 7, 7), (6,)), 1)
    (conv,) = _convs(gm)
    x = conv.args[0]
    assert x.target is aten.clone.default and x.kwargs["memory_format"] is torch.channels_last
    # oneDNN returns channels-last for it: the metadata says so (the wrapper checks)
    assert conv.meta["val"].is_contiguous(memory_format=torch.channels_last)


def test_depthwise_backward_reads_channels_last_gradient_and_input():
    # 7x7 over 4 x 60 x 60: the input's bytes exceed the channels-last workspace
    gm = _check(depthwise_backward, _randn((4, 6, 60, 60), (4, 6, 60, 60), (6, 1, 7, 7)), 1)
    (conv,) = _convs(gm)
    assert all(a.target is aten.clone.default for a in conv.args[:2])
    assert conv.meta["val"][0].is_contiguous(memory_format=torch.channels_last)
    assert all(u.target is operator.getitem for u in conv.users)


def test_dense_convolution_and_other_devices_stay():
    inputs = _randn((2, 6, 9, 10), (4, 6, 3, 3), (4,))
    _check(dense, inputs, 0)
    gm = aten_graph(depthwise, _randn((2, 6, 9, 10), (6, 1, 7, 7), (6,)))
    assert depthwise_channels_last(gm, torch.device("mps")) == 0
    # CUDA in fp32: ATen's own NCHW depthwise kernels are kept
    assert depthwise_channels_last(gm, torch.device("cuda")) == 0


def test_cuda_16_bit_depthwise_forward_and_backward_read_channels_last():
    """On CUDA a bf16 depthwise convolution runs cuDNN's NHWC kernels only on channels-last
    operands (ATen's NCHW ones were 4-5x slower: ConvNeXt-T bf16 training on an H200); the
    CPU's oneDNN rules (small images, the workspace) do not apply: this backward, 7x7 over
    4 x 4 images, would stay NCHW on the CPU."""
    g = torch.Generator().manual_seed(0)
    for fn, shapes, n_ops in (
        (depthwise, [(2, 6, 9, 10), (6, 1, 7, 7), (6,)], 1),
        (depthwise_backward, [(2, 6, 4, 4), (2, 6, 4, 4), (6, 1, 7, 7)], 2),
    ):
        inputs = [torch.randn(s, generator=g).bfloat16() for s in shapes]
        gm = aten_graph(fn, inputs)
        assert depthwise_channels_last(gm, torch.device("cuda")) == 1
        (conv,) = _convs(gm)
        clones = [a for a in conv.args[:n_ops] if a.target is aten.clone.default]
        assert len(clones) == n_ops
        assert all(a.kwargs["memory_format"] is torch.channels_last for a in clones)
        out = conv.meta["val"][0] if isinstance(conv.meta["val"], tuple) else conv.meta["val"]
        assert out.is_contiguous(memory_format=torch.channels_last)
        # the values: the graph run on the CPU (the same ops, other layouts)
        for got, want in zip(gm(*inputs), fn(*inputs)):
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def wide_depthwise_backward(g, x, w):
    grads = aten.convolution_backward.default(
        g, x, w, [648], [1, 1], [3, 3], [1, 1], False, [0, 0], 648, [True, True, True]
    )
    return grads[0], grads[1], grads[2]


def test_depthwise_backward_stays_nchw_where_it_is_faster():
    # 7x7 kernels on small images, or past 640 channels: oneDNN's NCHW backward is faster
    small = _randn((2, 6, 4, 4), (2, 6, 4, 4), (6, 1, 7, 7))
    wide = _randn((1, 648, 8, 8), (1, 648, 8, 8), (648, 1, 7, 7))
    for fn, inputs in ((depthwise_backward, small), (wide_depthwise_backward, wide)):
        gm = _check(fn, inputs, 0)
        (conv,) = _convs(gm)
        assert not any(a.target is aten.clone.default for a in conv.args[:2])
    # the forward of the same small convolution still runs channels-last
    _check(depthwise, _randn((2, 6, 4, 4), (6, 1, 7, 7), (6,)), 1)


def test_depthwise_backward_stays_nchw_where_its_workspace_exceeds_the_input():
    # oneDNN's channels-last weight gradient needs 1 KiB per weight element (6 x 7 x 7:
    # 294 KiB) whatever the batch: at batch 2 of 9 x 10 images the input is 4 KiB
    inputs = _randn((2, 6, 9, 10), (2, 6, 9, 10), (6, 1, 7, 7))
    gm = _check(depthwise_backward, inputs, 0)
    (conv,) = _convs(gm)
    assert not any(a.target is aten.clone.default for a in conv.args[:2])
    # 3x3 kernels have no such workspace: channels-last at the same size
    _check(small_kernel_backward, _randn((2, 6, 9, 10), (2, 6, 9, 10), (6, 1, 3, 3)), 1)


def small_kernel_backward(g, x, w):
    grads = aten.convolution_backward.default(
        g, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 6, [True, True, True]
    )
    return grads[0], grads[1], grads[2]


def test_small_kernel_depthwise_backward_reads_channels_last_at_any_size():
    # 3x3: oneDNN's channels-last backward is the faster one on small images too
    _check(small_kernel_backward, _randn((2, 6, 4, 4), (2, 6, 4, 4), (6, 1, 3, 3)), 1)
