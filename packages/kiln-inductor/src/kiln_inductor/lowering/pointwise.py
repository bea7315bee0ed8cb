"""Lowerings of elementwise ATen ops: math, comparisons, casts, where, clamp, activations."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..ir.nodes import Pointwise, TensorValue
from ..ir.ops import ops
from ..ir.symbols import product
from .registry import register_lowering
from .values import compute_dtype, device_of, pointwise, promote, to_dtype

aten = torch.ops.aten


def _binary(op_name: str, *, int_to_float: bool = False):
    def lower(a: Any, b: Any) -> Pointwise:
        dtype = promote(a, b, int_to_float=int_to_float)
        return pointwise(getattr(ops, op_name), [a, b], dtype)

    return lower


def _unary(op_name: str, *, int_to_float: bool = False):
    def lower(a: TensorValue) -> Pointwise:
        dtype = promote(a, int_to_float=int_to_float)
        return pointwise(getattr(ops, op_name), [a], dtype)

    return lower


def _compare(op_name: str):
    def lower(a: Any, b: Any) -> Pointwise:
        return pointwise(getattr(ops, op_name), [a, b], torch.bool, promote(a, b))

    return lower


for _name in ("mul", "maximum", "minimum"):
    register_lowering(getattr(aten, _name))(_binary(_name))
for _name in ("atan2", "hypot", "copysign"):
    register_lowering(getattr(aten, _name))(_binary(_name, int_to_float=True))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    register_lowering(getattr(aten, _name))(_compare(_name))
for _name in ("logical_and", "logical_or", "logical_xor"):
    register_lowering(getattr(aten, _name))(
        (
            lambda n: (
                lambda a, b: pointwise(
                    getattr(ops, n),
                    [
                        to_dtype(a, torch.bool) if isinstance(a, TensorValue) else bool(a),
                        to_dtype(b, torch.bool) if isinstance(b, TensorValue) else bool(b),
                    ],
                    torch.bool,
                    torch.bool,
                )
            )
        )(_name)
    )
for _name in (
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_left_shift",
    "bitwise_right_shift",
):
    register_lowering(getattr(aten, _name))(_binary(_name))
for _name in ("fmod",):
    register_lowering(getattr(aten, _name))(_binary(_name))
register_lowering(aten.remainder)(_binary("remainder"))

_FLOAT_UNARY = (
    "exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh "
    "asinh acosh atanh erf erfc sigmoid reciprocal lgamma"
).split()
for _name in _FLOAT_UNARY:
    register_lowering(getattr(aten, _name))(_unary(_name, int_to_float=True))
for _name in ("neg", "abs", "sign", "sgn", "square"):
    register_lowering(getattr(aten, _name))(_unary("sign" if _name == "sgn" else _name))
for _name in ("floor", "ceil", "round", "trunc", "frac"):
    register_lowering(getattr(aten, _name))(
        (
            lambda n: (
                lambda a, decimals=0: (
                    a if not a.dtype.is_floating_point else pointwise(getattr(ops, n), [a], a.dtype)
                )
            )
        )(_name)
    )
register_lowering(aten.bitwise_not)(
    lambda a: pointwise(ops.logical_not if a.dtype == torch.bool else ops.bitwise_not, [a], a.dtype)
)
register_lowering(aten.logical_not)(
    lambda a: pointwise(ops.logical_not, [to_dtype(a, torch.bool)], torch.bool, torch.bool)
)
register_lowering(aten.isnan)(
    lambda a: (
        pointwise(ops.isnan, [a], torch.bool, a.dtype)
        if a.dtype.is_floating_point
        else pointwise(lambda x: ops.constant(False, torch.bool), [a], torch.bool, a.dtype)
    )
)
register_lowering(aten.isinf)(
    lambda a: (
        pointwise(ops.isinf, [a], torch.bool, a.dtype)
        if a.dtype.is_floating_point
        else pointwise(lambda x: ops.constant(False, torch.bool), [a], torch.bool, a.dtype)
    )
)
register_lowering(aten.signbit)(
    lambda a: pointwise(ops.signbit, [a], torch.bool, promote(a, int_to_float=True))
)


@register_lowering(aten.add, aten.sub)
def _add_sub(a: Any, b: Any, alpha: Any = 1) -> Pointwise:
    from .context import current_node

    node = current_node()
    is_sub = node is not None and getattr(node.target, "overloadpacket", None) is aten.sub
    return add(a, b, alpha=alpha, subtract=is_sub)


def add(a: Any, b: Any, alpha: Any = 1, subtract: bool = False) -> Pointwise:
    dtype = promote(a, b)
    cdt = compute_dtype(dtype)

    def fn(x: Any, y: Any) -> Any:
        if alpha != 1:
            y = ops.mul(y, ops.constant(alpha, cdt))
        if dtype == torch.bool:
            return ops.logical_or(x, y)
        return ops.sub(x, y) if subtract else ops.add(x, y)

    return pointwise(fn, [a, b], dtype)


def sub(a: Any, b: Any) -> Pointwise:
    return add(a, b, subtract=True)


def mul(a: Any, b: Any) -> Pointwise:
    return pointwise(ops.mul, [a, b], promote(a, b))


def div(a: Any, b: Any) -> Pointwise:
    return pointwise(ops.truediv, [a, b], promote(a, b, int_to_float=True))


def exp(a: Any) -> Pointwise:
    return pointwise(ops.exp, [a], promote(a, int_to_float=True))


register_lowering(aten.rsub)(
    lambda a, b, alpha=1: (
        add(b, a, alpha=1, subtract=True) if alpha == 1 else add(b, mul(a, alpha), subtract=True)
    )
)


@register_lowering(aten.div)
def _div(a: Any, b: Any, rounding_mode: str | None = None) -> Pointwise:
    if rounding_mode is None:
        return div(a, b)
    dtype = promote(a, b)
    if dtype in (torch.bfloat16, torch.float16):
        scalar = not isinstance(b, TensorValue) or product(b.size) == 1
        if scalar:
            # eager divides by the divisor's original value in float32 and rounds once
            fn = ops.floordiv if rounding_mode == "floor" else ops.truncdiv
            return pointwise(fn, [a, b], dtype)
        if rounding_mode == "trunc":
            # eager rounds the quotient to the low precision type before truncating it
            return pointwise(
                lambda x, y: ops.trunc(ops.to_dtype(ops.truediv(x, y), dtype)), [a, b], dtype
            )
        return pointwise(lambda x, y: _floordiv_low_precision(x, y, dtype), [a, b], dtype)
    fn = ops.floordiv if rounding_mode == "floor" else ops.truncdiv
    return pointwise(fn, [a, b], dtype)


def _floordiv_low_precision(x: Any, y: Any, dtype: torch.dtype) -> Any:
    """Python floor division as eager computes it for bfloat16/float16: c10's
    div_floor_floating on the low precision type, each operation rounded to it (rounding
    only the float32 result differs by one on many inputs)."""
    f32 = torch.float32

    def r(v: Any) -> Any:  # round to the low precision type, keep computing in float32
        return ops.to_dtype(ops.to_dtype(v, dtype), f32)

    zero, one, half = (ops.constant(c, f32) for c in (0.0, 1.0, 0.5))
    mod = r(ops.fmod(x, y))
    div = r(ops.truediv(r(ops.sub(x, mod)), y))
    wrong_sign = ops.logical_and(ops.ne(mod, zero), ops.ne(ops.lt(y, zero), ops.lt(mod, zero)))
    div = ops.where(wrong_sign, r(ops.sub(div, one)), div)
    fl = ops.floor(div)
    fl = ops.where(ops.gt(r(ops.sub(div, fl)), half), r(ops.add(fl, one)), fl)
    quotient = r(ops.truediv(x, y))
    result = ops.where(ops.ne(div, zero), fl, ops.copysign(zero, quotient))
    return ops.where(ops.eq(y, zero), quotient, result)


@register_lowering(aten.pow)
def _pow(a: Any, b: Any) -> Pointwise:
    dtype = promote(a, b)
    if not isinstance(b, TensorValue) and isinstance(a, TensorValue):
        # ATen specializes these exponents the same way (x*x, x*x*x), so results match
        # eager and the loop needs no libm pow (slow, and GELU-tanh uses x**3).
        if b == 2:
            return pointwise(lambda x: ops.mul(x, x), [a], dtype)
        if b == 3:
            return pointwise(lambda x: ops.mul(ops.mul(x, x), x), [a], dtype)
        if b == 1:
            return pointwise(lambda x: x, [a], dtype)
        if b == 0.5 and dtype.is_floating_point:
            return pointwise(ops.sqrt, [a], dtype)
    return pointwise(ops.pow, [a, b], dtype)


@register_lowering(aten.where)
def where(cond: Any, a: Any, b: Any) -> Pointwise:
    dtype = promote(a, b)
    cdt = compute_dtype(dtype)
    from .values import broadcast_sizes, operand_loader

    size = broadcast_sizes(*[x.size for x in (cond, a, b) if isinstance(x, TensorValue)])
    lc = operand_loader(cond, size, torch.bool)
    la, lb = operand_loader(a, size, cdt), operand_loader(b, size, cdt)

    def inner(index: Any) -> Any:
        out = ops.where(lc(index), la(index), lb(index))
        return ops.to_dtype(out, dtype) if cdt != dtype else out

    return Pointwise(device_of(cond, a, b), dtype, size, inner)


@register_lowering(aten.clamp, aten.clamp_min, aten.clamp_max)
def _clamp(a: TensorValue, min: Any = None, max: Any = None) -> Pointwise:
    from .context import current_node

    node = current_node()
    packet = getattr(node.target, "overloadpacket", None) if node is not None else None
    if packet is aten.clamp_max:
        min, max = None, min
    return clamp(a, min, max)


def clamp(a: TensorValue, lo: Any = None, hi: Any = None) -> Pointwise:
    dtype = promote(*[x for x in (a, lo, hi) if x is not None])
    args = [a] + [x for x in (lo, hi) if x is not None]

    def fn(x: Any, *bounds: Any) -> Any:
        k = 0
        if lo is not None:
            x = ops.maximum(x, bounds[k])
            k += 1
        if hi is not None:
            x = ops.minimum(x, bounds[k])
        return x

    return pointwise(fn, args, dtype)


@register_lowering(
    aten._to_copy, aten.clone, aten.alias, aten.lift_fresh_copy, aten.detach, aten.contiguous
)
def _to_copy(a: TensorValue, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorValue:
    if not isinstance(a, TensorValue):
        return a
    return (
        to_dtype(a, dtype)
        if dtype is not None
        else Pointwise(a.device, a.dtype, a.size, a.make_loader())
    )


register_lowering(aten.relu)(lambda a: pointwise(ops.relu, [a], a.dtype))


def _float_act(fn: Any):
    def lower(a: TensorValue, *args: Any, **kwargs: Any) -> Pointwise:
        return pointwise(lambda x: fn(x, compute_dtype(a.dtype), *args, **kwargs), [a], a.dtype)

    return lower


def _gelu(x: Any, dt: torch.dtype, approximate: str = "none") -> Any:
    c = lambda v: ops.constant(v, dt)
    if approximate == "tanh":
        inner = ops.mul(
            c(math.sqrt(2 / math.pi)), ops.add(x, ops.mul(c(0.044715), ops.mul(x, ops.mul(x, x))))
        )
        return ops.mul(ops.mul(c(0.5), x), ops.add(c(1.0), ops.tanh(inner)))
    return ops.mul(ops.mul(c(0.5), x), ops.add(c(1.0), ops.erf(ops.mul(x, c(1 / math.sqrt(2))))))


def _silu(x: Any, dt: torch.dtype) -> Any:
    return ops.mul(x, ops.sigmoid(x))


def _leaky_relu(x: Any, dt: torch.dtype, slope: float = 0.01) -> Any:
    return ops.where(ops.gt(x, ops.constant(0, dt)), x, ops.mul(x, ops.constant(slope, dt)))


def _elu(
    x: Any, dt: torch.dtype, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0
) -> Any:
    c = lambda v: ops.constant(v, dt)
    neg = ops.mul(c(alpha), ops.expm1(ops.mul(x, c(input_scale))))
    return ops.mul(c(scale), ops.where(ops.gt(x, c(0)), x, neg))


def _hardtanh(x: Any, dt: torch.dtype, lo: float = -1.0, hi: float = 1.0) -> Any:
    return ops.minimum(ops.maximum(x, ops.constant(lo, dt)), ops.constant(hi, dt))


def _hardsigmoid(x: Any, dt: torch.dtype) -> Any:
    c = lambda v: ops.constant(v, dt)
    return ops.truediv(ops.minimum(ops.maximum(ops.add(x, c(3.0)), c(0.0)), c(6.0)), c(6.0))


def _hardswish(x: Any, dt: torch.dtype) -> Any:
    return ops.mul(x, _hardsigmoid(x, dt))


def _softplus(x: Any, dt: torch.dtype, beta: float = 1.0, threshold: float = 20.0) -> Any:
    c = lambda v: ops.constant(v, dt)
    bx = ops.mul(x, c(beta))
    return ops.where(ops.gt(bx, c(threshold)), x, ops.truediv(ops.log1p(ops.exp(bx)), c(beta)))


def _mish(x: Any, dt: torch.dtype) -> Any:
    return ops.mul(x, ops.tanh(_softplus(x, dt)))


for _op, _fn in (
    (aten.gelu, _gelu),
    (aten.silu, _silu),
    (aten.leaky_relu, _leaky_relu),
    (aten.elu, _elu),
    (aten.hardtanh, _hardtanh),
    (aten.hardsigmoid, _hardsigmoid),
    (aten.hardswish, _hardswish),
    (aten.softplus, _softplus),
    (aten.mish, _mish),
):
    register_lowering(_op)(_float_act(_fn))


@register_lowering(aten.masked_fill)
def _masked_fill(a: TensorValue, mask: TensorValue, value: Any) -> Pointwise:
    out = where(mask, to_dtype(value, a.dtype) if isinstance(value, TensorValue) else value, a)
    return out if out.dtype == a.dtype else to_dtype(out, a.dtype)  # type: ignore[return-value]


@register_lowering(aten.lerp)
def _lerp(a: Any, b: Any, w: Any) -> Pointwise:
    dtype = promote(a, b)
    return pointwise(lambda x, y, t: ops.add(x, ops.mul(t, ops.sub(y, x))), [a, b, w], dtype)


@register_lowering(aten.addcmul, aten.addcdiv)
def _addc(a: Any, t1: Any, t2: Any, value: Any = 1) -> Pointwise:
    from .context import current_node

    is_div = getattr(current_node().target, "overloadpacket", None) is aten.addcdiv
    dtype = promote(a, t1, t2)
    cdt = compute_dtype(dtype)
    f = ops.truediv if is_div else ops.mul
    return pointwise(
        lambda x, y, z: ops.add(x, ops.mul(ops.constant(value, cdt), f(y, z))), [a, t1, t2], dtype
    )


@register_lowering(aten.nan_to_num)
def _nan_to_num(
    a: TensorValue,
    nan: float | None = 0.0,
    posinf: float | None = None,
    neginf: float | None = None,
) -> TensorValue:
    if not a.dtype.is_floating_point:
        return a
    info = torch.finfo(a.dtype)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    dt = compute_dtype(a.dtype)

    def fn(x: Any) -> Any:
        x = ops.where(ops.isnan(x), ops.constant(nan, dt), x)
        x = ops.where(ops.eq(x, ops.constant(math.inf, dt)), ops.constant(posinf, dt), x)
        return ops.where(ops.eq(x, ops.constant(-math.inf, dt)), ops.constant(neginf, dt), x)

    return pointwise(fn, [a], a.dtype)


@register_lowering(aten.logit)
def _logit(a: TensorValue, eps: float | None = None) -> Pointwise:
    dtype = promote(a, int_to_float=True)
    dt = compute_dtype(dtype)

    def fn(x: Any) -> Any:
        if eps is not None:
            x = ops.minimum(ops.maximum(x, ops.constant(eps, dt)), ops.constant(1 - eps, dt))
        return ops.log(ops.truediv(x, ops.sub(ops.constant(1.0, dt), x)))

    return pointwise(fn, [a], dtype)
