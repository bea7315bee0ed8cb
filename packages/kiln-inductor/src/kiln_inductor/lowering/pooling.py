"""Lowerings of pooling and resampling: max_pool2d (with indices), avg_pool2d,
adaptive_avg_pool2d, upsample nearest/bilinear. Windows are small and unrolled into the
pointwise body; out-of-range taps are masked."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..ir.nodes import Pointwise, TensorValue
from ..ir.ops import ops
from ..ir.symbols import Expr, FloorDiv, sym
from .reduction import mean
from .registry import register_lowering
from .values import compute_dtype

aten = torch.ops.aten


def _pair(v: Any, default: Any = None) -> tuple[int, int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return v, v
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _out_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    num = n + 2 * p - d * (k - 1) - 1
    out = (num + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _valid(i: Any, n: Expr) -> Any:
    return ops.logical_and(
        ops.ge(i, ops.constant(0, torch.int64)), ops.lt(i, ops.index_expr(n, torch.int64))
    )


def _window(x: TensorValue, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool):
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding, 0)
    dh, dw = _pair(dilation, 1)
    H, W = int(x.size[-2]), int(x.size[-1])
    oh = _out_size(H, kh, sh, ph, dh, ceil_mode)
    ow = _out_size(W, kw, sw, pw, dw, ceil_mode)
    return (kh, kw, sh, sw, ph, pw, dh, dw, H, W, oh, ow)


@register_lowering(aten.max_pool2d_with_indices)
def max_pool2d_with_indices(
    x: TensorValue,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> tuple[TensorValue, TensorValue]:
    kh, kw, sh, sw, ph, pw, dh, dw, H, W, oh, ow = _window(
        x, kernel_size, stride, padding, dilation, ceil_mode
    )
    loader = x.make_loader()
    dt = compute_dtype(x.dtype)
    lead = list(x.size[:-2])
    size = (*lead, sym(oh), sym(ow))

    def taps(idx: Sequence[Expr]):
        best = best_i = None
        for a in range(kh):
            for b in range(kw):
                ih = idx[-2] * sh - ph + a * dh
                iw = idx[-1] * sw - pw + b * dw
                ok = ops.logical_and(
                    _valid(ops.index_expr(ih, torch.int64), H),
                    _valid(ops.index_expr(iw, torch.int64), W),
                )
                src = [
                    *idx[:-2],
                    sympy.Min(sympy.Max(ih, 0), H - 1),
                    sympy.Min(sympy.Max(iw, 0), W - 1),
                ]
                v = ops.where(
                    ok,
                    ops.to_dtype(loader(src), dt) if dt != x.dtype else loader(src),
                    ops.constant(-math.inf, dt),
                )
                flat = ops.index_expr(
                    sympy.Min(sympy.Max(ih, 0), H - 1) * W + sympy.Min(sympy.Max(iw, 0), W - 1),
                    torch.int64,
                )
                if best is None:
                    best, best_i = v, flat
                    continue
                take = ops.logical_or(ops.gt(v, best), ops.isnan(v))
                take = ops.logical_and(take, ops.logical_not(ops.isnan(best)))
                best = ops.where(take, v, best)
                best_i = ops.where(take, flat, best_i)
        return best, best_i

    def values(idx: Sequence[Expr]) -> Any:
        v = taps(idx)[0]
        return ops.to_dtype(v, x.dtype) if dt != x.dtype else v

    def indices(idx: Sequence[Expr]) -> Any:
        return taps(idx)[1]

    return Pointwise(x.device, x.dtype, size, values), Pointwise(
        x.device, torch.int64, size, indices
    )


@register_lowering(aten.max_pool2d)
def max_pool2d(
    x: TensorValue,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> TensorValue:
    return max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


@register_lowering(aten.avg_pool2d)
def avg_pool2d(
    x: TensorValue,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> TensorValue:
    kh, kw, sh, sw, ph, pw, _, _, H, W, oh, ow = _window(
        x, kernel_size, stride, padding, 1, ceil_mode
    )
    loader = x.make_loader()
    dt = compute_dtype(x.dtype)
    size = (*x.size[:-2], sym(oh), sym(ow))

    def inner(idx: Sequence[Expr]) -> Any:
        total = None
        for a in range(kh):
            for b in range(kw):
                ih = idx[-2] * sh - ph + a
                iw = idx[-1] * sw - pw + b
                ok = ops.logical_and(
                    _valid(ops.index_expr(ih, torch.int64), H),
                    _valid(ops.index_expr(iw, torch.int64), W),
                )
                src = [
                    *idx[:-2],
                    sympy.Min(sympy.Max(ih, 0), H - 1),
                    sympy.Min(sympy.Max(iw, 0), W - 1),
                ]
                v = loader(src)
                v = ops.to_dtype(v, dt) if dt != x.dtype else v
                v = ops.where(ok, v, ops.constant(0, dt))
                total = v if total is None else ops.add(total, v)
        if divisor_override:
            div = ops.constant(divisor_override, dt)
        else:
            hs, ws = idx[-2] * sh - ph, idx[-1] * sw - pw
            he, we = sympy.Min(hs + kh, H + ph), sympy.Min(ws + kw, W + pw)
            if count_include_pad:
                count = (he - hs) * (we - ws)
            else:
                count = (sympy.Min(he, H) - sympy.Max(hs, 0)) * (
                    sympy.Min(we, W) - sympy.Max(ws, 0)
                )
            div = ops.index_expr(count, dt)
        out = ops.truediv(total, div)
        return ops.to_dtype(out, x.dtype) if dt != x.dtype else out

    return Pointwise(x.device, x.dtype, size, inner)


@register_lowering(aten._adaptive_avg_pool2d, aten.adaptive_avg_pool2d)
def adaptive_avg_pool2d(x: TensorValue, output_size: Sequence[int]) -> TensorValue:
    oh, ow = _pair(output_size)
    H, W = int(x.size[-2]), int(x.size[-1])
    if oh == 1 and ow == 1:
        return mean(x, [-2, -1], True)
    if H % oh == 0 and W % ow == 0:
        return avg_pool2d(x, [H // oh, W // ow], [H // oh, W // ow])
    loader = x.make_loader()
    dt = compute_dtype(x.dtype)
    mh, mw = math.ceil(H / oh) + 1, math.ceil(W / ow) + 1

    def inner(idx: Sequence[Expr]) -> Any:
        hs, he = FloorDiv(idx[-2] * H, oh), FloorDiv(idx[-2] * H + H + oh - 1, oh)
        ws, we = FloorDiv(idx[-1] * W, ow), FloorDiv(idx[-1] * W + W + ow - 1, ow)
        total = None
        for a in range(mh):
            for b in range(mw):
                ih, iw = hs + a, ws + b
                ok = ops.logical_and(
                    ops.lt(ops.index_expr(ih, torch.int64), ops.index_expr(he, torch.int64)),
                    ops.lt(ops.index_expr(iw, torch.int64), ops.index_expr(we, torch.int64)),
                )
                v = loader([*idx[:-2], sympy.Min(ih, H - 1), sympy.Min(iw, W - 1)])
                v = ops.to_dtype(v, dt) if dt != x.dtype else v
                v = ops.where(ok, v, ops.constant(0, dt))
                total = v if total is None else ops.add(total, v)
        out = ops.truediv(total, ops.index_expr((he - hs) * (we - ws), dt))
        return ops.to_dtype(out, x.dtype) if dt != x.dtype else out

    return Pointwise(x.device, x.dtype, (*x.size[:-2], sym(oh), sym(ow)), inner)


def _scales(
    x: TensorValue, output_size: Any, scale_factors: Any
) -> tuple[int, int, float | None, float | None]:
    H, W = int(x.size[-2]), int(x.size[-1])
    if output_size:
        return output_size[0], output_size[1], None, None
    sh, sw = scale_factors
    return int(math.floor(H * sh)), int(math.floor(W * sw)), sh, sw


@register_lowering(aten.upsample_nearest2d)
def upsample_nearest2d(
    x: TensorValue, output_size: Any = None, scales_h: Any = None, scales_w: Any = None
) -> TensorValue:
    if isinstance(
        scales_h, (list, tuple)
    ):  # the .vec overload: (input, output_size, scale_factors)
        oh, ow, scales_h, scales_w = _scales(x, output_size, scales_h)
    else:
        oh, ow = output_size
    H, W = int(x.size[-2]), int(x.size[-1])
    loader = x.make_loader()

    def src(o: Expr, n: int, out: int, scale: Any) -> Expr:
        if scale and float(scale).is_integer():
            return sympy.Min(FloorDiv(o, int(scale)), n - 1)
        return sympy.Min(FloorDiv(o * n, out), n - 1)

    def inner(idx: Sequence[Expr]) -> Any:
        return loader([*idx[:-2], src(idx[-2], H, oh, scales_h), src(idx[-1], W, ow, scales_w)])

    return Pointwise(x.device, x.dtype, (*x.size[:-2], sym(oh), sym(ow)), inner)


@register_lowering(aten.upsample_bilinear2d)
def upsample_bilinear2d(
    x: TensorValue,
    output_size: Any = None,
    align_corners: bool = False,
    scales_h: Any = None,
    scales_w: Any = None,
) -> TensorValue:
    if isinstance(scales_h, (list, tuple)) or (scales_h is None and output_size is None):
        oh, ow, scales_h, scales_w = _scales(x, output_size, scales_h)
    else:
        oh, ow = output_size
    H, W = int(x.size[-2]), int(x.size[-1])
    loader = x.make_loader()
    dt = compute_dtype(x.dtype)

    def coord(o: Expr, n: int, out: int, scale: Any) -> tuple[Any, Any, Any, Any]:
        if align_corners:
            ratio = (n - 1) / (out - 1) if out > 1 else 0.0
            s = ops.mul(ops.index_expr(o, dt), ops.constant(ratio, dt))
        else:
            ratio = 1.0 / scale if scale else n / out
            s = ops.sub(
                ops.mul(
                    ops.add(ops.index_expr(o, dt), ops.constant(0.5, dt)), ops.constant(ratio, dt)
                ),
                ops.constant(0.5, dt),
            )
            s = ops.maximum(s, ops.constant(0.0, dt))
        i0 = ops.to_dtype(s, torch.int64)  # s >= 0: truncation is floor
        i0 = ops.minimum(i0, ops.constant(n - 1, torch.int64))
        i1 = ops.minimum(
            ops.add(i0, ops.constant(1, torch.int64)), ops.constant(n - 1, torch.int64)
        )
        lam = ops.sub(s, ops.to_dtype(i0, dt))
        return (
            ops.indirect_indexing(i0, n),
            ops.indirect_indexing(i1, n),
            lam,
            ops.sub(ops.constant(1.0, dt), lam),
        )

    def inner(idx: Sequence[Expr]) -> Any:
        h0, h1, lh, mh = coord(idx[-2], H, oh, scales_h)
        w0, w1, lw, mw = coord(idx[-1], W, ow, scales_w)
        lead = list(idx[:-2])

        def at(h: Expr, w: Expr) -> Any:
            v = loader([*lead, h, w])
            return ops.to_dtype(v, dt) if dt != x.dtype else v

        top = ops.add(ops.mul(at(h0, w0), mw), ops.mul(at(h0, w1), lw))
        bot = ops.add(ops.mul(at(h1, w0), mw), ops.mul(at(h1, w1), lw))
        out = ops.add(ops.mul(top, mh), ops.mul(bot, lh))
        return ops.to_dtype(out, x.dtype) if dt != x.dtype else out

    return Pointwise(x.device, x.dtype, (*x.size[:-2], sym(oh), sym(ow)), inner)
