"""Channels-last layout for convolution graphs (a graph pass before lowering).

cuDNN and oneDNN run 2-D convolutions fastest on channels-last (NHWC) tensors, and a net
of convolutions, normalizations and activations loses time to the layout conversions
the libraries make inside every NCHW convolution. The pass asks for channels-last where
it pays: the input of every 4-D convolution is converted (a ``clone`` with
``memory_format=channels_last``, skipped when the value already is channels-last; the
libraries lay out the weight themselves), and the
graph's metadata is propagated again on the meta device, so every value downstream takes
the strides eager gives it: convolutions return channels-last, and pointwise ops keep it.
Lowering then realizes those values channels-last (``GraphLowering.preferred_layout``),
so the fused normalization and activation kernels between two convolutions read and write
NHWC and the next convolution takes their buffer as is. Graph inputs and outputs keep the
strides the caller sees (in a graph kiln-aot did not split for training, one that would
need more than a couple of outputs copied back is left alone).

Training graphs (kiln-aot's ``gm.meta["kiln_aot_training"]``): the forward copies back
only what the caller sees; the activations it saves for the backward stay channels-last,
and the backward is compiled for the strides they arrive in (kiln-aot's
``BackwardVariants.note_saved``). In the backward, ``convolution_backward`` reads its
input and output gradient channels-last and returns its input and weight gradients in
its input's layout (ATen's rule for cuDNN and oneDNN); weight gradients are written back
in the weights' layout inside the kernel after them (a cast, under autocast) or by a copy.

Generated kernels loop in the stride order of the buffer they write
(``scheduler.access.loop_order``), so the kernels between convolutions read and write NHWC
buffers contiguously, C fastest. ``KILN_CHANNELS_LAST``: ``auto`` applies it to CUDA
training graphs whose convolutions are 16-bit (bf16 autocast: cuDNN runs them NHWC, and
NCHW operands cost a conversion each way around every call; torch.compile's layout
optimization does the same for training graphs); ``cuda,cpu`` turns it on per device type
for every graph; ``none`` or unset: off. Off by default: on the H200 (bf16 autocast, batch
64, b4b5c52, ``benchmarks/gpu/train_all.sh PLAN=cnn``) ``auto`` made timm ConvNeXt-T's
step 22.8 against 24.0 ms and ResNet-50's 24.2 against 22.9 ms; ResNet-50's step there is
host-bound (a profile: ~14 ms of device work, the forward wrapper's ~900 calls, 296
kernel launches and 330 allocations, hold the GPU up), so its layout barely shows. Before: when kernels still looped in logical order, timm convnext_tiny fell from 1.23x
to 0.44x eager with it on (H200, bf16), and the inference A/B is to be measured again
(benchmarks/gpu/layout_ab.py); on CPU it was not a clear win on a 2-core machine
(benchmarks/models.py, kiln-inductor's CHANGELOG; HF ResNet-50 small training step 31
against 24 ms).

If metadata cannot be propagated again (an op without a meta kernel), the pass undoes its
edits and the graph compiles in its original layout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .. import log
from .depthwise_layout import _cl, conv_args

aten = torch.ops.aten

# a graph with more outputs than this that the layout would change is left alone, unless
# kiln-aot says which outputs the user sees (a training forward's saved activations stay
# channels-last: the backward is compiled for the strides they arrive in)
_MAX_RESTORED_OUTPUTS = 2


def is_channels_last(val: Any) -> bool:
    return (
        isinstance(val, torch.Tensor)
        and val.dim() == 4
        and val.numel() > 0
        and val.is_contiguous(memory_format=torch.channels_last)
        and not val.is_contiguous()
    )


def _conv_operands(n: torch.fx.Node) -> list[Any] | None:
    """The 4-D operands of a 2-D convolution (its input) or of its backward (the input
    and the output gradient) to convert, or None when ``n`` is neither; the input first."""
    conv = conv_args(n)
    if conv is None:
        return None
    x, w, transposed, _, operands = conv
    xv, wv = getattr(x, "meta", {}).get("val"), getattr(w, "meta", {}).get("val")
    if (
        isinstance(xv, torch.Tensor)
        and isinstance(wv, torch.Tensor)
        and xv.dim() == 4
        and wv.dim() == 4
        and not transposed
        and xv.dtype.is_floating_point
    ):
        return operands
    return None


def _visible_outputs(gm: torch.fx.GraphModule, outs: tuple) -> tuple[tuple, bool]:
    """The outputs a caller sees in eager's strides, and whether kiln-aot said which."""
    role = gm.meta.get("kiln_aot_training")
    if not isinstance(role, dict):
        return outs, False
    if role.get("role") == "forward":
        return outs[: int(role["outputs"])], True
    return outs, True


# 16-bit convolutions: cuDNN runs them NHWC and converts NCHW operands and results around
# every call (module docstring)
_AUTO_DTYPES = (torch.bfloat16, torch.float16)


def _wanted(gm: torch.fx.GraphModule, device: torch.device, convs: dict, setting: str) -> bool:
    """Whether the setting asks for channels-last here: the device type named, or ``auto``
    and a CUDA training graph (kiln-aot's forward or backward) of 16-bit convolutions of
    static shapes."""
    devices = setting.split(",")
    if device.type in devices:
        return True
    if "auto" not in devices or device.type != "cuda":
        return False
    if not isinstance(gm.meta.get("kiln_aot_training"), dict):
        return False
    # static shapes only: kiln-aot compiles the backward of symbolic tangents at once, for
    # the traced (NCHW) strides, and channels-last saved values would be copied every step
    vals = [ops[0].meta["val"] for ops in convs.values()]
    return all(v.dtype in _AUTO_DTYPES and all(type(s) is int for s in v.shape) for v in vals)


def to_channels_last(gm: torch.fx.GraphModule, device: torch.device) -> bool:
    """Rewrite ``gm`` in place for channels-last convolutions; True if it did."""
    from ..config import read_config
    from .meta import fill_meta

    convs = {n: ops for n in gm.graph.nodes if (ops := _conv_operands(n)) is not None}
    if not convs or not _wanted(gm, device, convs, read_config().channels_last_devices):
        return False
    graph = gm.graph
    inserted: list[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node]] = []
    for conv, operands in convs.items():
        # the input (and a backward's output gradient) only: a channels-last input makes
        # cuDNN and oneDNN compute and return channels-last, and they lay the weight out as
        # they need themselves (converting it here cost a copy of every weight on every
        # call: 10 ms of 120 for a ResNet on CPU). A value already laid out channels-last
        # (C == 1, or H == W == 1; a saved activation of a channels-last forward) stays.
        for src in dict.fromkeys(operands):
            val = src.meta.get("val")
            if isinstance(val, torch.Tensor) and val.is_contiguous(
                memory_format=torch.channels_last
            ):
                continue
            with graph.inserting_before(conv):
                cl = graph.call_function(
                    aten.clone.default, (src,), {"memory_format": torch.channels_last}
                )
            cl.meta = {k: v for k, v in conv.meta.items() if k != "val"}
            conv.replace_input_with(src, cl)
            inserted.append((conv, src, cl))
    saved = {n: n.meta.get("val") for n in graph.nodes}

    def undo(why: str) -> None:
        for conv, src, cl in reversed(inserted):
            conv.replace_input_with(cl, src)
            graph.erase_node(cl)
        for n, v in saved.items():
            if v is None:
                n.meta.pop("val", None)
            else:
                n.meta["val"] = v
        log.log("graphs", f"channels-last layout not applied: {why}")

    def conv_strides(n: torch.fx.Node, out: Any) -> Any:
        # the meta kernel of a forward answers contiguous; cuDNN and oneDNN return
        # channels-last for channels-last operands, and a backward's input and weight
        # gradients in the layout of its input (ATen's rule; older meta kernels differ)
        if n not in convs:
            return out
        if isinstance(out, tuple):
            return tuple(_cl(v) if k < 2 else v for k, v in enumerate(out))
        return _cl(out)

    try:
        fill_meta(gm, recompute=True, adjust=conv_strides)
    except Exception as e:  # an op without a meta kernel: keep the original layout
        undo(f"{type(e).__name__}: {e}")
        return False
    # outputs keep the strides eager gives them: a contiguous clone (fused into the kernel
    # that computes the value) where the new layout would differ
    out_node = next(n for n in graph.nodes if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else (out_node.args[0],)
    visible, told = _visible_outputs(gm, tuple(outs))
    changed = [
        o
        for o in dict.fromkeys(visible)
        if isinstance(o, torch.fx.Node)
        and is_channels_last(o.meta.get("val"))
        and not is_channels_last(saved.get(o))
    ]
    if len(changed) > _MAX_RESTORED_OUTPUTS and not told:
        undo(
            f"{len(changed)} outputs would need copying back (a training graph saving activations)"
        )
        return False
    for o in changed:
        with graph.inserting_before(out_node):
            back = graph.call_function(
                aten.clone.default, (o,), {"memory_format": torch.contiguous_format}
            )
        back.meta = {**o.meta, "val": o.meta["val"].contiguous()}
        out_node.replace_input_with(o, back)
    gm.recompile()
    log.log("graphs", f"channels-last layout for {len(convs)} convolution(s)")
    return True
