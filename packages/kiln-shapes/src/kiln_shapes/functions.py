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
    if not divisor.is_Integer and r != 0 and isinstance(divisor, sympy.Add):
        # a sum divides sums of its multiples: x*s*(t + 1) + y*(t + 1) + z over (t + 1)
        q2, r2 = _poly_divide(r, divisor)
        if q2 != 0:
            q, r = q + q2, r2
    return q, r


def _poly_divide(base: Expr, divisor: Expr) -> tuple[Expr, Expr]:
    """Polynomial division of ``base`` by ``divisor`` with the divisor's symbols leading,
    when the quotient has integer coefficients; (0, base) otherwise."""
    gens = sorted(divisor.free_symbols, key=str)
    gens += sorted(base.free_symbols - divisor.free_symbols, key=str)
    try:
        q, r = sympy.div(sympy.Poly(base, *gens), sympy.Poly(divisor, *gens))
    except (sympy.PolynomialError, sympy.GeneratorsNeeded, ValueError):
        return sympy.Integer(0), base
    if q.is_zero or not all(c.is_Integer for c in q.coeffs()):
        return sympy.Integer(0), base
    if not all(c.is_Integer for c in r.coeffs()) if not r.is_zero else False:
        return sympy.Integer(0), base
    return q.as_expr(), r.as_expr()


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
