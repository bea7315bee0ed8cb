"""TritonOpsHandler: the virtual ops of kiln_inductor.ir.ops, emitted as Triton statements.

Every value is a ``TritonValue`` (a kernel variable and the logical dtype it holds); equal
expressions are emitted once per scope (common subexpression elimination). Values keep
their dtype: a bfloat16 load stays bfloat16 until the body converts it (kiln-inductor's
lowerings compute low-precision floats in float32, as eager does). Memory access is the
kernel's business: ``load`` asks ``kernel.load_expr`` for the pointer and mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy
import torch

from ..errors import TritonCodegenError
from .index import print_index

if TYPE_CHECKING:
    from .kernel import TritonKernel

TL_TYPES = {
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.bfloat16: "tl.bfloat16",
    torch.float16: "tl.float16",
    torch.int64: "tl.int64",
    torch.int32: "tl.int32",
    torch.int16: "tl.int16",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}


def tl_type(dtype: torch.dtype) -> str:
    if dtype not in TL_TYPES:
        raise TritonCodegenError(
            f"dtype {dtype}", "kiln-triton kernels do not support it", "cast to a supported dtype"
        )
    return TL_TYPES[dtype]


@dataclass(frozen=True)
class TritonValue:
    name: str
    dtype: torch.dtype

    def __str__(self) -> str:
        return self.name


def literal(value: Any, dtype: torch.dtype) -> str:
    """A Python literal for ``value`` of ``dtype`` (used inside tl.full and tl.where)."""
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v) or math.isinf(v):
            return f"float('{v}')"
        return repr(v)
    return str(int(value))


# unary ops with a tl builtin (name in tl) for float32/float64
_TL_UNARY = {"exp": "tl.exp", "exp2": "tl.exp2", "log": "tl.log", "log2": "tl.log2",
             "sin": "tl.sin", "cos": "tl.cos", "floor": "tl.floor", "ceil": "tl.ceil",
             "erf": "tl.erf", "sqrt": "tl.sqrt"}  # fmt: skip
# binary ops that are one infix operator, and comparisons
_INFIX = {"sub": "-", "truediv": "/", "fmod": "%", "bitwise_and": "&", "bitwise_or": "|",
          "bitwise_xor": "^", "bitwise_left_shift": "<<", "bitwise_right_shift": ">>"}  # fmt: skip
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
# binary float ops through kiln_triton.runtime.libm
_LIBM_BINARY = {"atan2", "hypot", "copysign"}
# unary ops through kiln_triton.runtime.libm (libdevice on GPUs)
_LIBM_UNARY = {"expm1", "log1p", "log10", "tan", "asin", "acos", "atan", "sinh", "cosh",
               "tanh", "asinh", "acosh", "atanh", "erfc", "lgamma", "trunc"}  # fmt: skip


class TritonOpsHandler:
    def __init__(self, kernel: TritonKernel, emit: Callable[[str], None]):
        self.kernel = kernel
        self.emit = emit
        self.cache: dict[str, TritonValue] = {}
        self.count = 0

    def fresh(self, prefix: str = "tmp") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def value(self, expr: str, dtype: torch.dtype) -> TritonValue:
        key = f"{dtype}:{expr}"
        if key in self.cache:
            return self.cache[key]
        name = self.fresh()
        self.emit(f"{name} = {expr}")
        v = TritonValue(name, dtype)
        self.cache[key] = v
        return v

    # -- memory and indices ------------------------------------------------------------------
    def load(self, name: str, index: Any) -> TritonValue:
        found = self.kernel.forwarded(name, index)
        if found is not None:
            return found
        ptr, mask, dtype = self.kernel.load_expr(name, index)
        return self.value(f"tl.load({ptr}, {mask}, other=0)", dtype)

    def constant(self, value: Any, dtype: torch.dtype) -> TritonValue:
        return self.value(f"tl.full([], {literal(value, dtype)}, {tl_type(dtype)})", dtype)

    def index_expr(self, expr: Any, dtype: torch.dtype) -> TritonValue:
        expr = sympy.expand(sympy.sympify(expr))
        if expr.is_Integer:
            return self.constant(int(expr), dtype)
        text = self.kernel.index_text(expr)
        return self.value(f"({text}).to({tl_type(dtype)})", dtype)

    def indirect_indexing(self, value: TritonValue, size: Any, check: Any = None) -> sympy.Symbol:
        size_s = print_index(size)
        v = self.value(f"{value}.to(tl.int64)", torch.int64)
        wrap = check is None or check.wrap
        w = self.value(f"tl.where({v} < 0, {v} + {size_s}, {v})", torch.int64) if wrap else v
        if check is None:
            return sympy.Symbol(w.name, integer=True, nonnegative=True)
        # a live lane out of range writes [check number, index] into the kernel's error row
        # (its last argument) and reads element 0 (kiln_inductor.index_check)
        live = self.kernel.mask_text()
        bad = self.value(f"(({w} < 0) | ({w} >= {size_s})) & {live}", torch.bool)
        if f"check:{bad}" not in self.cache:
            self.cache[f"check:{bad}"] = bad
            code = self.kernel.check_code(check)
            zero = f"({w} * 0)"
            self.emit(f"tl.atomic_max(index_err + {zero}, {zero} + {code}, mask={bad})")
            self.emit(f"tl.atomic_max(index_err + 1 + {zero}, {v}, mask={bad})")
        ok = self.value(f"tl.where({bad}, 0, {w})", torch.int64)
        return sympy.Symbol(ok.name, integer=True, nonnegative=True)

    def masked(self, mask: TritonValue, body: Callable[[], TritonValue], other: Any) -> TritonValue:
        saved_cache = dict(self.cache)
        outer = self.kernel.extra_mask
        self.kernel.extra_mask = mask.name if outer is None else f"({outer} & {mask.name})"
        try:
            result = body()
        finally:
            self.kernel.extra_mask = outer
            self.cache = saved_cache
        fill = self.constant(other, result.dtype)
        return self.value(f"tl.where({mask}, {result}, {fill})", result.dtype)

    # -- conversions -------------------------------------------------------------------------
    def to_dtype(self, x: TritonValue, dtype: torch.dtype, src_dtype: Any = None) -> TritonValue:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self.value(f"({x} != 0)", dtype)
        return self.value(f"{x}.to({tl_type(dtype)})", dtype)

    def where(self, c: TritonValue, a: TritonValue, b: TritonValue) -> TritonValue:
        return self.value(f"tl.where({c}, {a}, {b})", a.dtype)

    # -- arithmetic --------------------------------------------------------------------------
    def _bin(self, a: TritonValue, b: TritonValue, op: str) -> TritonValue:
        return self.value(f"({a} {op} {b})", a.dtype)

    def add(self, a: TritonValue, b: TritonValue) -> TritonValue:
        return self._bin(a, b, "|" if a.dtype == torch.bool else "+")

    def mul(self, a: TritonValue, b: TritonValue) -> TritonValue:
        return self._bin(a, b, "&" if a.dtype == torch.bool else "*")

    def floordiv(self, a: TritonValue, b: TritonValue) -> TritonValue:
        if a.dtype.is_floating_point:
            return self.value(f"tl.floor({a} / {b})", a.dtype)
        return self.value(f"libm.floordiv_int({a}, {b})", a.dtype)

    def truncdiv(self, a: TritonValue, b: TritonValue) -> TritonValue:
        if a.dtype.is_floating_point:
            return self.value(f"libm.trunc({a} / {b})", a.dtype)
        return self._bin(a, b, "//")

    def remainder(self, a: TritonValue, b: TritonValue) -> TritonValue:
        kind = "float" if a.dtype.is_floating_point else "int"
        return self.value(f"libm.remainder_{kind}({a}, {b})", a.dtype)

    def pow(self, a: TritonValue, b: TritonValue) -> TritonValue:
        if a.dtype.is_floating_point:
            return self.value(f"libm.pow({a}, {b})", a.dtype)
        return self.value(f"libm.ipow({a}, {b})", a.dtype)

    def maximum(self, a: TritonValue, b: TritonValue) -> TritonValue:
        if a.dtype == torch.bool:
            return self._bin(a, b, "|")
        if a.dtype.is_floating_point:
            return self.value(f"libm.max_nan({a}, {b})", a.dtype)
        return self.value(f"tl.maximum({a}, {b})", a.dtype)

    def minimum(self, a: TritonValue, b: TritonValue) -> TritonValue:
        if a.dtype == torch.bool:
            return self._bin(a, b, "&")
        if a.dtype.is_floating_point:
            return self.value(f"libm.min_nan({a}, {b})", a.dtype)
        return self.value(f"tl.minimum({a}, {b})", a.dtype)

    def _truth(self, a: TritonValue) -> TritonValue:
        return a if a.dtype == torch.bool else self.value(f"({a} != 0)", torch.bool)

    def logical_and(self, a: TritonValue, b: TritonValue) -> TritonValue:
        return self.value(f"({self._truth(a)} & {self._truth(b)})", torch.bool)

    def logical_or(self, a: TritonValue, b: TritonValue) -> TritonValue:
        return self.value(f"({self._truth(a)} | {self._truth(b)})", torch.bool)

    def logical_xor(self, a: TritonValue, b: TritonValue) -> TritonValue:
        return self.value(f"({self._truth(a)} ^ {self._truth(b)})", torch.bool)

    def logical_not(self, a: TritonValue) -> TritonValue:
        return self.value(f"({a} == 0)", torch.bool)

    def bitwise_not(self, a: TritonValue) -> TritonValue:
        if a.dtype == torch.bool:
            return self.value(f"({a} == 0)", torch.bool)
        return self.value(f"(~{a})", a.dtype)

    # -- unary -------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name in _INFIX:
            return lambda a, b: self._bin(a, b, _INFIX[name])
        if name in _CMP:
            return lambda a, b: self.value(f"({a} {_CMP[name]} {b})", torch.bool)
        if name in _LIBM_BINARY:
            return lambda a, b: self.value(f"libm.{name}({a}, {b})", a.dtype)
        if name in _TL_UNARY:
            return lambda a: self.value(f"{_TL_UNARY[name]}({a})", a.dtype)
        if name in _LIBM_UNARY:
            return lambda a: self.value(f"libm.{name}({a})", a.dtype)
        raise AttributeError(f"kiln-triton has no Triton for virtual op {name!r}")

    def round(self, a: TritonValue) -> TritonValue:
        return self.value(f"libm.nearbyint({a})", a.dtype)

    def rsqrt(self, a: TritonValue) -> TritonValue:
        if a.dtype == torch.float32:
            return self.value(f"tl.rsqrt({a})", a.dtype)
        return self.value(f"(1 / tl.sqrt({a}))", a.dtype)

    def neg(self, a: TritonValue) -> TritonValue:
        return self.value(f"(-{a})", a.dtype)

    def abs(self, a: TritonValue) -> TritonValue:
        if a.dtype == torch.bool:
            return a
        return self.value(f"tl.abs({a})", a.dtype)

    def sigmoid(self, a: TritonValue) -> TritonValue:
        return self.value(f"(1 / (1 + tl.exp(-{a})))", a.dtype)

    def relu(self, a: TritonValue) -> TritonValue:
        if a.dtype == torch.bool:
            return a
        zero = self.constant(0, a.dtype)
        return self.value(f"tl.where({a} < 0, {zero}, {a})", a.dtype)

    def reciprocal(self, a: TritonValue) -> TritonValue:
        return self.value(f"(1 / {a})", a.dtype)

    def sign(self, a: TritonValue) -> TritonValue:
        if a.dtype == torch.bool:
            return a
        expr = f"(({a} > 0).to({tl_type(a.dtype)}) - ({a} < 0).to({tl_type(a.dtype)}))"
        if a.dtype.is_floating_point:  # sign(NaN) is NaN
            expr = f"tl.where({a} != {a}, {a}, {expr})"
        return self.value(expr, a.dtype)

    def square(self, a: TritonValue) -> TritonValue:
        return self._bin(a, a, "&" if a.dtype == torch.bool else "*")

    def frac(self, a: TritonValue) -> TritonValue:
        return self.value(f"({a} - libm.trunc({a}))", a.dtype)

    def isnan(self, a: TritonValue) -> TritonValue:
        return self.value(f"({a} != {a})", torch.bool)

    def isinf(self, a: TritonValue) -> TritonValue:
        if not a.dtype.is_floating_point:
            return self.value(f"({a} != {a})", torch.bool)
        return self.value(f"libm.isinf({a})", torch.bool)

    def signbit(self, a: TritonValue) -> TritonValue:
        if not a.dtype.is_floating_point:
            return self.value(f"({a} < 0)", torch.bool)
        bits = {torch.float64: "tl.int64", torch.float32: "tl.int32"}.get(a.dtype, "tl.int16")
        return self.value(f"({a}.to({bits}, bitcast=True) < 0)", torch.bool)
