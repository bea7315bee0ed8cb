"""Attention.

``scaled_dot_product_attention`` chooses its kernel in C++ from the inputs' metadata. With
``config.fused_attention`` on (the default) the tracer keeps the fused kernel it chooses
(``core_ops.ATTENTION_OPS``) and a direct call of ``_fused_sdp_choice`` is answered by the
dispatcher for tensors like the traced ones (``dispatcher_sdp_choice``). With it off the
answer is always the math backend, so attention traces to matmuls, softmax and dropout on
every device (dropout's mask is then a graph value the partitioner saves), and the CPU
flash-attention forward/backward are decomposed for graphs that call them directly,
recomputing the probabilities from the saved log-sum-exp."""

from __future__ import annotations

import math

import torch

from kiln_aot import config
from kiln_aot.decompositions.registry import register

aten = torch.ops.aten


def _t(x):
    return aten.transpose.int(x, -2, -1)


_SDP_MATH = 0  # torch.nn.attention.SDPBackend.MATH
_SDP_EFFICIENT = 2  # torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION


def dispatcher_sdp_choice(q, k, v, *rest, **kwargs) -> int:
    """``_fused_sdp_choice`` asked of the real device's kernel, with uninitialized tensors
    of the traced ones' shape, stride, dtype and device (it reads nothing else)."""

    def real(t):
        if not isinstance(t, torch.Tensor):
            return t
        r = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        return r.requires_grad_(t.requires_grad)

    choice = aten._fused_sdp_choice.default(
        *(real(t) for t in (q, k, v, *rest)), **{n: real(t) for n, t in kwargs.items()}
    )
    if choice == _SDP_EFFICIENT and not config.current().efficient_attention:
        return _SDP_MATH  # see config.efficient_attention
    return choice


@register(aten._fused_sdp_choice.default)
def fused_sdp_choice(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    return _SDP_MATH


def _masked_scores(q, k, is_causal, attn_mask, scale):
    scores = aten.mul.Tensor(aten.matmul.default(q, _t(k)), scale)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = aten.masked_fill.Scalar(
                scores, aten.logical_not.default(attn_mask), float("-inf")
            )
        else:
            scores = aten.add.Tensor(scores, attn_mask)
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        keep = aten.tril.default(aten.full.default([L, S], True, dtype=torch.bool, device=q.device))
        scores = aten.masked_fill.Scalar(scores, aten.logical_not.default(keep), float("-inf"))
    return scores


@register(aten._scaled_dot_product_flash_attention_for_cpu.default)
def flash_attention_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """Returns (output, logsumexp [B, H, L]) like the kernel (torch's table returns the
    probabilities in place of the log-sum-exp, which the backward cannot use)."""
    if dropout_p != 0 or q.shape[1] != k.shape[1] or q.dtype != torch.float32:
        return NotImplemented
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = _masked_scores(q, k, is_causal, attn_mask, scale)
    m = aten.amax.default(scores, [-1], True)
    e = aten.exp.default(aten.sub.Tensor(scores, m))
    total = aten.sum.dim_IntList(e, [-1], True)
    out = aten.matmul.default(aten.div.Tensor(e, total), v)
    lse = aten.squeeze.dims(aten.add.Tensor(aten.log.default(total), m), [-1])
    return out, lse


@register(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def flash_attention_cpu_backward(
    grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    if dropout_p != 0 or q.shape[1] != k.shape[1]:
        return NotImplemented
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = _masked_scores(q, k, is_causal, attn_mask, scale)
    probs = aten.exp.default(aten.sub.Tensor(scores, aten.unsqueeze.default(logsumexp, -1)))
    grad_v = aten.matmul.default(_t(probs), grad_out)
    grad_p = aten.matmul.default(grad_out, _t(v))
    delta = aten.sum.dim_IntList(aten.mul.Tensor(grad_out, out), [-1], True)
    grad_s = aten.mul.Tensor(aten.mul.Tensor(probs, aten.sub.Tensor(grad_p, delta)), scale)
    grad_q = aten.matmul.default(grad_s, k)
    grad_k = aten.matmul.default(_t(grad_s), q)
    return grad_q, grad_k, grad_v
