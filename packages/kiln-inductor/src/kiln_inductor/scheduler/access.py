"""What each scheduler node reads and writes, with the index of every access.

Bodies are run once under a recording handler with canonical loop variables (``i*`` for
the iteration ranges, ``r*`` for the reduction ranges). Dimensions of size 1 get no loop
(their index is 0): a (1, 256) layer_norm statistic and the (256, 256) output it
normalizes then share their outer loop, and fuse.

Loop order follows memory order
-------------------------------
The iteration ranges are listed outermost first in the stride order of the buffer the
node writes (``loop_order``), not in its logical order: a pointwise node writing an NHWC
buffer of logical size (N, C, H, W) loops over (N, H, W, C), so the flat index of its
loops is the buffer's memory order and its stores (and its loads of other NHWC buffers)
are contiguous. A contiguous output keeps the logical order, so its loops are the same as
ever. Reduction ranges keep their logical order; a scan keeps the logical order too.
``node_access(node, order)`` takes another order (the scheduler gives the members of a
group that have the same logical size one order, see ``fuse``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from ..ir.nodes import ComputedBuffer, Reduction, Scan, Scatter
from ..ir.ops import ops_handler
from ..ir.symbols import Expr, index_vars, size_hint


@dataclass(frozen=True)
class Access:
    ranges: tuple[Expr, ...]
    rranges: tuple[Expr, ...]
    vars: tuple[sympy.Symbol, ...]
    rvars: tuple[sympy.Symbol, ...]
    loads: tuple[tuple[str, Expr], ...]
    store: Expr
    indirect: bool  # some load index depends on loaded data
    index: tuple[Expr, ...] = ()  # the body's index in ``vars`` (0 for dimensions of size 1)
    rindex: tuple[Expr, ...] = ()  # the body's reduction index in ``rvars``
    reordered: bool = False  # ``ranges`` are not in logical order (see loop_order)
    checked: bool = False  # some indirect access is bounds-checked (index_check.py)


class _Recorder:
    def __init__(self) -> None:
        self.loads: list[tuple[str, Expr]] = []
        self.indirect = False
        self.checked = False

    def load(self, name: str, index: Expr) -> object:
        self.loads.append((name, sympy.expand(index)))
        return object()

    def indirect_indexing(self, value: Any, size: Any, check: Any = None) -> Expr:
        self.indirect = True
        self.checked = self.checked or check is not None
        return sympy.Symbol(f"ind{len(self.loads)}", integer=True, nonnegative=True)

    def masked(self, mask: Any, body: Any, other: Any) -> object:
        body()
        return object()

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: object()


def loop_order(size: Sequence[Expr], strides: Sequence[Expr]) -> tuple[int, ...]:
    """The dimensions of ``size``, outermost first: by decreasing stride (ties keep logical
    order). The logical order when a stride is symbolic or the tensor is empty, so that
    contiguous strides, which decrease, always give the logical order."""
    logical = tuple(range(len(size)))
    if len(strides) != len(size) or any(s == 0 for s in size):
        return logical
    try:  # symbolic strides order as they do at the hints (a dense layout keeps its order)
        hints = [size_hint(sympy.sympify(st)) for st in strides]
    except ValueError:
        return logical
    return tuple(sorted(logical, key=lambda d: -hints[d]))


def _loop_index(
    prefix: str,
    size: tuple[Expr, ...],
    keep_one: bool = False,
    order: Sequence[int] | None = None,
) -> tuple[list[Expr], tuple[Expr, ...], tuple[Expr, ...]]:
    """(index of every dimension, loop variables, loop ranges): dimensions of size 1 are the
    constant 0, except that ``keep_one`` keeps one loop when all are of size 1 (a reduction
    or a scan always has a loop to run its body in). Loops are listed in ``order``
    (dimensions, outermost first; logical order by default)."""
    syms = index_vars(prefix, len(size))
    if keep_one and size and all(s == 1 for s in size):
        return list(syms[:1]) + [sympy.Integer(0)] * (len(size) - 1), tuple(syms[:1]), size[:1]
    index: list[Expr] = [sympy.Integer(0) if s == 1 else v for v, s in zip(syms, size)]
    dims = [d for d in (range(len(size)) if order is None else order) if size[d] != 1]
    return index, tuple(syms[d] for d in dims), tuple(size[d] for d in dims)


def _scan_access(node: ComputedBuffer, body: Scan) -> Access:
    """A scan loops over the other dimensions (outer) and along its axis (like a reduction
    range, but it stores at every step: the store index holds the axis variable)."""
    others = body.size[: body.axis] + body.size[body.axis + 1 :]
    index, ivars, ranges = _loop_index("i", tuple(others))
    rindex, rvars, rr = _loop_index("r", (body.size[body.axis],), keep_one=True)
    full = [*index[: body.axis], *rindex, *index[body.axis :]]
    rec = _Recorder()
    with ops_handler(rec):
        body.inner_fn(list(full))
    store = sympy.expand(node.layout.index(full))
    return Access(
        ranges,
        rr,
        ivars,
        rvars,
        tuple(rec.loads),
        store,
        rec.indirect,
        tuple(full),
        tuple(rindex),
        checked=rec.checked,
    )


def _scatter_access(node: ComputedBuffer, body: Scatter) -> Access:
    """A scatter loops over the dimensions of its update space that are target dimensions
    themselves (outer: parallel, no two of their iterations write one element), then over
    its ``serial`` ones (a reduction range: in order; one loop of 1 when there are none).
    It reads its base (the buffer it updates) where it writes; its store index holds the
    symbols of the loaded indices."""
    sizes = tuple(body.ranges)
    ivars, rvars = index_vars("i", len(sizes)), index_vars("r", len(sizes))
    full: list[Expr] = []
    outer: list[int] = []
    inner: list[int] = []
    for d, n in enumerate(sizes):
        serial = d in body.serial
        full.append(sympy.Integer(0) if n == 1 else (rvars if serial else ivars)[d])
        if n != 1:
            (inner if serial else outer).append(d)
    rec = _Recorder()
    with ops_handler(rec):
        target, _ = body.inner_fn(full)
    store = sympy.expand(node.layout.index(target))
    rr = tuple(sizes[d] for d in inner) or (sympy.Integer(1),)
    rvs = tuple(rvars[d] for d in inner) or tuple(index_vars("r", 1))
    return Access(
        tuple(sizes[d] for d in outer),
        rr,
        tuple(ivars[d] for d in outer),
        rvs,
        ((body.base, store), *rec.loads),
        store,
        True,
        tuple(full),
        tuple(full[d] for d in inner),
        checked=rec.checked,
    )


def own_order(node: ComputedBuffer) -> tuple[int, ...]:
    """The loop order of the buffer ``node`` writes (its body's dimensions, outermost first)."""
    assert node.body is not None
    if isinstance(node.body, (Scan, Scatter)):
        return tuple(range(len(node.body.size)))
    return loop_order(node.body.size, node.layout.stride)


def node_access(node: ComputedBuffer, order: Sequence[int] | None = None) -> Access:
    """The node's loops and accesses, its loops in ``order`` (dimensions outermost first; by
    default ``own_order``, the stride order of the buffer it writes)."""
    body = node.body
    assert body is not None
    if isinstance(body, Scan):
        return _scan_access(node, body)
    if isinstance(body, Scatter):
        return _scatter_access(node, body)
    order = own_order(node) if order is None else order
    index, ivars, ranges = _loop_index("i", tuple(body.size), order=order)
    rec = _Recorder()
    rindex: list[Expr] = []
    if isinstance(body, Reduction):
        rindex, rvars, rr = _loop_index("r", tuple(body.reduction_ranges), keep_one=True)
        with ops_handler(rec):
            body.inner_fn(list(index), list(rindex))
    else:
        rvars, rr = (), ()
        with ops_handler(rec):
            body.inner_fn(list(index))
    store = sympy.expand(node.layout.index(index))
    logical = [v for v, s in zip(index_vars("i", len(body.size)), body.size) if s != 1]
    return Access(
        ranges,
        rr,
        ivars,
        rvars,
        tuple(rec.loads),
        store,
        rec.indirect,
        tuple(index),
        tuple(rindex),
        reordered=list(ivars) != logical,
        checked=rec.checked,
    )
