"""TritonOpsHandler: the virtual ops of kiln_inductor.ir.ops, emitted as Triton statements.

Every value is a ``TritonValue`` (a kernel variable and the logical dtype it holds); equal
expressions are emitted once per scope (common subexpression elimination). Values keep
their dtype: a bfloat16 load stays bfloat16 until the body converts it (kiln-inductor's
lowerings compute low-precision floats in float32, as eager does). Memory access is the
kernel's business: ``load`` asks ``kernel.load_expr`` for the pointer and mask. The
language-independent half (values, the shape of each op, index printing) is
kiln_inductor.codegen's; this module spells it in Triton.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sympy
import torch

from kiln_inductor.codegen.ops_handler import KernelValue, OpsHandler, bool_identity, infix

from ..errors import TritonCodegenError
from .index import TritonIndexPrinter

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


TritonValue = KernelValue  # a kernel variable and the logical dtype it holds


def literal(value: Any, dtype: torch.dtype) -> str:
    """A Python literal for ``value`` of ``dtype`` (used inside tl.full and tl.where)."""
    return TritonOpsHandler.literal(value, dtype)


# unary ops with a tl builtin (name in tl) for float32/float64
_TL_UNARY = {"exp": "tl.exp", "exp2": "tl.exp2", "log": "tl.log", "log2": "tl.log2",
             "sin": "tl.sin", "cos": "tl.cos", "floor": "tl.floor", "ceil": "tl.ceil",
             "erf": "tl.erf", "sqrt": "tl.sqrt"}  # fmt: skip
# binary float ops through kiln_triton.runtime.libm
_LIBM_BINARY = {"atan2", "hypot", "copysign"}
# unary ops through kiln_triton.runtime.libm (libdevice on GPUs)
_LIBM_UNARY = {"expm1", "log1p", "log10", "tan", "asin", "acos", "atan", "sinh", "cosh",
               "tanh", "asinh", "acosh", "atanh", "erfc", "lgamma", "trunc"}  # fmt: skip
_MATH = {
    **_TL_UNARY,
    **{name: f"libm.{name}" for name in _LIBM_UNARY | _LIBM_BINARY},
    "round": "libm.nearbyint",
}


class TritonOpsHandler(OpsHandler):
    PACKAGE, LANGUAGE = "kiln-triton", "Triton"
    INDEX = TritonIndexPrinter()
    TRUE, FALSE = "1", "0"
    TRUNC = "libm.trunc"
    INT_DIV = "//"
    AND, OR, XOR = "&", "|", "^"
    UNARY_MATH = frozenset(_MATH) - _LIBM_BINARY
    BINARY_MATH = _LIBM_BINARY

    def __init__(self, kernel: TritonKernel, emit: Callable[[str], None]):
        super().__init__(emit)
        self.kernel = kernel

    # -- spellings (kiln_inductor.codegen.ops_handler) -----------------------------------------
    def declare(self, name: str, expr: str, dtype: torch.dtype) -> str:
        return f"{name} = {expr}"

    def select(self, cond: Any, a: Any, b: Any) -> str:
        return f"tl.where({cond}, {a}, {b})"

    def cast(self, x: TritonValue, dtype: torch.dtype) -> str:
        return f"{x}.to({tl_type(dtype)})"

    @classmethod
    def float_literal(cls, value: float, dtype: torch.dtype) -> str:
        if math.isnan(value) or math.isinf(value):
            return f"float('{value}')"
        return repr(value)

    def one(self, dtype: torch.dtype) -> str:
        return "1"  # a Python int takes the other operand's type

    def zero(self, dtype: torch.dtype) -> str:
        return str(self.constant(0, dtype))  # typed: tl.where's branches must agree

    def truth(self, a: TritonValue) -> TritonValue:
        return a if a.dtype == torch.bool else self._value(f"({a} != 0)", torch.bool)

    def math_function(self, name: str, dtype: torch.dtype) -> str:
        return _MATH[name]

    def out_of_bounds(self, index: TritonValue, size: str) -> str:
        live = self.kernel.mask_text()
        return f"(({index} < 0) | ({index} >= {size})) & {live}"

    def emit_index_fail(
        self, bad: TritonValue, raw: TritonValue, index: TritonValue, code: int
    ) -> None:
        # a live lane out of range writes [check number, index] into the kernel's error row
        # (its last argument) and reads element 0 (kiln_inductor.index_check)
        zero = f"({index} * 0)"
        self.emit(f"tl.atomic_max(index_err + {zero}, {zero} + {code}, mask={bad})")
        self.emit(f"tl.atomic_max(index_err + 1 + {zero}, {raw}, mask={bad})")

    def check_code(self, check: Any) -> int:
        return self.kernel.check_code(check)

    # -- memory and indices ------------------------------------------------------------------
    def load(self, name: str, index: Any) -> TritonValue:
        found = self.kernel.forwarded(name, index)
        if found is not None:
            return found
        ptr, mask, dtype = self.kernel.load_expr(name, index)
        return self._value(f"tl.load({ptr}, {mask}, other=0)", dtype)

    def constant(self, value: Any, dtype: torch.dtype) -> TritonValue:
        return self._value(f"tl.full([], {literal(value, dtype)}, {tl_type(dtype)})", dtype)

    def index_expr(self, expr: Any, dtype: torch.dtype) -> TritonValue:
        expr = sympy.expand(sympy.sympify(expr))
        if expr.is_Integer:
            return self.constant(int(expr), dtype)
        text = self.kernel.index_text(expr)
        return self._value(f"({text}).to({tl_type(dtype)})", dtype)

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
        return self._value(f"tl.where({mask}, {result}, {fill})", result.dtype)

    # -- arithmetic (the other infix ops and comparisons: OpsHandler) --------------------------
    fmod = infix("%")

    def add(self, a: TritonValue, b: TritonValue) -> TritonValue:
        return self._bin(a, b, "|" if a.dtype == torch.bool else "+")

    def mul(self, a: TritonValue, b: TritonValue) -> TritonValue:
        return self._bin(a, b, "&" if a.dtype == torch.bool else "*")

    def floordiv(self, a: TritonValue, b: TritonValue) -> TritonValue:
        if a.dtype.is_floating_point:
            return self._value(f"tl.floor({a} / {b})", a.dtype)
        return self._value(f"libm.floordiv_int({a}, {b})", a.dtype)

    def remainder(self, a: TritonValue, b: TritonValue) -> TritonValue:
        kind = "float" if a.dtype.is_floating_point else "int"
        return self._value(f"libm.remainder_{kind}({a}, {b})", a.dtype)

    def pow(self, a: TritonValue, b: TritonValue) -> TritonValue:
        if a.dtype.is_floating_point:
            return self._value(f"libm.pow({a}, {b})", a.dtype)
        return self._value(f"libm.ipow({a}, {b})", a.dtype)

    def maximum(self, a: TritonValue, b: TritonValue) -> TritonValue:
        return self._extremum(a, b, "max", "|")

    def minimum(self, a: TritonValue, b: TritonValue) -> TritonValue:
        return self._extremum(a, b, "min", "&")

    def _extremum(self, a: TritonValue, b: TritonValue, kind: str, bool_op: str) -> TritonValue:
        if a.dtype == torch.bool:
            return self._bin(a, b, bool_op)
        if a.dtype.is_floating_point:  # NaN wins, as in eager
            return self._value(f"libm.{kind}_nan({a}, {b})", a.dtype)
        return self._value(f"tl.{kind}imum({a}, {b})", a.dtype)

    def logical_not(self, a: TritonValue) -> TritonValue:
        return self._value(f"({a} == 0)", torch.bool)

    def bitwise_not(self, a: TritonValue) -> TritonValue:
        if a.dtype == torch.bool:
            return self._value(f"({a} == 0)", torch.bool)
        return super().bitwise_not(a)

    # -- unary (the math functions: _MATH) -----------------------------------------------------
    def rsqrt(self, a: TritonValue) -> TritonValue:
        if a.dtype == torch.float32:
            return self._value(f"tl.rsqrt({a})", a.dtype)
        return super().rsqrt(a)

    @bool_identity
    def abs(self, a: TritonValue) -> TritonValue:
        return self._value(f"tl.abs({a})", a.dtype)

    def sigmoid(self, a: TritonValue) -> TritonValue:
        return self._value(f"(1 / (1 + tl.exp(-{a})))", a.dtype)

    @bool_identity
    def sign(self, a: TritonValue) -> TritonValue:
        expr = f"(({a} > 0).to({tl_type(a.dtype)}) - ({a} < 0).to({tl_type(a.dtype)}))"
        if a.dtype.is_floating_point:  # sign(NaN) is NaN
            expr = f"tl.where({a} != {a}, {a}, {expr})"
        return self._value(expr, a.dtype)

    def isnan(self, a: TritonValue) -> TritonValue:
        return self._value(f"({a} != {a})", torch.bool)

    def isinf(self, a: TritonValue) -> TritonValue:
        if not a.dtype.is_floating_point:
            return self._value(f"({a} != {a})", torch.bool)
        return self._value(f"libm.isinf({a})", torch.bool)

    def signbit(self, a: TritonValue) -> TritonValue:
        if not a.dtype.is_floating_point:
            return self._value(f"({a} < 0)", torch.bool)
        bits = {torch.float64: "tl.int64", torch.float32: "tl.int32"}.get(a.dtype, "tl.int16")
        return self._value(f"({a}.to({bits}, bitcast=True) < 0)", torch.bool)
