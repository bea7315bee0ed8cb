"""plan_row_prefetch: which input rows a row-wise kernel prefetches one outer iteration ahead.

A row-wise kernel (softmax, layer_norm over (4096, 1024)) reads each row from memory in its
first loop, then computes on it from L1 (exp, sums, the normalization) without a memory
access. The hardware prefetchers do not cross 4 KiB pages, and a 4 KiB row is one page, so
every row starts with a cold miss and the memory system idles while the row is computed.
Prefetching the next outer iteration's row at the start of each iteration overlaps the two
(measured on (4096, 1024) float32 softmax: ~10% less CPU time per row on one thread).

A load is prefetched when its index is, for each outer iteration, a contiguous range of the
block's loop variables starting at an offset that moves with the innermost outer loop,
spanning ``MIN_ROW_BYTES`` to ``MAX_ROW_BYTES``, of an input large enough not to be
resident in L2 anyway. A row or input of symbolic size is prefetched whatever its size
(its hint is the first call's, often a small one): the prefetch loop costs one instruction
per cache line, capped at ``MAX_ROW_BYTES`` a row.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from kiln_inductor.ir.nodes import Buffer
from kiln_inductor.ir.symbols import Expr, coefficients, contiguous_strides, product
from kiln_inductor.scheduler.fuse import FusedGroup

MIN_ROW_BYTES = 1024  # smaller rows share pages with their neighbours: the hardware streams them
MAX_ROW_BYTES = 64 * 1024  # one prefetch per cache line, issued up front
MIN_INPUT_BYTES = 512 * 1024  # smaller inputs stay in L2 between calls
LINE_BYTES = 64


@dataclass(frozen=True)
class PrefetchedRow:
    buffer: str
    next_base: Expr  # the next outer iteration's first element (outer variables)
    length: Expr  # elements
    step: int  # elements per cache line


def plan_row_prefetch(group: FusedGroup, buffers: dict[str, Buffer]) -> list[PrefetchedRow]:
    """The rows to prefetch at the top of each outer iteration of ``group`` (may be empty)."""
    if not group.outer or not group.blocks:
        return []
    last_outer = group.outer_vars[-1]
    inputs = set(group.inputs)
    seen: set[tuple[str, str]] = set()
    out: list[PrefetchedRow] = []
    for block in group.blocks:
        loop_vars = [*block.vars, *block.rvars]
        extents = [*block.inner, *block.rranges]
        n = product(extents)
        if not loop_vars:
            continue
        for node in block.nodes:
            for name, index in group.bound[node.name][3]:
                row = _row(name, index, loop_vars, extents, n, last_outer, buffers)
                if row is None or name not in inputs:
                    continue
                key = (name, str(row.next_base))
                if key not in seen:
                    seen.add(key)
                    out.append(row)
    return out


def _row(
    name: str,
    index: Expr,
    loop_vars: list[sympy.Symbol],
    extents: list[Expr],
    n: Expr,
    last_outer: sympy.Symbol,
    buffers: dict[str, Buffer],
) -> PrefetchedRow | None:
    buf = buffers.get(name)
    if buf is None:
        return None
    layout = buf.layout
    itemsize = layout.dtype.itemsize
    if layout.numel.is_number and int(layout.numel) * itemsize < MIN_INPUT_BYTES:
        return None
    if n.is_number and not MIN_ROW_BYTES <= int(n) * itemsize <= MAX_ROW_BYTES:
        return None
    co = coefficients(index, loop_vars)
    if co is None:
        return None
    strides, base = co
    kept = [(sympy.expand(s), e) for s, e in zip(strides, extents) if e != 1]
    if [s for s, _ in kept] != list(contiguous_strides([e for _, e in kept])):
        return None
    base = sympy.expand(base)
    if last_outer not in base.free_symbols:
        return None  # the same data every iteration (a weight): already cached
    return PrefetchedRow(
        name,
        sympy.expand(base.xreplace({last_outer: last_outer + 1})),
        n if n.is_number else sympy.Min(n, MAX_ROW_BYTES // itemsize),
        max(1, LINE_BYTES // itemsize),
    )
