"""Patch convolutions become matmuls on CPU (a graph pass before lowering).

A convolution whose kernel equals its stride, without padding, dilation or groups (a
ViT/ConvNeXt stem, ConvNeXt's 2x2 downsampling between stages) reads every input pixel
once: it is a matmul of non-overlapping patches with the weight,

    rows[(n, ho, wo), (c, i, j)] = x[n, c, ho*kh + i, wo*kw + j]        (M = N*Ho*Wo, K = C*kh*kw)
    y = rows @ w.reshape(Co, K).T + bias                               -> (N, Ho, Wo, Co)

and its backward is two more (grad_input = G @ w, grad_weight = G.T @ rows, with
G = grad_output as (M, Co) rows; grad_bias = G summed over rows). oneDNN's convolution
kernels run these shapes far below its matmul's throughput, and badly so channels-last
and in the backward: HF ConvNeXt's 384 -> 768 downsampling on (2, 384, 8, 8), one thread,
~6 ms forward and ~12 ms backward where the same products as mm take ~1 ms each.

The backward of any dense convolution whose output has few pixels over the batch
(N*Ho*Wo <= ``_SMALL_OUTPUT_ROWS``: a ResNet's last stages at small images) is matmuls
too: the weight gradient G.T @ rows with the input's windows as rows (im2col: a strided
view of the padded input, copied as (N*Ho*Wo, C*kh*kw) rows), the input gradient the
col2im of G @ W (each kernel tap's values spread to every stride-th pixel, shifted to the
tap's offset and summed: one generated kernel; kernels of more than ``_COL2IM_MAX_TAPS``
taps leave it to the convolution's backward), the bias gradient G summed over rows.
oneDNN's backward kernels spread their work over the output's pixels, and with a handful
of them run far below matmul speed: HF ResNet's small CPU step (batch 2, 64x64), one
thread, weight gradients 1024 -> 2048 1x1 stride 2 on 4x4 ~8.3 ms and 512 -> 512 3x3
stride 2 on 4x4 2.5-8 ms, where the rows and the mm take ~0.6 ms each (at N*Ho*Wo = 64
about 1.3 against 1.0 ms, at 128 even or behind); input gradients of the same 1.8 and
2.2 ms against ~0.45 ms of mm.

Before: ``convolution`` / ``convolution_backward`` nodes. After: the patch ones are
``mm``/``addmm`` over reshaped and permuted views (lowering computes the patch rows as one
copy where the operand is not already laid out as rows), and their results have the
strides the graph's metadata gave the convolution's (a ``clone`` to that layout, which
lowering fuses into the kernel reading it), so nothing downstream changes. CPU only: on the
GPU, cuDNN runs these convolutions well.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .node_builder import NodeBuilder, finish_pass, traced_tensor

aten = torch.ops.aten


def _patch_kernel(x: Any, w: Any, conv_args: tuple) -> tuple[int, int] | None:
    """(kh, kw) when the convolution is a non-overlapping patch one (module docstring)."""
    stride, padding, dilation, transposed, _, groups = conv_args
    xv, wv = traced_tensor(x), traced_tensor(w)
    if xv is None or wv is None or xv.dim() != 4 or wv.dim() != 4:
        return None
    kh, kw = int(wv.shape[2]), int(wv.shape[3])
    if (
        transposed
        or groups != 1
        or kh * kw == 1
        or list(stride) != [kh, kw]
        or any(padding)
        or any(d != 1 for d in dilation)
        or not xv.dtype.is_floating_point
        or xv.shape[2] % kh
        or xv.shape[3] % kw
    ):
        return None
    return kh, kw


def _rows(b: NodeBuilder, x: torch.fx.Node, kh: int, kw: int) -> torch.fx.Node:
    """The input's patches as (N*Ho*Wo, C*kh*kw) rows."""
    n, c, h, w = traced_tensor(x).shape
    split = b(aten.reshape.default, x, [n, c, h // kh, kh, w // kw, kw])
    patches = b(aten.permute.default, split, [0, 2, 4, 1, 3, 5])
    return b(aten.reshape.default, patches, [n * (h // kh) * (w // kw), c * kh * kw])


def _weight_matrix(b: NodeBuilder, w: torch.fx.Node) -> torch.fx.Node:
    co = traced_tensor(w).shape[0]
    return b(aten.reshape.default, w, [co, traced_tensor(w)[0].numel()])


def _forward(b: NodeBuilder, conv: torch.fx.Node, kh: int, kw: int) -> dict[int | None, Any]:
    x, w, bias = conv.args[:3]
    n, _, h, wd = traced_tensor(x).shape
    rows = _rows(b, x, kh, kw)
    wt = b(aten.permute.default, _weight_matrix(b, w), [1, 0])
    y = b(aten.addmm.default, bias, rows, wt) if bias is not None else b(aten.mm.default, rows, wt)
    nhwc = b(aten.view.default, y, [n, h // kh, wd // kw, traced_tensor(w).shape[0]])
    out = b(aten.permute.default, nhwc, [0, 3, 1, 2])
    return {None: b.in_layout_of(out, traced_tensor(conv))}


def _backward(b: NodeBuilder, node: torch.fx.Node, kh: int, kw: int) -> dict[int | None, Any]:
    grad, x, w = node.args[:3]
    mask = node.args[10]
    n, c, h, wd = traced_tensor(x).shape
    co = traced_tensor(w).shape[0]
    g = b(aten.reshape.default, b(aten.permute.default, grad, [0, 2, 3, 1]), [-1, co])
    outs: dict[int | None, Any] = {}
    vals = node.meta["val"]
    if mask[0]:
        gx = b(aten.mm.default, g, _weight_matrix(b, w))
        split = b(aten.reshape.default, gx, [n, h // kh, wd // kw, c, kh, kw])
        nchw = b(aten.permute.default, split, [0, 3, 1, 4, 2, 5])
        outs[0] = b.in_layout_of(b(aten.reshape.default, nchw, [n, c, h, wd]), vals[0])
    if mask[1]:
        gw = b(aten.mm.default, b(aten.permute.default, g, [1, 0]), _rows(b, x, kh, kw))
        outs[1] = b.in_layout_of(b(aten.reshape.default, gw, list(traced_tensor(w).shape)), vals[1])
    if mask[2]:
        outs[2] = b(aten.sum.dim_IntList, g, [0])
    return outs


# a dense convolution's backward is matmuls when its output has at most this many pixels
# over the batch (module docstring)
_SMALL_OUTPUT_ROWS = 64


def _small_output(node: torch.fx.Node) -> bool:
    """Whether a ``convolution_backward`` node's results are best matmuls of the output
    gradient with the input's windows and the weight (module docstring)."""
    grad, x, w = node.args[:3]
    _, padding, dilation, transposed, _, groups = node.args[4:10]
    gv, xv, wv = traced_tensor(grad), traced_tensor(x), traced_tensor(w)
    if gv is None or xv is None or wv is None:
        return False
    if gv.dim() != 4 or xv.dim() != 4 or wv.dim() != 4 or len(padding) != 2:
        return False
    if transposed or groups != 1 or any(d != 1 for d in dilation):
        return False
    n, _, ho, wo = gv.shape
    return xv.dtype.is_floating_point and n * ho * wo <= _SMALL_OUTPUT_ROWS


def _window_rows(b: NodeBuilder, x: Any, node: torch.fx.Node) -> torch.fx.Node:
    """The input's convolution windows as (N*Ho*Wo, C*kh*kw) rows (im2col)."""
    stride, padding = node.args[4], node.args[5]
    n, c, h, wd = traced_tensor(x).shape
    _, _, kh, kw = traced_tensor(node.args[2]).shape
    _, _, ho, wo = traced_tensor(node.args[0]).shape
    if any(padding):
        ph, pw = padding
        x = b(aten.constant_pad_nd.default, x, [pw, pw, ph, ph], 0.0)
        h, wd = h + 2 * ph, wd + 2 * pw
    if not traced_tensor(x).is_contiguous():
        x = b(aten.clone.default, x, memory_format=torch.contiguous_format)
    sh, sw = stride
    windows = b(
        aten.as_strided.default, x, [n, ho, wo, c, kh, kw], [c * h * wd, sh * wd, sw, h * wd, wd, 1]
    )
    return b(aten.reshape.default, windows, [n * ho * wo, c * kh * kw])


# the input gradient is put back together from its kernel taps (col2im) for at most this
# many taps; a larger kernel's stays with the convolution's backward
_COL2IM_MAX_TAPS = 9


def _col2im(b: NodeBuilder, cols: torch.fx.Node, node: torch.fx.Node) -> torch.fx.Node:
    """The input gradient from its windows' gradients, (N*Ho*Wo, C*kh*kw) rows: each
    kernel tap's (N, C, Ho, Wo) values spread to every stride-th pixel and placed at the
    tap's offset in the padded input, the taps summed, the padding cut off."""
    grad, x, w = node.args[:3]
    n, c, h, wd = traced_tensor(x).shape
    _, _, kh, kw = traced_tensor(w).shape
    _, _, ho, wo = traced_tensor(grad).shape
    (sh, sw), (ph, pw) = node.args[4], node.args[5]
    hp, wp = h + 2 * ph, wd + 2 * pw
    eh, ew = (ho - 1) * sh + 1, (wo - 1) * sw + 1  # the pixels one tap reaches
    taps = b(aten.reshape.default, cols, [n, ho, wo, c, kh, kw])
    total = None
    for i in range(kh):
        for j in range(kw):
            tap = b(aten.select.int, b(aten.select.int, taps, 5, j), 4, i)
            tap = b(aten.permute.default, tap, [0, 3, 1, 2])
            if sh > 1 or sw > 1:
                tap = b(aten.reshape.default, tap, [n, c, ho, 1, wo, 1])
                tap = b(aten.constant_pad_nd.default, tap, [0, sw - 1, 0, 0, 0, sh - 1], 0.0)
                tap = b(aten.reshape.default, tap, [n, c, ho * sh, wo * sw])
                tap = b(aten.slice.Tensor, b(aten.slice.Tensor, tap, 2, 0, eh), 3, 0, ew)
            pad = [j, wp - j - ew, i, hp - i - eh]
            placed = b(aten.constant_pad_nd.default, tap, pad, 0.0)
            total = placed if total is None else b(aten.add.Tensor, total, placed)
    if ph or pw:
        total = b(aten.slice.Tensor, b(aten.slice.Tensor, total, 2, ph, ph + h), 3, pw, pw + wd)
    return total


def _small_output_backward(b: NodeBuilder, node: torch.fx.Node) -> dict[int | None, Any]:
    """A small-output ``convolution_backward``'s results as matmuls (module docstring): the
    weight gradient, the input gradient (kernels of at most ``_COL2IM_MAX_TAPS`` taps) and
    the bias gradient."""
    grad, x, w = node.args[:3]
    mask, vals = node.args[10], node.meta["val"]
    wv = traced_tensor(w)
    g = b(aten.reshape.default, b(aten.permute.default, grad, [0, 2, 3, 1]), [-1, wv.shape[0]])
    outs: dict[int | None, Any] = {}
    if mask[0] and wv.shape[2] * wv.shape[3] <= _COL2IM_MAX_TAPS:
        cols = b(aten.mm.default, g, _weight_matrix(b, w))
        outs[0] = b.in_layout_of(_col2im(b, cols, node), vals[0])
    if mask[1]:
        gw = b(aten.mm.default, b(aten.permute.default, g, [1, 0]), _window_rows(b, x, node))
        outs[1] = b.in_layout_of(b(aten.reshape.default, gw, list(wv.shape)), vals[1])
    if mask[2]:
        outs[2] = b(aten.sum.dim_IntList, g, [0])
    return outs


def _split_small_output(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """A small-output ``convolution_backward``'s results as matmuls; the node keeps what
    is left of its mask (erased when nothing is)."""
    users = list(node.users)
    if not all(u.target is operator.getitem for u in users):
        return False
    b = NodeBuilder(graph, node)
    outs = _small_output_backward(b, node)
    if not outs:
        return False
    if not all(_same_meta(new, node.meta["val"][i]) for i, new in outs.items()):
        b.undo()  # never expected: keep the convolution's
        return False
    for user in users:
        if user.args[1] in outs:
            user.replace_all_uses_with(outs[user.args[1]])
            graph.erase_node(user)
    mask = [m and i not in outs for i, m in enumerate(node.args[10])]
    if not any(mask):
        graph.erase_node(node)
        return True
    node.args = (*node.args[:10], mask)
    node.meta["val"] = tuple(v if mask[i] else None for i, v in enumerate(node.meta["val"]))
    return True


def _same_meta(new: torch.fx.Node, old: Any) -> bool:
    v = new.meta["val"]
    return (
        isinstance(old, torch.Tensor)
        and v.shape == old.shape
        and v.dtype == old.dtype
        and all(s == t or d == 1 for s, t, d in zip(v.stride(), old.stride(), v.shape))
    )


def rewrite_patch_convolutions(gm: torch.fx.GraphModule, device: torch.device) -> int:
    """Rewrite patch convolutions and their backward, and the backward of small-output
    convolutions, as matmuls on CPU (module docstring); returns how many nodes were
    rewritten."""
    if device.type != "cpu":
        return 0
    graph = gm.graph
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target is aten.convolution.default:
            kernel = _patch_kernel(node.args[0], node.args[1], tuple(node.args[3:9]))
            build = _forward
        elif node.target is aten.convolution_backward.default:
            kernel = _patch_kernel(node.args[1], node.args[2], tuple(node.args[4:10]))
            build = _backward
        else:
            continue
        if kernel is None:
            if build is _backward and _small_output(node):
                done += _split_small_output(graph, node)
            continue
        b = NodeBuilder(graph, node)
        outs = build(b, node, *kernel)
        old = node.meta.get("val")
        olds = {None: old} if build is _forward else dict(enumerate(old or ()))
        readers_known = build is _forward or all(
            u.target is operator.getitem and u.args[1] in outs for u in node.users
        )
        if not readers_known or not all(_same_meta(new, olds.get(i)) for i, new in outs.items()):
            b.undo()  # never expected: keep the convolution
            continue
        if build is _forward:
            node.replace_all_uses_with(outs[None])
        else:
            for user in list(node.users):
                user.replace_all_uses_with(outs[user.args[1]])
                graph.erase_node(user)
        graph.erase_node(node)
        done += 1
    return finish_pass(gm, done, f"{done} patch or small-output convolution(s) as matmuls")
