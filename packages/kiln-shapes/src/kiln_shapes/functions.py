"""Integer functions of sizes and indices: floor division and remainder over sympy.

Sizes, strides and loop indices are non-negative integers, so ``FloorDiv`` and ``ModIndex``
are defined (and simplified) for non-negative arguments only; they print as C/C++ ``/`` and
``%`` and as Python ``//`` and ``%``. The shape engine builds them from ``x.shape[1] // 2``;
kiln-inductor builds them from views and reshapes of flat indices.
"""

from __future__ import annotations

import sympy

Expr = sympy.Expr


def split_divisible(base: Expr, divisor: Expr) -> tuple[Expr, Expr]:
    """base = divisor * q + r, with q collecting the terms whose coefficient divides."""
    q: Expr = sympy.Integer(0)
    r: Expr = sympy.Integer(0)
    terms = sympy.Add.make_args(base if divisor.is_Integer else sympy.expand(base))
    for term in terms:
        coeff, rest = term.as_coeff_Mul()
        if divisor.is_Integer and coeff.is_Integer and int(coeff) % int(divisor) == 0:
            q = q + (coeff // divisor) * rest
        elif not divisor.is_Integer and _divides(term, divisor):
            q = q + sympy.cancel(term / divisor)
        else:
            r = r + term
    return q, r


def _divides(term: Expr, divisor: Expr) -> bool:
    """Whether a product term is an integer multiple of a symbolic divisor (``4*s**2*x`` of
    ``4*s**2``; not ``s**2*x``, whose quotient ``x/4`` is not an integer)."""
    quotient = sympy.cancel(term / divisor)
    if not quotient.is_polynomial():
        return False
    return sympy.fraction(sympy.together(quotient))[1] == 1


class FloorDiv(sympy.Function):
    """floor(base / divisor) for non-negative integers."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor):  # type: ignore[override]
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        q, r = split_divisible(base, divisor)
        if q != 0:
            return q + FloorDiv(r, divisor)
        return None


class ModIndex(sympy.Function):
    """base % divisor for non-negative integers."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor):  # type: ignore[override]
        if divisor == 1 or base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) % int(divisor))
        q, r = split_divisible(base, divisor)
        if q != 0:
            return ModIndex(r, divisor)
        return None
