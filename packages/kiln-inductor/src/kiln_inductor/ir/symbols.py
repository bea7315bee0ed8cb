"""Index arithmetic: loop variables, floor division and modulo over sympy.

Sizes, strides and indices in the IR are sympy expressions. Loop variables are
non-negative integer symbols; ``FloorDiv`` and ``ModIndex`` are floor division and
remainder of non-negative integers, which print as C/C++ ``/`` and ``%``.
``simplify_index`` removes them where the loop ranges prove them trivial, which is what
keeps reshapes of contiguous data vectorizable.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sympy
import torch
from kiln_shapes import expr_of
from kiln_shapes.functions import FloorDiv, ModIndex
from kiln_shapes.functions import split_divisible as _split_divisible

Expr = sympy.Expr

__all__ = ["FloorDiv", "ModIndex"]


def sym(value: object) -> Expr:
    """A sympy integer expression for a size, stride or index (a SymInt of kiln's shape
    engine gives its expression over the input size symbols)."""
    if isinstance(value, sympy.Basic):
        return value  # type: ignore[return-value]
    if isinstance(value, torch.SymInt):
        return expr_of(value)
    return sympy.Integer(int(value))  # type: ignore[call-overload]


_SIZE_SYMBOL = re.compile(r"\bs(\d+)\b")


def size_symbols_in(text: str) -> tuple[str, ...]:
    """The size symbols (``s0``, ``s12``: kiln_shapes' names) a kernel's source uses, in
    numeric order. Kernel generators name nothing else ``s<digits>``."""
    return tuple(f"s{i}" for i in sorted({int(m) for m in _SIZE_SYMBOL.findall(text)}))


def is_size_symbol(s: object) -> bool:
    return isinstance(s, sympy.Symbol) and _SIZE_SYMBOL.fullmatch(s.name) is not None


def _is_size_expr(e: Expr) -> bool:
    """An expression of size symbols only (``s1**2``, ``4*s0``): a constant of a loop nest."""
    return bool(e.free_symbols) and all(is_size_symbol(v) for v in e.free_symbols)


def is_int_like(value: object) -> bool:
    """A Python int (not bool) or an integer-valued sympy expression (a symbolic size)."""
    if isinstance(value, sympy.Basic):
        return bool(value.is_integer)
    return isinstance(value, int) and not isinstance(value, bool)


def index_vars(prefix: str, count: int) -> list[sympy.Symbol]:
    return [sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True) for i in range(count)]


def product(values: Iterable[Expr]) -> Expr:
    out: Expr = sympy.Integer(1)
    for v in values:
        out = out * v
    return out


_active = threading.local()


@contextlib.contextmanager
def shape_env(env: Any) -> Iterator[None]:
    """Make ``env`` (a kiln_shapes.ShapeEnv, or None) the one ``refine`` consults."""
    prev = getattr(_active, "env", None)
    _active.env = env
    try:
        yield
    finally:
        _active.env = prev


def refine(expr: Any) -> Any:
    """``expr`` simplified under the size symbols' ranges (``Min(s0, 2**63 - 1)`` -> ``s0``,
    ``Max(1, s1 // 2)`` -> ``s1 // 2`` when ``s1 >= 2``) while a graph with symbolic
    sizes is being lowered; unchanged otherwise."""
    env = getattr(_active, "env", None)
    if env is None or not getattr(expr, "free_symbols", None):
        return expr
    return env.refine(expr)


def size_hint(value: Any) -> int:
    """A size's value in the example the graph was traced with: the number itself, or a
    symbolic size (a sympy expression or a SymInt) at its hint. For decisions that pick
    among orders or layouts, which must not put guards on the sizes. A size only the
    data gives (an unbacked symbol: ``nonzero``'s row count) takes kiln_shapes' fallback
    value here: such decisions are heuristics, never correctness."""
    if isinstance(value, torch.SymInt):
        value = expr_of(value)
    if isinstance(value, sympy.Basic):
        if value.is_Number:
            return int(value)
        env = getattr(_active, "env", None)
        if env is None:
            raise ValueError(f"kiln: the size {value} has no hint outside a symbolic graph")
        return int(env.fallback_hint(value))
    return int(value)  # type: ignore[call-overload]


def contiguous_strides(size: Sequence[Expr]) -> tuple[Expr, ...]:
    strides: list[Expr] = []
    acc: Expr = sympy.Integer(1)
    for s in reversed(size):
        strides.append(acc)
        acc = acc * refine(sympy.Max(s, 1)) if not s.is_Integer else acc * max(int(s), 1)
    return tuple(reversed(strides))


def flat_index(index: Sequence[Expr], strides: Sequence[Expr], offset: Expr = sympy.S.Zero) -> Expr:
    out = offset
    for i, s in zip(index, strides):
        if s != 0:
            out = out + i * s
    return out


def unflatten_index(flat: Expr, size: Sequence[Expr]) -> list[Expr]:
    """Split a row-major flat index into per-dimension indices of ``size``."""
    if any(s == 0 for s in size):  # no element: the index is never used
        return [sympy.Integer(0)] * len(size)
    out: list[Expr] = []
    stride: Expr = sympy.Integer(1)
    for s in reversed(size):
        if s == 1:
            out.append(sympy.Integer(0))
            continue
        out.append(ModIndex(FloorDiv(flat, stride), s))
        stride = stride * s
    return list(reversed(out))


def clamp_expr(i: Expr, lo: Expr, hi: Expr) -> Expr:
    """``Min(Max(i, lo), hi)`` without sympy's evaluation of Min/Max (slow: pairwise
    comparisons through the assumptions system). Numbers are clamped; ``Max(i, 0)`` of an
    ``i`` sympy knows is non-negative is ``i``; otherwise the unevaluated clamp, which
    ``simplify_index`` reduces under the loop ranges."""
    i, lo, hi = sympy.sympify(i), sympy.sympify(lo), sympy.sympify(hi)
    if i.is_Number and lo.is_Number and hi.is_Number:
        return sympy.Integer(min(max(int(i), int(lo)), int(hi)))
    low = i if (lo.is_Number and lo == 0 and i.is_nonnegative) else _max2(i, lo)
    return _min2(low, hi)


class _Clamp:
    """Min/Max of index expressions that evaluate only what is cheap: numbers are folded
    and repeated arguments dropped, without sympy's pairwise comparisons of symbolic
    arguments. Rebuilt the same way by ``xreplace``/``subs`` (their ``func``); printers and
    ``isinstance`` checks see sympy's Min/Max."""

    pick: Any

    def __new__(cls, *args: Any, **assumptions: Any) -> Any:
        assumptions.pop("evaluate", None)
        flat: list[Expr] = []
        for a in map(sympy.sympify, args):
            flat.extend(a.args if type(a) is cls else (a,))
        numbers = [a for a in flat if a.is_Number]
        rest = list(dict.fromkeys(a for a in flat if not a.is_Number))
        if numbers:
            best = cls.pick(numbers)
            if not rest:
                return best
            rest.append(best)
        if len(rest) == 1:
            return rest[0]
        return super().__new__(cls, *rest, evaluate=False, **assumptions)

    def _sympystr(self, printer: Any) -> str:  # printed as sympy's Min/Max
        name = "Min" if isinstance(self, sympy.Min) else "Max"
        return f"{name}({', '.join(printer._print(a) for a in self.args)})"


class ClampMax(_Clamp, sympy.Max):
    pick = max


class ClampMin(_Clamp, sympy.Min):
    pick = min


def _max2(a: Expr, b: Expr) -> Expr:
    return ClampMax(a, b)


def _min2(a: Expr, b: Expr) -> Expr:
    return ClampMin(a, b)


def _lower_bound(expr: Expr, ranges: dict[sympy.Symbol, Expr]) -> Expr | None:
    """A lower bound (inclusive) of an index expression whose loop variables start at 0:
    its constant term plus its negative terms at their variables' largest values."""
    expr = sympy.expand(expr)
    total: Expr = sympy.Integer(0)
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if rest == 1:
            total = total + coeff
        elif coeff < 0:
            ub = upper_bound(rest, ranges)
            if ub is None:
                return None
            total = total + coeff * ub
        elif not (rest.is_nonnegative or isinstance(rest, sympy.Symbol) and rest in ranges):
            return None
    return total


def _simplify_clamp(e: Expr, ranges: dict[sympy.Symbol, Expr]) -> Expr:
    """A two-argument Min/Max of a loop index and a number, dropped when the loop ranges
    decide it (``Max(q - 32, 0)`` stays; ``Min(q, 31)`` over ``q < 32`` is ``q``)."""
    a, b = e.args
    if a.is_Number and b.is_Number:
        return (min if isinstance(e, sympy.Min) else max)(a, b)
    if a.is_Number:
        a, b = b, a
    if not b.is_Number:
        return e
    if isinstance(e, sympy.Min):
        ub = upper_bound(a, ranges) if a.is_nonnegative or a.free_symbols <= set(ranges) else None
        if ub is not None and ub.is_Number and ub <= b:
            return a
        return e
    lb = _lower_bound(a, ranges)
    if lb is not None and lb.is_Number and lb >= b:
        return a
    return e


def upper_bound(expr: Expr, ranges: dict[sympy.Symbol, Expr]) -> Expr | None:
    """An upper bound (inclusive) of a non-negative index expression over loop ranges (an
    expression of the size symbols when the ranges are symbolic)."""
    expr = sympy.expand(expr)
    total: Expr = sympy.Integer(0)
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if rest == 1:
            total = total + coeff
            continue
        if coeff < 0:
            continue  # dropping a negative term keeps the bound an upper bound
        # size symbols multiplying the term are constants of the loop nest
        factors = sympy.Mul.make_args(rest)
        sizes = [f for f in factors if _is_size_expr(f)]
        if sizes and len(sizes) < len(factors):
            coeff = coeff * product(sizes)
            rest = sympy.Mul(*(f for f in factors if not _is_size_expr(f)))
        elif sizes:  # a product of sizes alone
            total = total + coeff * rest
            continue
        if isinstance(rest, sympy.Symbol) and rest in ranges:
            total = total + coeff * (ranges[rest] - 1)
        elif isinstance(rest, ModIndex):
            total = total + coeff * (rest.args[1] - 1)
        elif isinstance(rest, FloorDiv):
            inner = upper_bound(rest.args[0], ranges)
            if inner is None:
                return None
            total = total + coeff * FloorDiv(inner, rest.args[1])
        elif isinstance(rest, sympy.Min):  # a clamped index: below each bounded argument
            bounds = [b for b in (upper_bound(a, ranges) for a in rest.args) if b is not None]
            numbers = [b for b in bounds if b.is_Number]
            if not bounds:
                return None
            total = total + coeff * (min(numbers) if numbers else bounds[0])
        elif isinstance(rest, sympy.Max):
            bounds = [upper_bound(a, ranges) for a in rest.args]
            if any(b is None for b in bounds):
                return None
            total = total + coeff * sympy.Max(*bounds)
        else:
            return None
    return total


def _less(a: Expr, b: Expr, ranges: dict[sympy.Symbol, Expr]) -> bool:
    """Whether ``a < b`` for every value of the loop variables (and, when symbolic, of the
    size symbols in their ranges). ``FloorDiv(p, d) < b`` holds when ``p < b * d``."""
    if isinstance(a, FloorDiv):
        return _less(a.args[0], b * a.args[1], ranges)
    ub = upper_bound(a, ranges)
    return ub is not None and statically_less(ub, b)


def statically_less(a: Expr, b: Expr) -> bool:
    """``a < b`` for every size in range (numbers compared; symbolic ones under the size
    symbols' ranges while a symbolic graph compiles)."""
    diff = sympy.expand(sympy.sympify(b) - sympy.sympify(a))
    if diff.is_Number:
        return bool(diff > 0)
    env = getattr(_active, "env", None)
    return env is not None and env.statically_known(sympy.Gt(diff, 0)) is True


def simplify_index(expr: Expr, ranges: dict[sympy.Symbol, Expr]) -> Expr:
    """Drop loop variables of range 1 (always 0) and FloorDiv/ModIndex that the loop ranges
    prove trivial (symbolic ranges too, under the size symbols' ranges)."""
    expr = sympy.sympify(expr)
    ones = {v: sympy.Integer(0) for v, r in ranges.items() if r == 1 and v in expr.free_symbols}
    if ones:
        expr = expr.xreplace(ones)

    def visit(e: Expr) -> Expr:
        if not e.args:
            return e
        args = [visit(a) for a in e.args]
        if isinstance(e, (sympy.Min, sympy.Max)):
            if tuple(args) != e.args:  # rebuilt unevaluated (``clamp_expr``)
                e = (ClampMin if isinstance(e, sympy.Min) else ClampMax)(*args)
                if not isinstance(e, (sympy.Min, sympy.Max)):
                    return e
            return _simplify_clamp(e, ranges) if len(e.args) == 2 else e
        e = e.func(*args) if tuple(args) != e.args else e
        if isinstance(e, sympy.Add):
            e = _merge_div_mod(e)
        if isinstance(e, (FloorDiv, ModIndex)):
            base, div = e.args
            if _less(base, div, ranges):
                return sympy.Integer(0) if isinstance(e, FloorDiv) else base
            # (a*d + b) // d where 0 <= b < d  ->  a
            q, r = _split_divisible(sympy.expand(base), div)
            if q != 0 and (r == 0 or _less(r, div, ranges)):
                return q if isinstance(e, FloorDiv) else r
            scaled = _factor_common_stride(e, ranges)
            if scaled is not None:
                return visit(scaled) if scaled.has(FloorDiv, ModIndex) else scaled
            split = _split_symbolic_divisor(e, ranges)
            if split is not None:
                return visit(split)
        return e

    return _merge_div_mod(visit(sympy.expand(expr)))


def _split_symbolic_divisor(e: Expr, ranges: dict[sympy.Symbol, Expr]) -> Expr | None:
    """base // (f*g) -> (base // f) // g, and base % (f*g) -> f*((base // f) % g) + base % f,
    where the factor f of a symbolic divisor divides base up to a remainder r with
    0 <= r < f (a flat index over (s1, s2, s5 + 1) divided by s1*s2*s5 + s1*s2)."""
    base, div = e.args
    if div.is_Integer:
        return None
    coeff, symbolic = sympy.factor(div).as_coeff_Mul()
    factors = [f for f in sympy.Mul.make_args(symbolic) if f != 1]
    if not coeff.is_Integer or coeff <= 0 or not factors:
        return None
    expanded = sympy.expand(base)
    candidates = []
    for k in range(1, len(factors) + 1):
        for subset in itertools.combinations(factors, k):
            for d in sympy.divisors(int(coeff)):
                f = d * sympy.Mul(*subset)
                if sympy.expand(f - div) != 0:
                    candidates.append(f)
    for f in candidates:
        if True:
            q, r = _split_divisible(expanded, f)
            if q == 0 or not (r == 0 or _less(r, f, ranges)):
                continue
            g = sympy.cancel(div / f)
            if isinstance(e, FloorDiv):
                return FloorDiv(q, g)
            return f * ModIndex(q, g) + r
    return None


def _factor_common_stride(e: Expr, ranges: dict[sympy.Symbol, Expr]) -> Expr | None:
    """(k*a + r) // (k*d) -> a // d and (k*a + r) % (k*d) -> k*(a % d) + r, when k divides
    every coefficient of a and 0 <= r < k over the loop ranges (d may be symbolic).

    Views of views (a reshape of a transposed slice, ...) produce these; without the rule a
    contiguous inner loop keeps a division and the compiler cannot vectorize it."""
    base, div = e.args
    cdiv, ddiv = div.as_coeff_Mul()
    if not cdiv.is_Integer or cdiv <= 1:
        return None
    terms = sympy.Add.make_args(sympy.expand(base))
    coeffs = [t.as_coeff_Mul()[0] for t in terms]
    if any(not c.is_Integer or c <= 0 for c in coeffs):
        return None
    for k in sorted({math.gcd(int(cdiv), int(c)) for c in coeffs}, reverse=True):
        if k <= 1:
            break
        a = sum((t / k for t, c in zip(terms, coeffs) if int(c) % k == 0), sympy.Integer(0))
        r = sum((t for t, c in zip(terms, coeffs) if int(c) % k != 0), sympy.Integer(0))
        if a == 0 or r == 0:
            continue
        if not _less(r, sympy.Integer(k), ranges):
            continue
        rest = (cdiv // k) * ddiv
        if isinstance(e, FloorDiv):
            return FloorDiv(a, rest)
        return k * ModIndex(a, rest) + r
    return None


def _merge_div_mod(expr: Expr) -> Expr:
    """c*(a % m) + c*m*(a // m) -> c*a, the inverse of splitting a flat index."""
    terms = list(sympy.Add.make_args(expr))
    for i, t in enumerate(terms):
        # c may be a number or a product of sizes (s2*s5*(x0 % s1))
        mods = [f for f in sympy.Mul.make_args(t) if isinstance(f, ModIndex)]
        if len(mods) != 1:
            continue
        rest = mods[0]
        c = sympy.cancel(t / rest)
        a, m = rest.args
        partner = c * m * FloorDiv(a, m)
        for j, u in enumerate(terms):
            if j != i and sympy.expand(u - partner) == 0:
                rest_terms = [v for k2, v in enumerate(terms) if k2 not in (i, j)]
                return _merge_div_mod(sympy.Add(*rest_terms, c * a))
    return expr


def coefficients(expr: Expr, variables: Sequence[sympy.Symbol]) -> tuple[list[Expr], Expr] | None:
    """Strides of ``expr`` in each variable and its constant offset, when it is affine."""
    expr = sympy.expand(expr)
    coeffs: list[Expr] = []
    for v in variables:
        c = expr.coeff(v, 1)
        coeffs.append(c)
    rest = sympy.expand(expr - sum((c * v for c, v in zip(coeffs, variables)), sympy.Integer(0)))
    if any(v in rest.free_symbols for v in variables):
        return None
    if any(any(v in c.free_symbols for v in variables) for c in coeffs):
        return None
    return coeffs, rest
