"""Depthwise convolutions run channels-last on CPU and, in 16-bit, on CUDA (a graph pass
before lowering).

oneDNN's depthwise convolution (groups == channels, ConvNeXt's 7x7) is several times
faster on channels-last (NHWC) operands than on NCHW ones, in the backward above all
(HF ConvNeXt, (2, 96, 32, 32), one thread: forward ~3.0 -> ~1.1 ms, backward ~20 -> ~7 ms,
NCHW -> NHWC). Eager often hands it NHWC data without asking (ConvNeXt permutes its
activations to (N, H, W, C) and back), but the traced metadata, from the meta kernels,
says NCHW, and lowering realizes NCHW buffers. The general channels-last pass
(layout.py) is off on CPU, where it does not pay for every net, and leaves a training
forward alone; this one touches only the depthwise convolutions and their backward:

- the 4-D tensor operands (input, and the output gradient of ``convolution_backward``)
  are converted (``clone`` to channels-last, which lowering realizes channels-last and
  fuses into the kernel that computes the operand where one does);
- the node's metadata says channels-last for its 4-D results (oneDNN returns them so;
  the wrapper checks a convolution's channels-last output strides, and a fallback's);
  nodes downstream keep theirs: lowering indexes the extern's buffer with its real
  strides, and an op that needs the traced strides (an extern, a graph output) gets a
  copy.

Not every backward gains: with 7x7 (and larger) kernels oneDNN's channels-last depthwise
backward (its weight gradient) loses at small images and falls off a cliff past 640
channels, while the NCHW one does not (``_backward_gains``). Median ms of one 7x7
backward, (2, C, H, H), one thread, NCHW / channels-last, torch 2.13 CPU: C=96: H=2
0.29/0.47, H=8 0.79/0.67, H=16 2.8/1.5; C=384: H=4 1.1/1.6, H=16 16/11; C=640: H=8
3.8/4.9, H=16 15/10; C=768: H=2 1.2/25, H=8 9.0/30, H=16 27/35 (two threads alike: C=768,
H=2 0.75/12; 9x9 too: C=768, H=8 7.5/30). 3x3 kernels gain at every size (C=768, H=16
1.7/0.52), 5x5 about break even (C=768, H=4 1.1/1.4, H=16 9.8/6.6): they stay
channels-last. The forward gains at every size (7x7, C=768, H=2: 1.3/0.12), so a forward
may run channels-last while its backward reads the NCHW values it was traced with.

Memory (``_backward_workspace_fits``): for kernels larger than 3x3, oneDNN's channels-last
weight gradient allocates a workspace of 1 KiB per weight element (C * KH * KW * 1024
bytes, whatever the batch and image: C=96 7x7 4.6 MB, C=192 9.2 MB, C=768 37 MB; 3x3
none; the NCHW backward's peak is about its operands' size). At a small batch that dwarfs
the activations: HF ConvNeXt's small training step (batch 2, 64x64 images) peaked at its
C=192 backward's 9.2 MB workspace on top of the weight gradients made so far (kiln 46 MB
against torch.compile's 39). A backward whose workspace would exceed its input's bytes
stays NCHW (C=96, 16x16, batch 2: 2.5 against 1.1 ms, one thread; ConvNeXt-T at batch 64,
56x56, keeps channels-last: 4.6 MB against 74 MB of input).

CUDA (``_cuda_gains``): ATen runs a depthwise convolution on NCHW operands with its own
kernels (``conv_depthwise2d_*``), on channels-last ones with cuDNN's NHWC kernels. In
bf16 that is 4-5x: timm ConvNeXt-T at batch 64, bf16 autocast, H200, device ms per
training step over all 18 depthwise 7x7 convolutions, NCHW / channels-last: forward 4.9 /
1.3, input gradient 6.3 / 2.4, weight gradient 11.5 / 0.9 (kiln at 1132cde ran NCHW,
0.65x eager's step, eager and torch.compile channels-last: ConvNeXt's activations reach
the convolution permuted from NHWC). The oneDNN rules above (``_backward_gains``, the
workspace) do not apply there: the forward and backward of every 16-bit depthwise
convolution run channels-last (``_CUDA_DTYPES``). One 7x7 convolution at ConvNeXt-T's
stages, batch 64, H200, torch 2.11 (``benchmarks/gpu/depthwise_ab.py`` at 3005fbd, median
device ms of 20), NCHW / channels-last:

    dtype  C    HxW   forward        backward (input and weight gradients)
    bf16   96   56    0.736 / 0.189  2.283 / 0.483
    bf16   192  28    0.361 / 0.106  1.158 / 0.243
    bf16   384  14    0.190 / 0.065  0.706 / 0.146
    bf16   768  7     0.113 / 0.050  0.618 / 0.103
    fp32   96   56    0.652 / 0.385  2.140 / 5.073
    fp32   192  28    0.383 / 0.248  1.135 / 2.733
    fp32   384  14    0.212 / 0.124  0.734 / 1.677
    fp32   768  7     0.123 / 0.111  0.632 / 0.682

fp32 stays NCHW: its channels-last backward is up to 2.4x slower, and a forward alone
converted would cost the backward a conversion of the saved input.

Before: depthwise ``convolution``/``convolution_backward`` with NCHW operands. After:
the same ops on channels-last operands (a backward only where ``_backward_gains`` and
``_backward_workspace_fits``);
values unchanged.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .node_builder import NodeBuilder, finish_pass, traced_tensor

aten = torch.ops.aten


def conv_args(node: torch.fx.Node) -> tuple[Any, Any, bool, int, list[Any]] | None:
    """``(input, weight, transposed, groups, operands)`` of an ATen ``convolution`` or of a
    ``convolution_backward`` whose users are all ``getitem``s, positional arguments only;
    ``operands`` are the 4-D-layout operands a pass may convert, the input first (a
    backward's output gradient second). None for any other node. The channels-last
    passes (this one, layout.py) read convolutions through it."""
    if node.op != "call_function" or node.kwargs:
        return None
    a = node.args
    if node.target is aten.convolution.default:
        return a[0], a[1], a[6], a[8], [a[0]]
    if node.target is aten.convolution_backward.default:
        if not all(u.target is operator.getitem for u in node.users):
            return None
        return a[1], a[2], a[7], a[9], [a[1], a[0]]
    return None


def _is_clone_to_channels_last(x: Any) -> bool:
    return (
        isinstance(x, torch.fx.Node)
        and x.target is aten.clone.default
        and x.kwargs.get("memory_format") is torch.channels_last
    )


def _depthwise(x: Any, w: Any, transposed: bool, groups: int) -> bool:
    xv, wv = traced_tensor(x), traced_tensor(w)
    return (
        xv is not None
        and wv is not None
        and xv.dim() == 4
        and wv.dim() == 4
        and not transposed
        and xv.dtype.is_floating_point
        and groups > 1
        and groups == xv.shape[1] == wv.shape[0]
        and wv.shape[1] == 1
        and xv.shape[2] * xv.shape[3] > 1
    )


# where oneDNN's channels-last depthwise backward loses to its NCHW one (module docstring):
# kernels of 7x7 and larger, on images under 64 pixels or past 640 channels
_BACKWARD_LARGE_KERNEL = 49
_BACKWARD_MIN_PIXELS = 64
_BACKWARD_MAX_CHANNELS = 640


# oneDNN's channels-last depthwise weight gradient: a workspace of this many bytes per weight
# element for kernels larger than 3x3 (fp32, torch 2.13; module docstring)
_BACKWARD_WORKSPACE_PER_WEIGHT = 1024
_BACKWARD_WORKSPACE_MIN_KERNEL = 25


def _backward_workspace_fits(x: Any, w: Any) -> bool:
    """Whether the channels-last backward's workspace is at most its input's bytes."""
    xv, wv = traced_tensor(x), traced_tensor(w)
    assert xv is not None and wv is not None
    if wv.shape[2] * wv.shape[3] < _BACKWARD_WORKSPACE_MIN_KERNEL:
        return True
    workspace = wv.numel() * _BACKWARD_WORKSPACE_PER_WEIGHT
    return workspace <= xv.numel() * xv.element_size()


def _backward_gains(x: Any, w: Any) -> bool:
    xv, wv = traced_tensor(x), traced_tensor(w)
    assert xv is not None and wv is not None
    if wv.shape[2] * wv.shape[3] < _BACKWARD_LARGE_KERNEL:
        return True
    pixels = xv.shape[2] * xv.shape[3]
    return pixels >= _BACKWARD_MIN_PIXELS and xv.shape[1] <= _BACKWARD_MAX_CHANNELS


# dtypes whose depthwise convolutions run faster channels-last on CUDA (module docstring)
_CUDA_DTYPES = (torch.bfloat16, torch.float16)


def _cuda_gains(x: Any) -> bool:
    xv = traced_tensor(x)
    return xv is not None and xv.dtype in _CUDA_DTYPES


def _to_channels_last(add: NodeBuilder, node: torch.fx.Node, x: Any) -> None:
    # also where the traced value is channels-last already: lowering realizes a view (a
    # permute back from NHWC) contiguous unless a channels-last clone asks otherwise
    cl = add(aten.clone.default, x, memory_format=torch.channels_last)
    node.replace_input_with(x, cl)


def _cl(val: Any) -> Any:
    if isinstance(val, torch.Tensor) and val.dim() == 4:
        return val.contiguous(memory_format=torch.channels_last)
    return val


def depthwise_channels_last(gm: torch.fx.GraphModule, device: torch.device) -> int:
    """Run depthwise convolutions and their backward on channels-last operands on CPU,
    and in 16-bit on CUDA (module docstring); returns how many nodes changed."""
    if device.type not in ("cpu", "cuda"):
        return 0
    cpu = device.type == "cpu"
    done = 0
    for node in list(gm.graph.nodes):
        conv = conv_args(node)
        if conv is None:
            continue
        x, w, transposed, groups, operands = conv
        operands = operands[::-1]  # a backward's output gradient converted first
        if not _depthwise(x, w, transposed, groups) or any(
            _is_clone_to_channels_last(o) for o in operands
        ):
            continue  # converted already (the pass ran on this graph)
        if not cpu and not _cuda_gains(x):
            continue  # ATen's own NCHW kernels are kept (fp32)
        if (
            cpu
            and node.target is aten.convolution_backward.default
            and not (_backward_gains(x, w) and _backward_workspace_fits(x, w))
        ):
            continue  # NCHW is faster for this one, or needs far less memory
        add = NodeBuilder(gm.graph, node)
        for operand in dict.fromkeys(operands):
            _to_channels_last(add, node, operand)
        val = node.meta["val"]
        node.meta["val"] = tuple(_cl(v) for v in val) if isinstance(val, tuple) else _cl(val)
        done += 1
    return finish_pass(gm, done, f"{done} depthwise convolution(s) on channels-last operands")
