"""IndexPrinter: a sympy index expression of the IR as source text of a kernel language.

Every backend prints the same few shapes of index (``ir/symbols.py``): integers, loop and
size symbols, sums, products, ``FloorDiv``/``ModIndex`` of non-negative integers, sympy's
``Mod`` (of a possibly negative integer: printed with the divisor's sign, as Python's
``%``), clamps (``Min``/``Max``, from cat and padding) and positive integer powers. The traversal and the
order of terms (symbols first, then the constant, each group by its text: deterministic
source, so deterministic cache keys) are here; a language names its spellings::

    class CppIndexPrinter(IndexPrinter):
        TARGET = "as C++"
        MAX, MIN = "kiln::max<int64_t>", "kiln::min<int64_t>"

        def integer(self, value: int) -> str:
            return f"{value}L"

A clamp of several arguments nests two-argument calls: ``MAX(MAX(a, b), c)``.
"""

from __future__ import annotations

from typing import Any

import sympy

from ..ir.symbols import FloorDiv, ModIndex


class IndexPrinter:
    """Prints index expressions; subclasses set the spellings below."""

    TARGET = "as source"  # how the error for an unprintable expression names the language
    FLOORDIV = "//"  # infix operator of FloorDiv (non-negative operands: C and Python agree)
    MOD = "%"  # infix operator of ModIndex
    MAX = "max"  # two-argument function of a Max
    MIN = "min"  # two-argument function of a Min

    def __call__(self, expr: Any) -> str:
        return self.print(expr)

    def integer(self, value: int) -> str:
        return str(value)

    def print(self, expr: Any) -> str:
        expr = sympy.sympify(expr)
        p = self.print
        if expr.is_Integer:
            return self.integer(int(expr))
        if expr.is_Symbol:
            return expr.name
        if isinstance(expr, sympy.Add):
            terms = sorted(expr.args, key=lambda t: (t.is_number, str(t)))
            return "(" + " + ".join(p(t) for t in terms) + ")"
        if isinstance(expr, sympy.Mul):
            return "(" + " * ".join(p(t) for t in expr.args) + ")"
        if isinstance(expr, FloorDiv):
            return f"({p(expr.args[0])} {self.FLOORDIV} {p(expr.args[1])})"
        if isinstance(expr, ModIndex):
            return f"({p(expr.args[0])} {self.MOD} {p(expr.args[1])})"
        if isinstance(expr, sympy.Mod):  # Python's modulo (any sign: roll's shift % n)
            a, b = p(expr.args[0]), p(expr.args[1])
            return f"((({a} {self.MOD} {b}) + {b}) {self.MOD} {b})"
        if isinstance(expr, (sympy.Max, sympy.Min)):
            fn = self.MAX if isinstance(expr, sympy.Max) else self.MIN
            out = p(expr.args[0])
            for a in expr.args[1:]:
                out = f"{fn}({out}, {p(a)})"
            return out
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
            return "(" + " * ".join([p(expr.base)] * int(expr.exp)) + ")"
        raise NotImplementedError(
            f"cannot print index {expr} ({type(expr).__name__}) {self.TARGET}"
        )
