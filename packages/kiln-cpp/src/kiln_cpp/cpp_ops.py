"""CppOpsHandler: the virtual ops of kiln_inductor.ir.ops, emitted as C++ statements.

The language-independent half (values and their common subexpression elimination, the
shape of each op, index printing) is kiln_inductor.codegen's; this module spells it in
C++. Every value is a ``CppValue`` (a C++ variable and the logical dtype it holds).
bfloat16 and float16 values are held in ``float`` and rounded when converted to them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from kiln_inductor.codegen.index_printer import IndexPrinter
from kiln_inductor.codegen.ops_handler import KernelValue, OpsHandler, bool_identity
from kiln_inductor.index_check import check_number

from .prelude import SIMD_MATH_BINARY

CTYPES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.bfloat16: "float",
    torch.float16: "float",
    torch.int64: "int64_t",
    torch.int32: "int32_t",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.bool: "bool",
}
# bool tensors are passed as uint8_t: GCC does not vectorize a loop that loads through a
# bool pointer (GPT-2's masked softmax stayed scalar, libm expf and all); values stay bool
STORAGE_TYPES = {
    **CTYPES,
    torch.bfloat16: "uint16_t",
    torch.float16: "uint16_t",
    torch.bool: "uint8_t",
}


def ctype(dtype: torch.dtype) -> str:
    if dtype not in CTYPES:
        raise NotImplementedError(f"dtype {dtype} is not supported by kiln-cpp kernels")
    return CTYPES[dtype]


class CppIndexPrinter(IndexPrinter):
    """Indices as C++ int64 expressions: ``12L``, ``/`` and ``%``, ``kiln::max<int64_t>``."""

    TARGET = "as C++"
    FLOORDIV = "/"
    MAX, MIN = "kiln::max<int64_t>", "kiln::min<int64_t>"

    def integer(self, value: int) -> str:
        return f"{value}L"


_INDEX = CppIndexPrinter()


def print_index(expr: Any) -> str:
    """A sympy index expression as a C++ int64 expression."""
    return _INDEX.print(expr)


CppValue = KernelValue  # a C++ variable and the logical dtype it holds


def literal(value: Any, dtype: torch.dtype) -> str:
    return CppOpsHandler.literal(value, dtype)


_UNARY_FLOAT = {
    "exp": "exp",
    "exp2": "exp2",
    "expm1": "expm1",
    "log": "log",
    "log2": "log2",
    "log10": "log10",
    "log1p": "log1p",
    "sqrt": "sqrt",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "tanh": "tanh",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
    "erf": "erf",
    "erfc": "erfc",
    "lgamma": "lgamma",
    "floor": "floor",
    "ceil": "ceil",
    "trunc": "trunc",
    "round": "nearbyint",
}
# in kiln:: (the prelude) for every dtype: exact results GCC still vectorizes
_KILN_UNARY = ("floor", "ceil", "trunc", "round", "sqrt")


class CppOpsHandler(OpsHandler):
    PACKAGE, LANGUAGE = "kiln-cpp", "C++"
    INDEX = _INDEX
    TRUNC = "kiln::trunc"
    UNARY_MATH = _UNARY_FLOAT
    BINARY_MATH = ("atan2", "hypot", "copysign")

    def __init__(
        self, pointer_of: Callable[[str], tuple[str, torch.dtype]], emit: Callable[[str], None]
    ):
        super().__init__(emit)
        self.pointer_of = pointer_of  # buffer name -> (C++ pointer, dtype)
        self.forwarded: dict[tuple[str, str], CppValue] = {}  # (buffer, index) -> stored value
        self.checks: list[Any] = []  # the kernel's index checks (kiln_inductor.index_check)

    # -- spellings (kiln_inductor.codegen.ops_handler) -----------------------------------------
    def declare(self, name: str, expr: str, dtype: torch.dtype) -> str:
        return f"const {ctype(dtype)} {name} = {expr};"

    def typed(self, expr: str, dtype: torch.dtype) -> str:
        return f"static_cast<{ctype(dtype)}>({expr})"

    def select(self, cond: Any, a: Any, b: Any) -> str:
        return f"({cond} ? {a} : {b})"

    def cast(self, x: CppValue, dtype: torch.dtype) -> str:
        if dtype == torch.bfloat16:
            return f"kiln_round_bf16(static_cast<float>({x}))"
        if dtype == torch.float16:
            return f"kiln_round_f16(static_cast<float>({x}))"
        return f"static_cast<{ctype(dtype)}>({x})"

    @classmethod
    def float_literal(cls, value: float, dtype: torch.dtype) -> str:
        t = ctype(dtype)
        if math.isnan(value):
            return f"kiln::nan<{t}>()"
        if math.isinf(value):
            return ("-" if value < 0 else "") + f"kiln::inf<{t}>()"
        text = repr(value)
        return f"{text}f" if t == "float" else text

    @classmethod
    def int_literal(cls, value: int, dtype: torch.dtype) -> str:
        return f"static_cast<{ctype(dtype)}>({value}LL)"

    def math_function(self, name: str, dtype: torch.dtype) -> str:
        single = ctype(dtype) == "float"
        if name == "copysign":
            return "kiln::copysign"
        if name in self.BINARY_MATH:  # the double version is declared in the prelude
            return name + ("f" if single and name + "f" in SIMD_MATH_BINARY else "")
        fname = _UNARY_FLOAT[name]
        if name in _KILN_UNARY or (name == "lgamma" and not single):
            return f"kiln::{fname}"
        if single:
            return "kiln_expf" if name == "exp" else f"{fname}f"  # kiln_expf: see the prelude
        return fname

    def out_of_bounds(self, index: CppValue, size: str) -> str:
        # one unsigned compare covers both ends
        return f"(static_cast<uint64_t>({index}) >= static_cast<uint64_t>({size}))"

    def emit_index_fail(self, bad: CppValue, raw: CppValue, index: CppValue, code: int) -> None:
        # a bad lane records itself (a cold call, kiln_index_fail in the prelude) and reads
        # element 0 (index_check.py)
        self.emit(f"if (__builtin_expect({bad}, 0)) kiln_index_fail(&kiln_err, {code}L, {raw});")

    def check_code(self, check: Any) -> int:
        return check_number(self.checks, check)

    # -- memory ------------------------------------------------------------------------------
    def load(self, name: str, index: Any) -> CppValue:
        idx = print_index(index)
        if (name, idx) in self.forwarded:
            return self.forwarded[(name, idx)]
        ptr, dtype = self.pointer_of(name)
        if dtype == torch.bfloat16:
            return self._value(f"kiln_bf16_to_f32({ptr}[{idx}])", dtype)
        if dtype == torch.float16:
            return self._value(f"kiln_f16_to_f32({ptr}[{idx}])", dtype)
        return self._value(f"{ptr}[{idx}]", dtype)

    def store_expr(self, value: CppValue, dtype: torch.dtype) -> str:
        v = self.to_dtype(value, dtype)
        if dtype == torch.bfloat16:
            return f"kiln_f32_to_bf16({v})"
        if dtype == torch.float16:
            return f"kiln_f32_to_f16({v})"
        return str(v)

    def constant(self, value: Any, dtype: torch.dtype) -> CppValue:
        return self._value(literal(value, dtype), dtype)

    def index_expr(self, expr: Any, dtype: torch.dtype) -> CppValue:
        return self._value(f"static_cast<{ctype(dtype)}>({print_index(expr)})", dtype)

    def masked(self, mask: CppValue, body: Callable[[], CppValue], other: Any) -> CppValue:
        saved_cache, saved_emit = dict(self.cache), self.emit
        inner: list[str] = []
        self.emit = inner.append
        try:
            result = body()
        finally:
            self.emit, self.cache = saved_emit, saved_cache
        name = self.fresh()
        self.emit(f"{ctype(result.dtype)} {name} = {literal(other, result.dtype)};")
        self.emit(f"if ({mask}) {{")
        for line in inner:
            self.emit("  " + line)
        self.emit(f"  {name} = {result};")
        self.emit("}")
        return CppValue(name, result.dtype)

    # -- arithmetic (the infix ops and comparisons: OpsHandler) --------------------------------
    def mul(self, a: CppValue, b: CppValue) -> CppValue:
        if a.dtype == torch.bool:
            return self._value(f"({a} && {b})", torch.bool)
        return self._bin(a, b, "*")

    def floordiv(self, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"kiln_floordiv<{ctype(a.dtype)}>({a}, {b})", a.dtype)

    def remainder(self, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"kiln_remainder<{ctype(a.dtype)}>({a}, {b})", a.dtype)

    def fmod(self, a: CppValue, b: CppValue) -> CppValue:
        if a.dtype.is_floating_point:
            return self._value(f"kiln::fmod({a}, {b})", a.dtype)
        return self._bin(a, b, "%")

    def pow(self, a: CppValue, b: CppValue) -> CppValue:
        if a.dtype.is_floating_point:
            f = "powf" if ctype(a.dtype) == "float" else "pow"
            return self._value(f"{f}({a}, {b})", a.dtype)
        return self._value(f"kiln_ipow<{ctype(a.dtype)}>({a}, {b})", a.dtype)

    def maximum(self, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"kiln_max<{ctype(a.dtype)}>({a}, {b})", a.dtype)

    def minimum(self, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"kiln_min<{ctype(a.dtype)}>({a}, {b})", a.dtype)

    def logical_not(self, a: CppValue) -> CppValue:
        return self._value(f"(!{a})", torch.bool)

    # -- unary (the math functions: math_function) -------------------------------------------
    @bool_identity
    def abs(self, a: CppValue) -> CppValue:
        if a.dtype.is_floating_point:
            return self._value(f"kiln::fabs({a})", a.dtype)
        return self._value(f"static_cast<{ctype(a.dtype)}>({a} < 0 ? -{a} : {a})", a.dtype)

    def sigmoid(self, a: CppValue) -> CppValue:
        one = literal(1, a.dtype)
        e = self.exp(self.neg(a))
        return self._value(f"({one} / ({one} + {e}))", a.dtype)

    @bool_identity
    def sign(self, a: CppValue) -> CppValue:
        return self._value(f"kiln_sign<{ctype(a.dtype)}>({a})", a.dtype)

    def isnan(self, a: CppValue) -> CppValue:
        return self._value(f"kiln_isnan({a})", torch.bool)

    def isinf(self, a: CppValue) -> CppValue:
        return self._value(f"kiln::isinf({a})", torch.bool)

    def signbit(self, a: CppValue) -> CppValue:
        # signbit makes GCC 12 crash when vectorized (an internal compiler error)
        return self._value(f"(kiln::copysign({literal(1, a.dtype)}, {a}) < 0)", torch.bool)
