"""OpsHandler: the language-independent half of a kernel backend's ops handler.

A backend runs IR bodies (``ir/ops.py``) under a handler that writes kernel statements.
What does not depend on the language lives here, once:

* **values**: every op returns a ``KernelValue`` (a kernel variable and the logical dtype
  it holds); ``_value(expr, dtype)`` names an expression and emits its definition, once per
  scope: equal expressions of equal dtype are one variable (common subexpression
  elimination, keyed by dtype and text; ``cache`` is what a scope saves and restores).
  ``defs`` maps each name to the expression that defined it.
* **the shape of each op**: infix arithmetic and bitwise ops, comparisons, logical ops,
  ``where``, ``to_dtype``, truncating division, ``frac``, ``reciprocal``, ``rsqrt``,
  ``relu`` and the checked ``indirect_indexing`` are written once over the hooks below;
  the unary and binary math ops are calls of the function ``math_function`` names,
  dispatched by ``__getattr__``; ``infix``, ``compare`` and ``bool_identity`` build a
  language's own ops of those shapes.
* **literals**: ``literal(value, dtype)`` sorts a Python scalar by kind; the language
  spells each kind.

A language subclass supplies its spellings (``declare``, ``typed``, ``select``, ``cast``,
``float_literal``, ``int_literal``, ``one``, ``zero``, ``truth``, ``math_function``, the
index-check hooks, and the class attributes) and the ops whose code differs in more than
spelling (``load``, ``constant``, ``index_expr``, ``masked``, ``maximum``, ``pow``...).
Method names are the virtual ops'. kiln-cpp's ``CppOpsHandler`` and kiln-triton's
``TritonOpsHandler`` are the two languages; their code is what they wrote before this
skeleton existed, byte for byte (but for kiln-cpp's ``square`` of a bool, now its ``mul``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from .index_printer import IndexPrinter


@dataclass(frozen=True)
class KernelValue:
    """A variable of the generated kernel and the logical dtype of what it holds."""

    name: str
    dtype: torch.dtype

    def __str__(self) -> str:
        return self.name


def infix(op: str) -> Callable[..., KernelValue]:
    """The op ``a <op> b``, of ``a``'s dtype (see ``OpsHandler._bin``)."""

    def method(self: OpsHandler, a: KernelValue, b: KernelValue) -> KernelValue:
        return self._bin(a, b, op)

    return method


def bool_identity(op: Callable[..., KernelValue]) -> Callable[..., KernelValue]:
    """Decorates a unary op that is the identity on bool values (``abs``, ``relu``, ``sign``)."""

    @functools.wraps(op)
    def method(self: OpsHandler, a: KernelValue) -> KernelValue:
        return a if a.dtype == torch.bool else op(self, a)

    return method


def compare(op: str) -> Callable[..., KernelValue]:
    """The comparison ``a <op> b``, a bool."""

    def method(self: OpsHandler, a: KernelValue, b: KernelValue) -> KernelValue:
        return self._value(f"({a} {op} {b})", torch.bool)

    return method


class OpsHandler:
    """The skeleton of an ops handler; see the module docstring for what a language adds."""

    PACKAGE = "kiln"  # who says so when an op has no spelling (the AttributeError)
    LANGUAGE = "source"
    INDEX: IndexPrinter = IndexPrinter()  # prints sizes and indices of this language
    TRUE, FALSE = "true", "false"  # the bool literals
    TRUNC = "trunc"  # the function that truncates a float toward zero
    INT_DIV = "/"  # the infix operator of truncating integer division
    AND, OR, XOR = "&&", "||", "!="  # the infix operators of truth values (see ``truth``)
    UNARY_MATH: Collection[str] = ()  # unary ops that are ``math_function(name)(a)``
    BINARY_MATH: Collection[str] = ()  # binary ops that are ``math_function(name)(a, b)``

    def __init__(self, emit: Callable[[str], None]):
        self.emit = emit
        self.cache: dict[str, KernelValue] = {}
        self.defs: dict[str, str] = {}  # value name -> the expression it was defined by
        self.count = 0
        # while a scatter computes its target, the names of the checked indices' "out of
        # range" flags: its lanes with a bad index write nothing (see ``indirect_indexing``)
        self.bad_lanes: list[str] | None = None

    # -- language hooks ----------------------------------------------------------------------
    def declare(self, name: str, expr: str, dtype: torch.dtype) -> str:
        """The statement defining the variable ``name`` of ``dtype`` as ``expr``."""
        raise NotImplementedError

    def typed(self, expr: str, dtype: torch.dtype) -> str:
        """The arithmetic ``expr`` (operands of ``dtype``) as a value of ``dtype``."""
        return f"({expr})"

    def select(self, cond: Any, a: Any, b: Any) -> str:
        """``a`` where ``cond`` holds, else ``b``."""
        raise NotImplementedError

    def cast(self, x: KernelValue, dtype: torch.dtype) -> str:
        """``x`` converted to ``dtype`` (not bool: ``to_dtype`` compares with 0)."""
        raise NotImplementedError

    def one(self, dtype: torch.dtype) -> str:
        """1 as the other operand of an arithmetic op on ``dtype``."""
        return self.literal(1, dtype)

    def zero(self, dtype: torch.dtype) -> str:
        """0 as a branch of a ``select`` whose other branch is of ``dtype``."""
        return self.literal(0, dtype)

    def truth(self, a: KernelValue) -> KernelValue:
        """``a`` as an operand of ``AND``/``OR``/``XOR`` (a language where they are bitwise
        converts non-bool values)."""
        return a

    def math_function(self, name: str, dtype: torch.dtype) -> str:
        """The function computing the math op ``name`` on values of ``dtype``."""
        raise NotImplementedError

    @classmethod
    def float_literal(cls, value: float, dtype: torch.dtype) -> str:
        raise NotImplementedError

    @classmethod
    def int_literal(cls, value: int, dtype: torch.dtype) -> str:
        return str(value)

    def out_of_bounds(self, index: KernelValue, size: str) -> str:
        """The condition of a live lane whose ``index`` is outside ``[0, size)``."""
        raise NotImplementedError

    def emit_index_fail(
        self, bad: KernelValue, raw: KernelValue, index: KernelValue, code: int
    ) -> None:
        """Emit the report of check number ``code`` failing where ``bad`` holds
        (``raw``: the index as given, ``index``: after wrapping)."""
        raise NotImplementedError

    def check_code(self, check: Any) -> int:
        """The number of ``check`` (an ``index_check.IndexCheck``) in this kernel."""
        raise NotImplementedError

    # -- values ------------------------------------------------------------------------------
    def fresh(self, prefix: str = "tmp") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def _value(self, expr: str, dtype: torch.dtype) -> KernelValue:
        key = f"{dtype}:{expr}"
        if key in self.cache:
            return self.cache[key]
        name = self.fresh()
        self.emit(self.declare(name, expr, dtype))
        v = KernelValue(name, dtype)
        self.cache[key] = v
        self.defs[name] = expr
        return v

    def value(self, expr: str, dtype: torch.dtype) -> KernelValue:
        """``expr`` as a named value of ``dtype`` (for kernel code outside the ops)."""
        return self._value(expr, dtype)

    @classmethod
    def literal(cls, value: Any, dtype: torch.dtype) -> str:
        """``value`` as a literal of ``dtype``."""
        if dtype == torch.bool:
            return cls.TRUE if value else cls.FALSE
        if dtype.is_floating_point:
            return cls.float_literal(float(value), dtype)
        return cls.int_literal(int(value), dtype)

    # -- conversions and selection -----------------------------------------------------------
    def to_dtype(self, x: KernelValue, dtype: torch.dtype, src_dtype: Any = None) -> KernelValue:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._value(f"({x} != 0)", dtype)
        return self._value(self.cast(x, dtype), dtype)

    def where(self, c: KernelValue, a: KernelValue, b: KernelValue) -> KernelValue:
        return self._value(self.select(c, a, b), a.dtype)

    def indirect_indexing(self, value: KernelValue, size: Any, check: Any = None) -> sympy.Symbol:
        """``value`` as an index of a dimension of ``size``: negatives wrapped where
        ``check`` says (always without one); with ``check``, a lane out of range reports
        itself once per scope and reads element 0 (``kiln_inductor.index_check``); while
        ``bad_lanes`` is a list (a scatter's target), the lane's flag is added to it."""
        size_s = self.INDEX(size)
        v = self._value(self.cast(value, torch.int64), torch.int64)
        wrap = check is None or check.wrap
        w = self._value(self.select(f"{v} < 0", f"{v} + {size_s}", v), torch.int64) if wrap else v
        if check is None:
            return sympy.Symbol(w.name, integer=True, nonnegative=True)
        bad = self._value(self.out_of_bounds(w, size_s), torch.bool)
        if f"check:{bad}" not in self.cache:
            self.cache[f"check:{bad}"] = bad
            self.emit_index_fail(bad, v, w, self.check_code(check))
        if self.bad_lanes is not None:
            self.bad_lanes.append(bad.name)
        ok = self._value(self.select(bad, self.INDEX(0), w), torch.int64)
        return sympy.Symbol(ok.name, integer=True, nonnegative=True)

    def scatter_update(self, body: Any, index: Any) -> tuple[Any, Any, list[str]]:
        """A ``Scatter`` body's target and value at ``index`` (run under this handler), and
        the flags of its checked indices (true in a lane whose index is out of range:
        the backend writes nothing there)."""
        self.bad_lanes = []
        try:
            target, value = body.inner_fn(index)
            return target, value, list(dict.fromkeys(self.bad_lanes))
        finally:
            self.bad_lanes = None

    # -- arithmetic --------------------------------------------------------------------------
    def _bin(self, a: KernelValue, b: KernelValue, op: str) -> KernelValue:
        return self._value(self.typed(f"{a} {op} {b}", a.dtype), a.dtype)

    add = infix("+")
    sub = infix("-")
    mul = infix("*")
    truediv = infix("/")
    bitwise_and = infix("&")
    bitwise_or = infix("|")
    bitwise_xor = infix("^")
    bitwise_left_shift = infix("<<")
    bitwise_right_shift = infix(">>")

    eq = compare("==")
    ne = compare("!=")
    lt = compare("<")
    le = compare("<=")
    gt = compare(">")
    ge = compare(">=")

    def _logical(self, a: KernelValue, op: str, b: KernelValue) -> KernelValue:
        return self._value(f"({self.truth(a)} {op} {self.truth(b)})", torch.bool)

    def logical_and(self, a: KernelValue, b: KernelValue) -> KernelValue:
        return self._logical(a, self.AND, b)

    def logical_or(self, a: KernelValue, b: KernelValue) -> KernelValue:
        return self._logical(a, self.OR, b)

    def logical_xor(self, a: KernelValue, b: KernelValue) -> KernelValue:
        return self._logical(a, self.XOR, b)

    def truncdiv(self, a: KernelValue, b: KernelValue) -> KernelValue:
        if a.dtype.is_floating_point:
            return self._value(f"{self.TRUNC}({a} / {b})", a.dtype)
        return self._bin(a, b, self.INT_DIV)

    def square(self, a: KernelValue) -> KernelValue:
        return self.mul(a, a)

    def neg(self, a: KernelValue) -> KernelValue:
        return self._value(self.typed(f"-{a}", a.dtype), a.dtype)

    def bitwise_not(self, a: KernelValue) -> KernelValue:
        return self._value(self.typed(f"~{a}", a.dtype), a.dtype)

    def frac(self, a: KernelValue) -> KernelValue:
        return self._value(f"({a} - {self.TRUNC}({a}))", a.dtype)

    def reciprocal(self, a: KernelValue) -> KernelValue:
        return self._value(f"({self.one(a.dtype)} / {a})", a.dtype)

    def rsqrt(self, a: KernelValue) -> KernelValue:
        sqrt = self.math_function("sqrt", a.dtype)
        return self._value(f"({self.one(a.dtype)} / {sqrt}({a}))", a.dtype)

    @bool_identity
    def relu(self, a: KernelValue) -> KernelValue:
        return self._value(self.select(f"{a} < 0", self.zero(a.dtype), a), a.dtype)

    # -- math functions ----------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name in self.UNARY_MATH:
            return lambda a: self._value(f"{self.math_function(name, a.dtype)}({a})", a.dtype)
        if name in self.BINARY_MATH:
            return lambda a, b: self._value(
                f"{self.math_function(name, a.dtype)}({a}, {b})", a.dtype
            )
        raise AttributeError(f"{self.PACKAGE} has no {self.LANGUAGE} for virtual op {name!r}")
