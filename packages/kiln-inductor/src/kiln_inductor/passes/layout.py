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
strides the caller sees (a graph that would need more than a couple of outputs copied
back, a training forward saving activations, is left alone).

Generated kernels loop in the stride order of the buffer they write
(``scheduler.access.loop_order``), so the kernels between convolutions read and write NHWC
buffers contiguously, C fastest. Off by default (``KILN_CHANNELS_LAST=cuda,cpu`` turns it
on per device type; ``none`` turns it off): when kernels still looped in logical order,
timm convnext_tiny fell from 1.23x to 0.44x eager with it on (H200, bf16); it is to be
measured again on the GPU (benchmarks/gpu/layout_ab.py) and on CPU it was not a clear
win on a 2-core machine (benchmarks/models.py, kiln-inductor's CHANGELOG).

If metadata cannot be propagated again (an op without a meta kernel), the pass undoes its
edits and the graph compiles in its original layout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .. import log

aten = torch.ops.aten

_CONV = aten.convolution.default
# a graph with more outputs than this that the layout would change is left alone: it is a
# training forward whose saved activations the backward graph reads in the old layout
_MAX_RESTORED_OUTPUTS = 2


def is_channels_last(val: Any) -> bool:
    return (
        isinstance(val, torch.Tensor)
        and val.dim() == 4
        and val.numel() > 0
        and val.is_contiguous(memory_format=torch.channels_last)
        and not val.is_contiguous()
    )


def _conv_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not _CONV:
            continue
        x, w = n.args[0], n.args[1]
        xv, wv = getattr(x, "meta", {}).get("val"), getattr(w, "meta", {}).get("val")
        transposed = n.args[6] if len(n.args) > 6 else False
        if (
            isinstance(xv, torch.Tensor)
            and isinstance(wv, torch.Tensor)
            and xv.dim() == 4
            and wv.dim() == 4
            and not transposed
            and xv.dtype.is_floating_point
        ):
            out.append(n)
    return out


def to_channels_last(gm: torch.fx.GraphModule, device: torch.device) -> bool:
    """Rewrite ``gm`` in place for channels-last convolutions; True if it did."""
    from ..config import read_config
    from .meta import fill_meta

    if device.type not in read_config().channels_last_devices.split(","):
        return False
    convs = _conv_nodes(gm)
    if not convs:
        return False
    graph = gm.graph
    inserted: list[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node]] = []
    for conv in convs:
        # the input only: a channels-last input makes cuDNN and oneDNN compute and return
        # channels-last, and they lay the weight out as they need themselves (converting
        # it here cost a copy of every weight on every call: 10 ms of 120 for a ResNet on
        # CPU). A value already laid out channels-last (C == 1, or H == W == 1) stays.
        src = conv.args[0]
        val = src.meta.get("val")
        if isinstance(val, torch.Tensor) and val.is_contiguous(memory_format=torch.channels_last):
            continue
        with graph.inserting_before(conv):
            cl = graph.call_function(
                aten.clone.default, (src,), {"memory_format": torch.channels_last}
            )
        cl.meta = {k: v for k, v in conv.meta.items() if k != "val"}
        conv.replace_input_with(src, cl)
        inserted.append((conv, src, cl))
    saved = {n: n.meta.get("val") for n in graph.nodes}
    converted = set(convs)

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
        # the meta kernel answers contiguous; cuDNN and oneDNN return channels-last for
        # channels-last operands (other backends' outputs are copied by the wrapper)
        if n in converted and isinstance(out, torch.Tensor):
            return out.contiguous(memory_format=torch.channels_last)
        return out

    try:
        fill_meta(gm, recompute=True, adjust=conv_strides)
    except Exception as e:  # an op without a meta kernel: keep the original layout
        undo(f"{type(e).__name__}: {e}")
        return False
    # outputs keep the strides eager gives them: a contiguous clone (fused into the kernel
    # that computes the value) where the new layout would differ
    out_node = next(n for n in graph.nodes if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else (out_node.args[0],)
    changed = [
        o
        for o in dict.fromkeys(outs)
        if isinstance(o, torch.fx.Node)
        and is_channels_last(o.meta.get("val"))
        and not is_channels_last(saved.get(o))
    ]
    if len(changed) > _MAX_RESTORED_OUTPUTS:
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
