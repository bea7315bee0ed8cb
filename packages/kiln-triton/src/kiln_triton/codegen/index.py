"""print_index: a sympy index expression of the IR as a Triton (Python) expression.

Loop variables print as their names (tensors in the kernel); ``FloorDiv`` and ``ModIndex``
of non-negative integers print as ``//`` and ``%`` (C and Triton agree there); clamps
(``Min``/``Max``, from cat and padding) print as ``tl.minimum``/``tl.maximum``.
"""

from __future__ import annotations

from typing import Any

import sympy

from kiln_inductor.ir.symbols import FloorDiv, ModIndex


def print_index(expr: Any) -> str:
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if isinstance(expr, sympy.Add):
        terms = sorted(expr.args, key=lambda t: (t.is_number, str(t)))
        return "(" + " + ".join(print_index(t) for t in terms) + ")"
    if isinstance(expr, sympy.Mul):
        return "(" + " * ".join(print_index(t) for t in expr.args) + ")"
    if isinstance(expr, FloorDiv):
        return f"({print_index(expr.args[0])} // {print_index(expr.args[1])})"
    if isinstance(expr, ModIndex):
        return f"({print_index(expr.args[0])} % {print_index(expr.args[1])})"
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = "tl.maximum" if isinstance(expr, sympy.Max) else "tl.minimum"
        out = print_index(expr.args[0])
        for a in expr.args[1:]:
            out = f"{fn}({out}, {print_index(a)})"
        return out
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        return "(" + " * ".join([print_index(expr.base)] * int(expr.exp)) + ")"
    raise NotImplementedError(f"cannot print index {expr} ({type(expr).__name__}) for Triton")
