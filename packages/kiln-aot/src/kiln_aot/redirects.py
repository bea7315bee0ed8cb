"""Torch-level functions the tracer reroutes before they reach the dispatcher.

``scaled_dot_product_attention`` picks its kernel (flash, memory-efficient, cuDNN, math) in
C++ from the inputs' metadata, which kiln's fake tensors carry with their real device: left
alone (``config.fused_attention``, the default) it reaches the fused kernel eager would run,
which the tracer keeps as one op (``core_ops.ATTENTION_OPS``) and autograd pairs with its
``*_backward`` op; where no fused kernel serves the inputs, the dispatcher itself chooses the
math implementation. With ``fused_attention`` off it is sent to the math implementation
here, so attention becomes matmuls, softmax and (when ``dropout_p > 0``) dropout on every
device.

``adaptive_avg_pool2d`` to 1x1 is a mean in C++, restrided in place (``as_strided_``,
which a functional graph cannot hold) for a channels-last input; it is sent to the pooling
op ``_adaptive_avg_pool2d`` itself, which keeps the input's memory format.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from kiln_aot import config

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


def adaptive_avg_pool2d(input, output_size):
    size = [output_size] * 2 if isinstance(output_size, int) else list(output_size)
    size = [input.shape[i - 2] if n is None else n for i, n in enumerate(size)]
    return aten._adaptive_avg_pool2d.default(input, size)


REDIRECTS: dict[Any, Any] = {torch.nn.functional.adaptive_avg_pool2d: adaptive_avg_pool2d}

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
    return RedirectMode({**REDIRECTS, **MATH_ATTENTION_REDIRECTS})
