"""Decompositions of neural-network composites (softmax, norms, activations, dropout,
embedding) into reductions + pointwise ops the compiler fuses.

Low-precision inputs (fp16/bf16) are computed in fp32 and cast back, as eager kernels do.
"""

from __future__ import annotations

import math

import torch

from kiln_aot.decompositions.reductions import var_and_mean
from kiln_aot.decompositions.registry import register

aten = torch.ops.aten
_LOW = (torch.float16, torch.bfloat16)


def _upcast(x):
    return aten._to_copy.default(x, dtype=torch.float32) if x.dtype in _LOW else x


def _cast(x, dtype):
    return x if x.dtype == dtype else aten._to_copy.default(x, dtype=dtype)


# ---- softmax -----------------------------------------------------------------------------
def _row_max(xf, dim):
    """The shift of softmax's rows. amax has no identity: over an empty dimension (an empty
    result) the shift is sum's 0 instead."""
    if xf.dim() and xf.shape[dim] == 0:
        return aten.sum.dim_IntList(xf, [dim], True)
    return aten.amax.default(xf, [dim], True)


@register(aten._softmax.default)
def softmax(x, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else x.dtype
    xf = _upcast(x)
    shifted = aten.sub.Tensor(xf, _row_max(xf, dim))
    e = aten.exp.default(shifted)
    return _cast(aten.div.Tensor(e, aten.sum.dim_IntList(e, [dim], True)), out_dtype)


@register(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    out_dtype = torch.float32 if half_to_float else x.dtype
    xf = _upcast(x)
    shifted = aten.sub.Tensor(xf, _row_max(xf, dim))
    lse = aten.log.default(aten.sum.dim_IntList(aten.exp.default(shifted), [dim], True))
    return _cast(aten.sub.Tensor(shifted, lse), out_dtype)


@register(aten._softmax_backward_data.default)
def softmax_backward(grad, out, dim, input_dtype):
    g, o = _upcast(grad), _upcast(out)
    inner = aten.sum.dim_IntList(aten.mul.Tensor(g, o), [dim], True)
    return _cast(aten.mul.Tensor(o, aten.sub.Tensor(g, inner)), input_dtype)


@register(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad, out, dim, input_dtype):
    g, o = _upcast(grad), _upcast(out)
    total = aten.sum.dim_IntList(g, [dim], True)
    return _cast(aten.sub.Tensor(g, aten.mul.Tensor(aten.exp.default(o), total)), input_dtype)


# ---- normalization -------------------------------------------------------------------------
def _affine(out, weight, bias, shape):
    if weight is not None:
        out = aten.mul.Tensor(out, aten.view.default(weight, shape))
    if bias is not None:
        out = aten.add.Tensor(out, aten.view.default(bias, shape))
    return out


@register(aten.native_layer_norm.default)
def layer_norm(x, normalized_shape, weight, bias, eps):
    axis = x.dim() - len(normalized_shape)
    dims = list(range(axis, x.dim()))
    xf = _upcast(x)
    var, mean = var_and_mean(xf, dims, 0, True)
    rstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    out = aten.mul.Tensor(aten.sub.Tensor(xf, mean), rstd)
    out = _affine(out, weight, bias, list(normalized_shape))
    return _cast(out, x.dtype), _cast(mean, x.dtype), _cast(rstd, x.dtype)


@register(aten.native_layer_norm_backward.default)
def layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    axis = x.dim() - len(normalized_shape)
    inner, outer = list(range(axis, x.dim())), list(range(axis))
    n = math.prod(normalized_shape)
    g, xf = _upcast(grad_out), _upcast(x)
    x_hat = aten.mul.Tensor(aten.sub.Tensor(xf, _upcast(mean)), _upcast(rstd))
    g_hat = aten.mul.Tensor(g, _upcast(weight)) if weight is not None else g
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        total = aten.sum.dim_IntList(g_hat, inner, True)
        proj = aten.mul.Tensor(
            x_hat, aten.sum.dim_IntList(aten.mul.Tensor(g_hat, x_hat), inner, True)
        )
        inner_term = aten.sub.Tensor(aten.sub.Tensor(aten.mul.Tensor(g_hat, n), total), proj)
        grad_input = _cast(aten.mul.Tensor(aten.div.Tensor(_upcast(rstd), n), inner_term), x.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = (
            _cast(aten.sum.dim_IntList(aten.mul.Tensor(g, x_hat), outer, False), weight.dtype)
            if outer
            else _cast(aten.mul.Tensor(g, x_hat), weight.dtype)
        )
    if output_mask[2] and bias is not None:
        grad_bias = (
            _cast(aten.sum.dim_IntList(g, outer, False), bias.dtype)
            if outer
            else _cast(aten.clone.default(g), bias.dtype)
        )
    return grad_input, grad_weight, grad_bias


@register(aten.native_batch_norm.default, aten._native_batch_norm_legit_functional.default)
def batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Training: batch statistics, running stats updated in place with the unbiased
    variance (functionalized into extra outputs). Eval: running statistics."""
    dims = [0, *range(2, x.dim())]
    shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
    xf = _upcast(x)
    if training:
        n = math.prod(x.shape[d] for d in dims)
        var, mean = var_and_mean(xf, dims, 0, False)
        invstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
        if running_mean is not None:
            running_mean.copy_(
                aten.add.Tensor(
                    aten.mul.Tensor(mean, momentum), aten.mul.Tensor(running_mean, 1 - momentum)
                )
            )
        if running_var is not None:
            unbiased = aten.mul.Tensor(var, n / max(n - 1, 1))
            running_var.copy_(
                aten.add.Tensor(
                    aten.mul.Tensor(unbiased, momentum), aten.mul.Tensor(running_var, 1 - momentum)
                )
            )
        save_mean, save_invstd = mean, invstd
    else:
        mean = _upcast(running_mean)
        invstd = aten.rsqrt.default(aten.add.Tensor(_upcast(running_var), eps))
        save_mean = aten.full.default([0], 0, dtype=torch.float32, device=x.device)
        save_invstd = aten.full.default([0], 0, dtype=torch.float32, device=x.device)
    out = aten.mul.Tensor(
        aten.sub.Tensor(xf, aten.view.default(mean, shape)), aten.view.default(invstd, shape)
    )
    out = _cast(_affine(out, weight, bias, shape), x.dtype)
    return out, save_mean, save_invstd


@register(aten._native_batch_norm_legit.default)
def batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@register(aten._native_batch_norm_legit.no_stats)
def batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    return batch_norm(x, weight, bias, None, None, True, momentum, eps)


@register(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)


@register(aten.native_group_norm.default)
def group_norm(x, weight, bias, N, C, HxW, group, eps):
    xf = _upcast(x)
    grouped = aten.view.default(xf, [N, group, -1])
    var, mean = var_and_mean(grouped, [2], 0, True)
    rstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    out = aten.view.default(aten.mul.Tensor(aten.sub.Tensor(grouped, mean), rstd), list(x.shape))
    out = _affine(out, weight, bias, [1, C] + [1] * (x.dim() - 2))
    mean2 = aten.squeeze.dims(mean, [2])
    rstd2 = aten.squeeze.dims(rstd, [2])
    return _cast(out, x.dtype), _cast(mean2, x.dtype), _cast(rstd2, x.dtype)


# ---- activations ---------------------------------------------------------------------------
@register(aten.gelu.default)
def gelu(x, *, approximate="none"):
    xf = _upcast(x)
    if approximate == "tanh":
        inner = aten.mul.Tensor(
            aten.add.Tensor(xf, aten.mul.Tensor(aten.pow.Tensor_Scalar(xf, 3), 0.044715)),
            math.sqrt(2 / math.pi),
        )
        cdf = aten.mul.Tensor(aten.add.Tensor(aten.tanh.default(inner), 1), 0.5)
    else:
        cdf = aten.mul.Tensor(
            aten.add.Tensor(aten.erf.default(aten.mul.Tensor(xf, math.sqrt(0.5))), 1), 0.5
        )
    return _cast(aten.mul.Tensor(xf, cdf), x.dtype)


@register(aten.silu.default)
def silu(x):
    xf = _upcast(x)
    return _cast(aten.mul.Tensor(xf, aten.sigmoid.default(xf)), x.dtype)


# ---- dropout -------------------------------------------------------------------------------
@register(aten.native_dropout.default)
def native_dropout(x, p, train):
    """Used only with ``KILN_AOT_DECOMPOSE_DROPOUT=1`` (else native_dropout is kept). The
    mask is a graph value; the partitioners save it for the backward (random ops are never
    recomputed), so forward and backward see the same mask."""
    if not train or p == 0:
        return aten.clone.default(x), aten.full.default(
            list(x.shape), True, dtype=torch.bool, device=x.device
        )
    if p >= 1:
        return aten.full.default(
            list(x.shape), 0, dtype=x.dtype, device=x.device
        ), aten.full.default(list(x.shape), False, dtype=torch.bool, device=x.device)
    noise = aten.rand.default(list(x.shape), dtype=torch.float32, device=x.device)
    mask = aten.gt.Scalar(noise, p)
    return aten.mul.Tensor(aten.mul.Tensor(x, mask), 1.0 / (1.0 - p)), mask


@register(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    return aten.mul.Tensor(aten.mul.Tensor(grad, _cast(mask, grad.dtype)), scale)


# ---- embedding ---------------------------------------------------------------------------
# embedding is kept whole (core_ops.KEPT_OPS): its ids do not wrap and a bad one raises
# IndexError, where index_select's raises RuntimeError; kiln-inductor lowers it to a gather
# whose bounds check says what eager says.
# embedding_dense_backward is kept whole (core_ops.KEPT_OPS): eager's kernel sorts the
# indices and sums rows in parallel, where zeros + index_put(accumulate) clones the table.


@register(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    zero = aten.scalar_tensor.default(0, dtype=grad.dtype, device=grad.device)
    return aten.where.self(aten.le.Scalar(x, threshold), zero, grad)
