"""CppOpsHandler: the virtual ops of kiln_inductor.ir.ops, emitted as C++ statements.

Every value is a ``CppValue`` (a C++ variable and the logical dtype it holds); equal
expressions are emitted once per scope (common subexpression elimination). bfloat16 and
float16 values are held in ``float`` and rounded when converted to them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from kiln_inductor.index_check import check_number
from kiln_inductor.ir.symbols import FloorDiv, ModIndex

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


def print_index(expr: Any) -> str:
    """A sympy index expression as a C++ int64 expression."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return f"{int(expr)}L"
    if expr.is_Symbol:
        return expr.name
    if isinstance(expr, sympy.Add):
        terms = sorted(expr.args, key=lambda t: (t.is_number, str(t)))
        return "(" + " + ".join(print_index(t) for t in terms) + ")"
    if isinstance(expr, sympy.Mul):
        return "(" + " * ".join(print_index(t) for t in expr.args) + ")"
    if isinstance(expr, FloorDiv):
        return f"({print_index(expr.args[0])} / {print_index(expr.args[1])})"
    if isinstance(expr, ModIndex):
        return f"({print_index(expr.args[0])} % {print_index(expr.args[1])})"
    if isinstance(expr, sympy.Max):
        out = print_index(expr.args[0])
        for a in expr.args[1:]:
            out = f"kiln::max<int64_t>({out}, {print_index(a)})"
        return out
    if isinstance(expr, sympy.Min):
        out = print_index(expr.args[0])
        for a in expr.args[1:]:
            out = f"kiln::min<int64_t>({out}, {print_index(a)})"
        return out
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        return "(" + " * ".join([print_index(expr.base)] * int(expr.exp)) + ")"
    raise NotImplementedError(f"cannot print index {expr} ({type(expr).__name__}) as C++")


@dataclass(frozen=True)
class CppValue:
    name: str
    dtype: torch.dtype

    def __str__(self) -> str:
        return self.name


def literal(value: Any, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        t = ctype(dtype)
        v = float(value)
        if math.isnan(v):
            return f"kiln::nan<{t}>()"
        if math.isinf(v):
            return ("-" if v < 0 else "") + f"kiln::inf<{t}>()"
        text = repr(v)
        return f"{text}f" if t == "float" else text
    return f"static_cast<{ctype(dtype)}>({int(value)}LL)"


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


class CppOpsHandler:
    def __init__(
        self, pointer_of: Callable[[str], tuple[str, torch.dtype]], emit: Callable[[str], None]
    ):
        self.pointer_of = pointer_of  # buffer name -> (C++ pointer, dtype)
        self.emit = emit
        self.cache: dict[str, CppValue] = {}
        self.forwarded: dict[tuple[str, str], CppValue] = {}  # (buffer, index) -> stored value
        self.count = 0
        self.checks: list[Any] = []  # the kernel's index checks (kiln_inductor.index_check)
        self.defs: dict[str, str] = {}  # value name -> the expression it was defined by

    def fresh(self, prefix: str = "tmp") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def _value(self, expr: str, dtype: torch.dtype) -> CppValue:
        key = f"{dtype}:{expr}"
        if key in self.cache:
            return self.cache[key]
        name = self.fresh()
        self.emit(f"const {ctype(dtype)} {name} = {expr};")
        v = CppValue(name, dtype)
        self.cache[key] = v
        self.defs[name] = expr
        return v

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

    def indirect_indexing(self, value: CppValue, size: Any, check: Any = None) -> sympy.Symbol:
        size_s = print_index(size)
        v = self._value(f"static_cast<int64_t>({value})", torch.int64)
        wrap = check is None or check.wrap
        w = self._value(f"({v} < 0 ? {v} + {size_s} : {v})", torch.int64) if wrap else v
        if check is None:
            return sympy.Symbol(w.name, integer=True, nonnegative=True)
        # one unsigned compare covers both ends; a bad lane records itself (a cold call,
        # kiln_index_fail in the prelude) and reads element 0 (index_check.py)
        bad = self._value(
            f"(static_cast<uint64_t>({w}) >= static_cast<uint64_t>({size_s}))", torch.bool
        )
        if f"check:{bad}" not in self.cache:
            self.cache[f"check:{bad}"] = bad
            code = self.check_code(check)
            self.emit(f"if (__builtin_expect({bad}, 0)) kiln_index_fail(&kiln_err, {code}L, {v});")
        ok = self._value(f"({bad} ? 0L : {w})", torch.int64)
        return sympy.Symbol(ok.name, integer=True, nonnegative=True)

    def check_code(self, check: Any) -> int:
        return check_number(self.checks, check)

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

    # -- conversions -------------------------------------------------------------------------
    def to_dtype(self, x: CppValue, dtype: torch.dtype, src_dtype: Any = None) -> CppValue:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._value(f"({x} != 0)", dtype)
        if dtype == torch.bfloat16:
            return self._value(f"kiln_round_bf16(static_cast<float>({x}))", dtype)
        if dtype == torch.float16:
            return self._value(f"kiln_round_f16(static_cast<float>({x}))", dtype)
        return self._value(f"static_cast<{ctype(dtype)}>({x})", dtype)

    # -- arithmetic --------------------------------------------------------------------------
    def _bin(self, a: CppValue, b: CppValue, op: str) -> CppValue:
        return self._value(f"static_cast<{ctype(a.dtype)}>({a} {op} {b})", a.dtype)

    def add(self, a: CppValue, b: CppValue) -> CppValue:
        return self._bin(a, b, "+")

    def sub(self, a: CppValue, b: CppValue) -> CppValue:
        return self._bin(a, b, "-")

    def mul(self, a: CppValue, b: CppValue) -> CppValue:
        if a.dtype == torch.bool:
            return self._value(f"({a} && {b})", torch.bool)
        return self._bin(a, b, "*")

    def truediv(self, a: CppValue, b: CppValue) -> CppValue:
        return self._bin(a, b, "/")

    def floordiv(self, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"kiln_floordiv<{ctype(a.dtype)}>({a}, {b})", a.dtype)

    def truncdiv(self, a: CppValue, b: CppValue) -> CppValue:
        if a.dtype.is_floating_point:
            return self._value(f"kiln::trunc({a} / {b})", a.dtype)
        return self._bin(a, b, "/")

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

    def _fbin(self, name: str, a: CppValue, b: CppValue) -> CppValue:
        f = name + ("f" if ctype(a.dtype) == "float" and name + "f" in SIMD_MATH_BINARY else "")
        if f == name:
            f = name  # the double version, declared in the prelude
        return self._value(f"{f}({a}, {b})", a.dtype)

    def atan2(self, a: CppValue, b: CppValue) -> CppValue:
        return self._fbin("atan2", a, b)

    def hypot(self, a: CppValue, b: CppValue) -> CppValue:
        return self._fbin("hypot", a, b)

    def copysign(self, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"kiln::copysign({a}, {b})", a.dtype)

    def _cmp(self, a: CppValue, b: CppValue, op: str) -> CppValue:
        return self._value(f"({a} {op} {b})", torch.bool)

    def eq(self, a, b):
        return self._cmp(a, b, "==")

    def ne(self, a, b):
        return self._cmp(a, b, "!=")

    def lt(self, a, b):
        return self._cmp(a, b, "<")

    def le(self, a, b):
        return self._cmp(a, b, "<=")

    def gt(self, a, b):
        return self._cmp(a, b, ">")

    def ge(self, a, b):
        return self._cmp(a, b, ">=")

    def logical_and(self, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"({a} && {b})", torch.bool)

    def logical_or(self, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"({a} || {b})", torch.bool)

    def logical_xor(self, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"({a} != {b})", torch.bool)

    def logical_not(self, a: CppValue) -> CppValue:
        return self._value(f"(!{a})", torch.bool)

    def bitwise_and(self, a: CppValue, b: CppValue) -> CppValue:
        return self._bin(a, b, "&")

    def bitwise_or(self, a: CppValue, b: CppValue) -> CppValue:
        return self._bin(a, b, "|")

    def bitwise_xor(self, a: CppValue, b: CppValue) -> CppValue:
        return self._bin(a, b, "^")

    def bitwise_left_shift(self, a: CppValue, b: CppValue) -> CppValue:
        return self._bin(a, b, "<<")

    def bitwise_right_shift(self, a: CppValue, b: CppValue) -> CppValue:
        return self._bin(a, b, ">>")

    def bitwise_not(self, a: CppValue) -> CppValue:
        return self._value(f"static_cast<{ctype(a.dtype)}>(~{a})", a.dtype)

    def where(self, c: CppValue, a: CppValue, b: CppValue) -> CppValue:
        return self._value(f"({c} ? {a} : {b})", a.dtype)

    # -- unary -------------------------------------------------------------------------------
    def _math(self, name: str, a: CppValue) -> CppValue:
        fname = _UNARY_FLOAT[name]
        if ctype(a.dtype) == "float":
            if name in ("floor", "ceil", "trunc", "round"):
                return self._value(f"kiln::{fname}({a})", a.dtype)
            if name == "exp":
                return self._value(f"kiln_expf({a})", a.dtype)  # inlined: see the prelude
            return self._value(f"{fname}f({a})", a.dtype)
        if name in ("floor", "ceil", "trunc", "round", "lgamma"):
            return self._value(f"kiln::{fname}({a})", a.dtype)
        return self._value(f"{fname}({a})", a.dtype)

    def __getattr__(self, name: str) -> Any:
        if name in _UNARY_FLOAT:
            return lambda a: self._math(name, a)
        raise AttributeError(f"kiln-cpp has no C++ for virtual op {name!r}")

    def sqrt(self, a: CppValue) -> CppValue:
        return self._value(f"kiln::sqrt({a})", a.dtype)

    def rsqrt(self, a: CppValue) -> CppValue:
        one = literal(1, a.dtype)
        return self._value(f"({one} / kiln::sqrt({a}))", a.dtype)

    def neg(self, a: CppValue) -> CppValue:
        return self._value(f"static_cast<{ctype(a.dtype)}>(-{a})", a.dtype)

    def abs(self, a: CppValue) -> CppValue:
        if a.dtype == torch.bool:
            return a
        if a.dtype.is_floating_point:
            return self._value(f"kiln::fabs({a})", a.dtype)
        return self._value(f"static_cast<{ctype(a.dtype)}>({a} < 0 ? -{a} : {a})", a.dtype)

    def sigmoid(self, a: CppValue) -> CppValue:
        one = literal(1, a.dtype)
        e = self.exp(self.neg(a))
        return self._value(f"({one} / ({one} + {e}))", a.dtype)

    def relu(self, a: CppValue) -> CppValue:
        if a.dtype == torch.bool:
            return a
        return self._value(f"({a} < 0 ? {literal(0, a.dtype)} : {a})", a.dtype)

    def reciprocal(self, a: CppValue) -> CppValue:
        return self._value(f"({literal(1, a.dtype)} / {a})", a.dtype)

    def sign(self, a: CppValue) -> CppValue:
        if a.dtype == torch.bool:
            return a
        return self._value(f"kiln_sign<{ctype(a.dtype)}>({a})", a.dtype)

    def square(self, a: CppValue) -> CppValue:
        return self._bin(a, a, "*")

    def frac(self, a: CppValue) -> CppValue:
        return self._value(f"({a} - kiln::trunc({a}))", a.dtype)

    def isnan(self, a: CppValue) -> CppValue:
        return self._value(f"kiln_isnan({a})", torch.bool)

    def isinf(self, a: CppValue) -> CppValue:
        return self._value(f"kiln::isinf({a})", torch.bool)

    def signbit(self, a: CppValue) -> CppValue:
        # signbit makes GCC 12 crash when vectorized (an internal compiler error)
        return self._value(f"(kiln::copysign({literal(1, a.dtype)}, {a}) < 0)", torch.bool)
