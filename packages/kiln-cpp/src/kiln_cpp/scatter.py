"""emit_scatter: the C++ of a scatter group (kiln_inductor.lowering.scatter).

A scatter group is one ``Scatter`` node: its outer loops are the update dimensions that
are target dimensions themselves (two iterations of them never write one element), its
block's serial loops the others. Threads split the outer loops and each runs the serial
ones in order: no atomics, and every sum in eager's order, whatever the thread count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kiln_inductor.ir.nodes import Scatter
from kiln_inductor.ir.symbols import coefficients
from kiln_inductor.scheduler.fuse import Block, loop_var_ranges

from .cpp_ops import print_index

if TYPE_CHECKING:
    from .kernel import CppKernel

SCATTER_CHUNK = 64  # elements of a scatter's last parallel dimension one thread updates in turn


def emit_scatter(k: CppKernel, block: Block) -> None:
    """A scatter's updates (kiln_inductor.lowering.scatter), parallel over the outer
    loops (update dimensions that are target dimensions: no two threads write one
    element, so no atomics) and in order along the serial ones inside. Where the last
    outer dimension is the target's contiguous one, it goes in chunks of
    ``SCATTER_CHUNK``: inside each chunk the serial dimensions, then the chunk's
    elements (a contiguous row of an embedding's gradient: vectorized, its id checked
    once before it); otherwise each thread takes whole rows (scatter_add along a row)."""
    g = k.group
    (node,) = block.nodes
    body = node.body
    assert isinstance(body, Scatter)
    k.h.ranges = loop_var_ranges(g, block)
    index = g.bound[node.name][0]
    ptr, dt = k.ptrs[node.name]
    add = body.mode == "add"
    assert not (add and dt in (torch.bfloat16, torch.float16)), dt  # (lowering widens them)

    def update() -> None:
        target, value, bad = k.h.scatter_update(body, index)
        at = print_index(node.layout.index(target))
        if add:
            stmt = f"{ptr}[{at}] += {k.h.to_dtype(value, dt)};"
        else:
            stmt = f"{ptr}[{at}] = {k.h.store_expr(value, dt)};"
        if bad:
            stmt = f"if (!({' || '.join(bad)})) {stmt}"
        k.emit(stmt)

    serial = [
        f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})"
        for v, s in zip(block.rvars, block.rranges)
        if s != 1
    ]
    if not g.outer:
        k._nest(serial, [None] * len(serial), update)
        return
    from .kernel import PARALLEL_WORK

    cond = f"if({print_index(k._work())} >= {PARALLEL_WORK})"
    last, extent = g.outer_vars[-1], print_index(g.outer[-1])
    co = coefficients(g.bound[node.name][2], [last])
    if co is None or co[0][0] != 1:
        # the last parallel dimension is not the target's contiguous one (scatter_add
        # along the rows' own dimension): each thread takes whole rows, in order
        loops = [
            f"for (int64_t {v} = 0; {v} < {print_index(n)}; ++{v})"
            for v, n in zip(g.outer_vars, g.outer)
        ]
        pragma = f"#pragma omp parallel for collapse({len(loops)}) {cond}"
        k._nest(
            loops,
            [pragma] + [None] * (len(loops) - 1),
            lambda: k._nest(serial, [None] * len(serial), update),
        )
        return
    chunk = f"c_{last}"
    loops = [
        *(f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})"
          for v, s in zip(g.outer_vars[:-1], g.outer[:-1])),
        f"for (int64_t {chunk} = 0; {chunk} < {extent}; {chunk} += {SCATTER_CHUNK})",
    ]  # fmt: skip
    pragma = f"#pragma omp parallel for collapse({len(loops)}) {cond}"

    def row() -> None:
        end = f"kiln::min<int64_t>({chunk} + {SCATTER_CHUNK}, {extent})"
        header = f"for (int64_t {last} = {chunk}; {last} < {end}; ++{last})"
        k.hoisting({last.name}, lambda: k._nest([header], ["#pragma omp simd"], update))

    k._nest(
        loops,
        [pragma] + [None] * (len(loops) - 1),
        lambda: k._nest(serial, [None] * len(serial), row),
    )
