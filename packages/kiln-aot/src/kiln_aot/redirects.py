"""Torch-level functions the tracer reroutes before they reach the dispatcher.

``scaled_dot_product_attention`` picks its kernel (flash, memory-efficient, cuDNN, math) in
C++ from the inputs' metadata, which kiln's fake tensors carry with their real device: left
alone (``config.fused_attention``, the default) it reaches the fused kernel eager would run,
which the tracer keeps as one op (``core_ops.ATTENTION_OPS``) and autograd pairs with its
``*_backward`` op; where no fused kernel serves the inputs, the dispatcher itself chooses the
math implementation. With ``fused_attention`` off it is sent to the math implementation
here, so attention becomes matmuls, softmax and (when ``dropout_p > 0``) dropout on every
device.

A mask that is the same along the keys (stride 0 in its last dimension: an expanded
per-query mask, as transformers 5.17 builds for an encoder without padding under a
compiler) keeps every fused kernel away on CUDA (they need the mask's last stride to be 1),
so eager runs the math kernel there. Such a mask either masks a query's whole row or none
of it: the math kernel gives 0 for a fully masked row (``_safe_softmax``) and ignores a
constant shift of the others. ``sdpa_row_mask`` computes exactly that with the fused
kernel and no mask, zeroing the fully masked rows, so the compiled step runs the kernel
eager would run without the mask (BERT-base training on the H200: memory-efficient
attention instead of matmuls and a softmax over 8 x 12 x 512 x 512 scores per layer).

A mask computed in the graph from constants alone (no input reaches it: transformers
builds the causal mask of a decoder run without padding from ``arange``s when it sees a
compiler, where eager passes no mask and ``is_causal=True``) is evaluated at trace time.
When it is the causal mask (query ``i`` attends key ``j`` exactly when ``j <= i``; boolean,
or additive with 0 and ``-inf``/the dtype's lowest value), attention runs with
``is_causal=True`` and no mask, as eager does: the fused kernels skip the masked blocks and
read no mask (HF GPT-2 / LLaMA training on the H200: the attention kernels' time is
eager's again, and the per-layer expansion of the mask is gone). Masks that depend on an
input (padding), symbolic sizes, or have more than ``CONSTANT_MASK_LIMIT`` elements along
the way are left as they are.

``adaptive_avg_pool2d`` to 1x1 is a mean in C++, restrided in place (``as_strided_``,
which a functional graph cannot hold) for a channels-last input; it is sent to the pooling
op ``_adaptive_avg_pool2d`` itself, which keeps the input's memory format.
"""

from __future__ import annotations

import operator
from typing import Any

import kiln_shapes
import torch
from torch import fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

from kiln_aot import config
from kiln_aot.fx_walk import ancestry

aten = torch.ops.aten


def sdpa_math(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # The public op turns a boolean mask (True = attend) into an additive one before
        # choosing a kernel; the math kernel alone would add True/False as 1/0.
        attn_mask = aten.where.ScalarOther(
            attn_mask,
            aten.scalar_tensor.default(0.0, dtype=query.dtype, device=query.device),
            float("-inf"),
        )
    return aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


# devices whose fused attention kernels reject a mask with last stride 0
ROW_MASK_DEVICES = ("cuda",)


def _row_constant(query, attn_mask) -> bool:
    return (
        isinstance(attn_mask, torch.Tensor)
        and query.device.type in ROW_MASK_DEVICES
        and attn_mask.dim() >= 1
        and attn_mask.size(-1) > 1
        and attn_mask.stride(-1) == 0
        and not query.is_nested
    )


# the most elements a constant mask (and each value it is computed from) may have to be
# evaluated at trace time
CONSTANT_MASK_LIMIT = 1 << 24


def _constant_node(n: fx.Node) -> bool:
    """A node a constant may be computed through: an ATen op (no random draw) or a
    constant, of static sizes and at most ``CONSTANT_MASK_LIMIT`` elements."""
    from kiln_aot.core_ops import is_random

    if n.op not in ("call_function", "get_attr"):
        return False
    if n.op == "call_function":
        target = n.target
        if not (isinstance(target, torch._ops.OpOverload) or target is operator.getitem):
            return False
        if target is not operator.getitem and is_random(target):
            return False
    val = n.meta.get("val")
    for v in val if isinstance(val, (tuple, list)) else (val,):
        if isinstance(v, torch.Tensor) and (
            kiln_shapes.is_symbolic(v) or v.numel() > CONSTANT_MASK_LIMIT
        ):
            return False
    return True


def constant_value(x: Any) -> torch.Tensor | None:
    """The value of a traced tensor computed from graph constants alone (no input, no
    random op, no symbolic size), evaluated now; None when it is not such a tensor."""
    from kiln_aot.fake import FakeTensor
    from kiln_aot.op_tracer import current_tracer

    tracer = current_tracer()
    if tracer is None or not isinstance(x, FakeTensor) or x.trace_state is None:
        return None
    try:
        node = tracer.node_of(x)
    except Exception:
        return None
    order = ancestry(node, _constant_node)
    if order is None:
        return None
    position = {n: i for i, n in enumerate(node.graph.nodes)}
    values: dict[fx.Node, Any] = {}
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        for n in sorted(order, key=position.__getitem__):
            if n.op == "get_attr":
                values[n] = tracer.constants[n.target]
                continue
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), values.__getitem__)
            try:
                values[n] = n.target(*args, **kwargs)
            except Exception:
                return None
    out = values[node]
    return out if isinstance(out, torch.Tensor) and not isinstance(out, FakeTensor) else None


def _is_causal_mask(mask: torch.Tensor, q_len: int, k_len: int) -> bool:
    """Whether ``mask`` (broadcast over the leading dims) lets query ``i`` attend key ``j``
    exactly when ``j <= i``, as ``is_causal=True`` does."""
    if mask.dim() < 2 or tuple(mask.shape[-2:]) != (q_len, k_len) or q_len < 1:
        return False
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril()
    if mask.dtype == torch.bool:
        return bool((mask == allowed).all())
    if not mask.is_floating_point():
        return False
    masked = mask <= torch.finfo(mask.dtype).min  # -inf or the lowest finite value
    return bool(((mask == 0) == allowed).all() and (masked != allowed).all())


def _causal(query, key, attn_mask, is_causal) -> bool:
    if is_causal or not isinstance(attn_mask, torch.Tensor):
        return False
    if query.dim() < 2 or key.dim() < 2:
        return False
    sizes = (query.shape[-2], key.shape[-2])
    if any(not isinstance(s, int) for s in sizes):
        return False  # symbolic lengths: the mask is not a constant
    mask = constant_value(attn_mask)
    if mask is None:
        return False
    with _disable_current_modes(), torch._C.DisableTorchFunction():  # computed, not traced
        return _is_causal_mask(mask, *sizes)


def sdpa_row_mask(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """``scaled_dot_product_attention`` with a constant causal mask run as ``is_causal``,
    and a mask constant along the keys handled as the row mask it is (module docstring);
    any other call goes through unchanged."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kwargs = {"dropout_p": dropout_p, "scale": scale, "enable_gqa": enable_gqa}
    if _causal(query, key, attn_mask, is_causal):
        attn_mask, is_causal = None, True
    if not config.current().efficient_attention and query.device.type == "cuda":
        from kiln_aot.decompositions.attention import _SDP_MATH, dispatcher_sdp_choice

        # the C++ op picks its kernel without the dispatcher: ask it here, and trace the
        # math kernel where it would run the memory-efficient one (config.efficient_attention)
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            choice = dispatcher_sdp_choice(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        if choice == _SDP_MATH:
            return sdpa_math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if attn_mask is None:
        return sdpa(query, key, value, None, is_causal=is_causal, **kwargs)
    if not _row_constant(query, attn_mask):
        return sdpa(query, key, value, attn_mask, is_causal=is_causal, **kwargs)
    row = attn_mask[..., :1]  # one value per query row, broadcast over the output's width
    out = sdpa(query, key, value, None, is_causal=is_causal, **kwargs)
    if row.dtype == torch.bool:
        return torch.where(row, out, 0.0)
    # an additive row: -inf masks the row; a finite shift cancels in the softmax; NaN and
    # +inf make the row NaN as the math kernel does ((row - row) is 0 for finite values)
    return torch.where(row == float("-inf"), 0.0, out + (row - row).to(out.dtype))


def adaptive_avg_pool2d(input, output_size):
    size = [output_size] * 2 if isinstance(output_size, int) else list(output_size)
    size = [input.shape[i - 2] if n is None else n for i, n in enumerate(size)]
    return aten._adaptive_avg_pool2d.default(input, size)


REDIRECTS: dict[Any, Any] = {
    torch.nn.functional.adaptive_avg_pool2d: adaptive_avg_pool2d,
    torch.nn.functional.scaled_dot_product_attention: sdpa_row_mask,
}

# Redirected only while fused attention is off.
MATH_ATTENTION_REDIRECTS: dict[Any, Any] = {
    torch.nn.functional.scaled_dot_product_attention: sdpa_math
}


class RedirectMode(TorchFunctionMode):
    def __init__(self, redirects: dict[Any, Any]) -> None:
        super().__init__()
        self.redirects = redirects

    def __torch_function__(self, func, types, args=(), kwargs=None):
        target = self.redirects.get(func)
        if target is not None:
            return target(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def redirect_mode() -> RedirectMode:
    """The torch-function mode a trace runs under."""
    if config.current().fused_attention:
        return RedirectMode(REDIRECTS)
    # all attention goes to the math kernel, which takes any mask as it is
    return RedirectMode({**REDIRECTS, **MATH_ATTENTION_REDIRECTS})
