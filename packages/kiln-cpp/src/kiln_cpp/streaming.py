"""plan_streamed_rows: which outputs of a row-wise kernel are written with non-temporal stores.

A kernel that writes far more than the cache holds (softmax or layer_norm over a large
matrix) pays for each output cache line twice: a read for ownership, then the write-back.
Its last loop can instead compute a row into a stack buffer and copy it out with
non-temporal stores (``kiln_stream_f32`` in the prelude), a third less memory traffic for
a read-one-write-one kernel. Small outputs keep ordinary stores: the next kernel reads
them from cache. The threshold follows glibc's memcpy (config.stream_threshold).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from kiln_inductor.ir.nodes import Buffer
from kiln_inductor.ir.symbols import Expr, coefficients, contiguous_strides, product
from kiln_inductor.scheduler.fuse import FusedGroup

MAX_ROW_BYTES = 64 * 1024  # the stack buffer of one row


@dataclass(frozen=True)
class StreamedRow:
    array: str  # the stack buffer's name
    base: Expr  # the row's first element in the output (a function of the outer loops)
    length: Expr


def plan_streamed_rows(
    group: FusedGroup, buffers: dict[str, Buffer], threshold: int | None
) -> dict[str, StreamedRow]:
    """Outputs of ``group``'s last loop to stream, by buffer name (empty: none)."""
    if threshold is None or not group.outer or not group.blocks:
        return {}
    last = group.blocks[-1]
    n = product(last.inner)
    if last.kind != "pointwise" or not last.inner or not n.is_number:
        return {}
    if int(n) < 64 or int(n) * 4 > MAX_ROW_BYTES:
        return {}
    written = 0
    for name in group.outputs:
        layout = buffers[name].layout
        if not layout.numel.is_number:
            return {}
        written += int(layout.numel) * layout.dtype.itemsize
    if written <= threshold:
        return {}
    plan: dict[str, StreamedRow] = {}
    for node in last.nodes:
        if node.name in group.local or node.name in group.aliases:
            continue
        if node.dtype != torch.float32:
            continue
        store = group.bound[node.name][2]
        co = coefficients(store, list(last.vars))
        if co is None or [sympy.expand(c) for c in co[0]] != list(contiguous_strides(last.inner)):
            continue
        plan[node.name] = StreamedRow(f"row{len(plan)}", co[1], n)
    return plan
