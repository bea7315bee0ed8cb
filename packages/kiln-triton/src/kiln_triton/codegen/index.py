"""print_index: a sympy index expression of the IR as a Triton (Python) expression.

Loop variables print as their names (tensors in the kernel); ``FloorDiv`` and ``ModIndex``
of non-negative integers print as ``//`` and ``%`` (C and Triton agree there); clamps
(``Min``/``Max``, from cat and padding) print as ``tl.minimum``/``tl.maximum``. Size
symbols (``s0``: kiln_shapes') print as their names, the kernel's int arguments.

``host_expr`` prints a size expression as Python for the launcher (``max``/``min``).
"""

from __future__ import annotations

from typing import Any

import sympy

from kiln_inductor.ir.symbols import FloorDiv, ModIndex


def host_expr(expr: Any) -> str:
    """``expr`` (a size over size symbols) as Python source evaluated on the host."""
    return print_index(expr, host=True)


def print_index(expr: Any, host: bool = False) -> str:
    expr = sympy.sympify(expr)

    def p(e: Any) -> str:
        return print_index(e, host)

    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if isinstance(expr, sympy.Add):
        terms = sorted(expr.args, key=lambda t: (t.is_number, str(t)))
        return "(" + " + ".join(p(t) for t in terms) + ")"
    if isinstance(expr, sympy.Mul):
        return "(" + " * ".join(p(t) for t in expr.args) + ")"
    if isinstance(expr, FloorDiv):
        return f"({p(expr.args[0])} // {p(expr.args[1])})"
    if isinstance(expr, ModIndex):
        return f"({p(expr.args[0])} % {p(expr.args[1])})"
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = "tl.maximum" if isinstance(expr, sympy.Max) else "tl.minimum"
        if host:
            fn = "max" if isinstance(expr, sympy.Max) else "min"
        out = p(expr.args[0])
        for a in expr.args[1:]:
            out = f"{fn}({out}, {p(a)})"
        return out
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        return "(" + " * ".join([p(expr.base)] * int(expr.exp)) + ")"
    raise NotImplementedError(f"cannot print index {expr} ({type(expr).__name__}) for Triton")
