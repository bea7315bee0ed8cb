"""Split loops so that nodes viewing the same memory in different shapes share them.

A node's loops are its output's dimensions. Around a matmul, the same rows appear in two
shapes: a layer_norm reduces a (2, 197, 384) tensor over its last dimension (loops
(2, 197), reduction (384,)), and the normalized rows are realized as the (394, 384) matrix
the matmul reads (loops (394, 384)). The two nodes cannot share an outer loop as they are,
so the statistics and the normalization became two kernels, and the rows were read twice.

``refine(access, target)`` rewrites a node's loops as a finer split of the same iteration:
each of its loop ranges must be the product of consecutive ranges of ``target`` (here
394 = 2 * 197), and its variable becomes their flat index (``i0 = 197 * i0_0 + i0_1``),
so every load and store addresses the same element at the same iteration as before. The
scheduler offers the members of a candidate group the finest member's loops
(``refine_to_finest``); its usual checks then decide whether they fuse.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from ..ir.symbols import Expr
from .access import Access


def _split(ranges: Sequence[Expr], target: Sequence[Expr]) -> list[list[Expr]] | None:
    """For each range, the consecutive ranges of ``target`` whose product it is (a prefix
    of ``target`` is consumed), or None. Symbolic ranges split where the product of the
    consumed ranges equals the range as an expression (``4*s0`` is ``(s0, 4)``'s product)."""
    parts: list[list[Expr]] = []
    j = 0
    for n in ranges:
        n = sympy.sympify(n)
        got: list[Expr] = []
        prod: Expr = sympy.Integer(1)
        while j < len(target):
            if got and sympy.expand(prod - n) == 0:
                break
            if n.is_Integer and prod.is_Integer and prod >= n:
                break
            t = sympy.sympify(target[j])
            got.append(t)
            prod = prod * t
            j += 1
        if not got or sympy.expand(prod - n) != 0:
            return None
        parts.append(got)
    return parts


def refine(access: Access, target: Sequence[Expr]) -> Access | None:
    """``access`` with its loops split to match a prefix of ``target``, or None if they
    cannot be (or need not be)."""
    if access.reordered or access.indirect:
        return None
    parts = _split(access.ranges, target)
    if parts is None or all(len(p) == 1 for p in parts):
        return None
    subs: dict[sympy.Symbol, Expr] = {}
    ranges: list[Expr] = []
    vars_: list[sympy.Symbol] = []
    for v, sizes in zip(access.vars, parts):
        if len(sizes) == 1:
            ranges.append(sizes[0])
            vars_.append(v)
            continue
        new = [
            sympy.Symbol(f"{v.name}_{k}", integer=True, nonnegative=True) for k in range(len(sizes))
        ]
        flat: Expr = sympy.Integer(0)
        for s, n in zip(new, sizes):
            flat = flat * n + s
        subs[v] = flat
        ranges += list(sizes)
        vars_ += new

    def sub(e: Expr) -> Expr:
        return sympy.expand(sympy.sympify(e).xreplace(subs))

    return Access(
        tuple(ranges),
        access.rranges,
        tuple(vars_),
        access.rvars,
        tuple((b, sub(e)) for b, e in access.loads),
        sub(access.store),
        access.indirect,
        tuple(sub(e) for e in access.index),
        access.rindex,
        access.reordered,
    )


def refine_to_finest(accesses: dict[str, Access]) -> dict[str, Access]:
    """The members' accesses, each split to the loops (and reduction ranges) of the member
    with the most of them where it can be: a group's members then share their outer loops
    when they iterate over the same elements in the same order."""
    full = {name: (*a.ranges, *a.rranges) for name, a in accesses.items()}
    finest = max(full.values(), key=len)
    out = dict(accesses)
    for name, acc in accesses.items():
        if full[name] == finest:
            continue
        refined = refine(acc, finest)
        if refined is not None:
            out[name] = refined
    return out
