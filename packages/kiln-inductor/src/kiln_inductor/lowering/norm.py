"""Lowerings of normalizations as decomposed: layer_norm, batch_norm (inference and
training statistics), group_norm. Statistics come from one Welford pass; the normalization
is a pointwise consumer the scheduler fuses after it (two loops, one kernel)."""

from __future__ import annotations

from typing import Any

import torch

from ..ir.nodes import TensorValue
from ..ir.ops import ops
from ..ir.symbols import product
from .reduction import welford
from .registry import register_lowering
from .values import compute_dtype, pointwise, to_dtype
from .views import view

aten = torch.ops.aten


def _rstd(m2: TensorValue, n: Any, eps: float) -> TensorValue:
    dt = m2.dtype
    return pointwise(
        lambda v: ops.rsqrt(ops.add(ops.truediv(v, ops.constant(n, dt)), ops.constant(eps, dt))),
        [m2],
        dt,
    )


def _affine(
    x: TensorValue,
    mean: TensorValue,
    rstd: TensorValue,
    weight: Any,
    bias: Any,
    out_dtype: torch.dtype,
) -> TensorValue:
    dt = compute_dtype(x.dtype)
    args = [to_dtype(x, dt), mean, rstd] + [a for a in (weight, bias) if a is not None]

    def fn(v: Any, m: Any, r: Any, *wb: Any) -> Any:
        out = ops.mul(ops.sub(v, m), r)
        k = 0
        if weight is not None:
            out = ops.mul(out, ops.to_dtype(wb[k], dt))
            k += 1
        if bias is not None:
            out = ops.add(out, ops.to_dtype(wb[k], dt))
        return out

    return pointwise(fn, args, out_dtype, dt)


@register_lowering(aten.native_layer_norm)
def native_layer_norm(
    x: TensorValue, normalized_shape: Any, weight: Any, bias: Any, eps: float
) -> tuple[TensorValue, ...]:
    k = len(normalized_shape)
    dims = list(range(x.ndim - k, x.ndim))
    mean, m2 = welford(x, dims, True)
    rstd = _rstd(m2, product(x.size[d] for d in dims), eps)
    out = _affine(x, mean, rstd, weight, bias, x.dtype)
    return out, *_saved_stats(x, mean, rstd)


def _saved_stats(x: TensorValue, *stats: TensorValue) -> tuple[TensorValue, ...]:
    """The statistics a norm returns: CPU eager computes them in float32 (the output uses
    those) but returns them in the input's dtype (bfloat16 in, bfloat16 mean/rstd out);
    CUDA returns float32, as the meta kernels do."""
    if x.device.type != "cpu" or x.dtype == compute_dtype(x.dtype):
        return stats
    return tuple(to_dtype(s, x.dtype) for s in stats)


@register_lowering(aten._native_batch_norm_legit_no_training)
def batch_norm_inference(
    x: TensorValue,
    weight: Any,
    bias: Any,
    running_mean: TensorValue,
    running_var: TensorValue,
    momentum: float,
    eps: float,
) -> tuple[TensorValue, ...]:
    shape = [1, -1] + [1] * (x.ndim - 2)
    dt = compute_dtype(x.dtype)
    mean = view(to_dtype(running_mean, dt), shape)
    rstd = pointwise(
        lambda v: ops.rsqrt(ops.add(v, ops.constant(eps, dt))),
        [view(to_dtype(running_var, dt), shape)],
        dt,
    )
    w = view(weight, shape) if weight is not None else None
    b = view(bias, shape) if bias is not None else None
    out = _affine(x, mean, rstd, w, b, x.dtype)
    empty = pointwise(lambda: ops.constant(0.0, dt), [], dt)
    return out, empty, empty


@register_lowering(
    aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional, aten.native_batch_norm
)
def batch_norm_training(
    x: TensorValue,
    weight: Any,
    bias: Any,
    running_mean: Any,
    running_var: Any,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[TensorValue, ...]:
    if not training and running_mean is not None:
        return batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps)
    from .graph_unsupported import unsupported

    raise unsupported("batch norm in training mode updates running statistics in place")


@register_lowering(aten.native_group_norm)
def native_group_norm(
    x: TensorValue, weight: Any, bias: Any, n: int, c: int, hw: int, groups: int, eps: float
) -> tuple[TensorValue, ...]:
    xg = view(x, [n, groups, -1])
    mean, m2 = welford(xg, [2], True)
    rstd = _rstd(m2, xg.size[2], eps)
    shape = [n, groups, c // groups, -1]
    x4 = view(x, shape)
    w = view(weight, [1, groups, c // groups, 1]) if weight is not None else None
    b = view(bias, [1, groups, c // groups, 1]) if bias is not None else None
    mean4, rstd4 = view(mean, [n, groups, 1, 1]), view(rstd, [n, groups, 1, 1])
    out = view(_affine(x4, mean4, rstd4, w, b, x.dtype), list(x.size))
    return out, *_saved_stats(x, view(mean, [n, groups]), view(rstd, [n, groups]))
