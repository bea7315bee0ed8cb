"""Patch convolutions (kernel == stride) and their backward become matmuls on CPU
(patch_conv.py): same values and strides as the convolutions."""

from __future__ import annotations

import pytest
import torch

from kiln_inductor.passes.patch_conv import rewrite_patch_convolutions
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten
CPU = torch.device("cpu")


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _randn(*shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in shapes]


def patchify(x, w, b):
    return (
        aten.relu.default(
            aten.convolution.default(x, w, b, [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
        ),
    )


def patchify_no_bias(x, w):
    return (aten.convolution.default(x, w, None, [4, 2], [0, 0], [1, 1], False, [0, 0], 1),)


def overlapping(x, w, b):
    return (aten.convolution.default(x, w, b, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),)


def _backward(mask):
    def fn(g, x, w):
        grads = aten.convolution_backward.default(
            g, x, w, [5], [2, 2], [0, 0], [1, 1], False, [0, 0], 1, mask
        )
        return tuple(grads[i] for i in range(3) if mask[i])

    return fn


def _check(fn, inputs, rewritten, whole=True):
    gm = aten_graph(fn, inputs)
    assert rewrite_patch_convolutions(gm, CPU) == rewritten
    if rewritten and whole:
        targets = _targets(gm)
        assert aten.convolution.default not in targets
        assert aten.convolution_backward.default not in targets
    got, want = gm(*inputs), fn(*inputs)
    # the strides the graph's metadata says (oneDNN's may differ: lowering checks those)
    traced = fn(*[x.to("meta") for x in inputs])
    assert len(got) == len(want) == len(traced)
    for g, w, t in zip(got, want, traced):
        assert g.shape == w.shape and g.stride() == t.stride()
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    return gm


def test_patch_convolution_is_a_matmul():
    _check(patchify, _randn((2, 6, 8, 10), (5, 6, 2, 2), (5,)), 1)


def test_channels_last_input_keeps_the_convolutions_output_strides():
    x, w, b = _randn((2, 6, 8, 10), (5, 6, 2, 2), (5,))
    _check(patchify, [x.contiguous(memory_format=torch.channels_last), w, b], 1)


def test_rectangular_patches_without_bias():
    _check(patchify_no_bias, _randn((3, 4, 8, 6), (7, 4, 4, 2)), 1)


def test_overlapping_convolution_stays():
    _check(overlapping, _randn((2, 6, 8, 10), (5, 6, 3, 3), (5,)), 0)


def test_rows_that_do_not_tile_the_image_stay():
    _check(patchify, _randn((2, 6, 9, 10), (5, 6, 2, 2), (5,)), 0)


@pytest.mark.parametrize(
    "mask", [[True, True, True], [False, True, True], [True, False, False]], ids=str
)
def test_patch_convolution_backward_is_matmuls(mask):
    g, x, w = _randn((2, 5, 4, 5), (2, 6, 8, 10), (5, 6, 2, 2))
    _check(_backward(mask), [g, x, w], 1)


def test_other_devices_keep_their_convolutions():
    gm = aten_graph(patchify, _randn((2, 6, 8, 10), (5, 6, 2, 2), (5,)))
    assert rewrite_patch_convolutions(gm, torch.device("cuda")) == 0


def _strided_backward(stride, padding, mask, groups=1):
    def fn(g, x, w):
        grads = aten.convolution_backward.default(
            g, x, w, [w.shape[0]], stride, padding, [1, 1], False, [0, 0], groups, mask
        )
        return tuple(grads[i] for i in range(3) if mask[i])

    return fn


def _convolution_backwards(gm):
    return [n for n in gm.graph.nodes if n.target is aten.convolution_backward.default]


@pytest.mark.parametrize(
    "kernel,stride,padding,mask",
    [
        (3, [2, 2], [1, 1], [True, True, False]),  # ResNet's 3x3 stride 2 on 4x4
        (1, [2, 2], [0, 0], [True, True, True]),  # its 1x1 stride-2 shortcut
        (1, [1, 1], [0, 0], [False, True, False]),
        (3, [1, 2], [1, 0], [True, False, True]),
        (2, [3, 1], [0, 1], [True, True, False]),  # kernel < stride: pixels no window reads
    ],
    ids=str,
)
def test_small_output_convolution_backward_is_matmuls(kernel, stride, padding, mask):
    # N*Ho*Wo <= 64: the weight gradient is G.T @ im2col rows, the input gradient the
    # col2im of G @ W, the bias gradient a sum: no convolution left
    x = _randn((2, 8, 5, 6))[0]
    ho = (5 + 2 * padding[0] - kernel) // stride[0] + 1
    wo = (6 + 2 * padding[1] - kernel) // stride[1] + 1
    g, w = _randn((2, 7, ho, wo), (7, 8, kernel, kernel))
    gm = _check(_strided_backward(stride, padding, mask), [g, x, w], 1)
    assert aten.mm.default in _targets(gm)
    assert rewrite_patch_convolutions(gm, CPU) == 0  # once is enough


def test_small_output_large_kernel_keeps_its_input_gradient_in_the_convolution():
    # 5x5 = 25 taps: col2im would sum 25 shifted copies; the convolution's backward keeps
    # the input gradient (its mask without the weight's and the bias's)
    mask = [True, True, True]
    g, x, w = _randn((2, 7, 3, 3), (2, 8, 7, 7), (7, 8, 5, 5))
    gm = _check(_strided_backward([1, 1], [0, 0], mask), [g, x, w], 1, whole=False)
    (conv,) = _convolution_backwards(gm)
    assert conv.args[10] == [True, False, False]


def test_large_output_and_grouped_weight_gradients_stay_convolutions():
    mask = [True, True, False]
    big = _randn((2, 7, 8, 8), (2, 8, 8, 8), (7, 8, 3, 3))  # N*Ho*Wo = 128
    _check(_strided_backward([1, 1], [1, 1], mask), big, 0)
    grouped = _randn((2, 8, 2, 2), (2, 8, 4, 4), (8, 4, 3, 3))
    _check(_strided_backward([2, 2], [1, 1], mask, groups=2), grouped, 0)
