"""Kernel order after fusion: kernels with bounds-checked indirect accesses run early.

A kernel that checks its indices reports failures into an error row; on a GPU the wrapper
copies the rows to the host right after the last such kernel and waits for that copy just
before the graph returns (index_check.DeviceIndexErrors). Where a checked kernel comes
late in the graph, the host waits for nearly the whole graph, and the device idles while
the host queues the work that follows. Program order puts such kernels late when their
result is only kept for the backward: HF BERT's forward gathers its token type ids by
position (``gather``) into the embedding kernel at the start, and again, as the saved
index of the embedding's backward, in a kernel of its own at the graph's end, which made
the host wait for the whole forward before it queued the loss (1.1 ms of idle GPU per
training step on the H200).

``hoist_checked`` moves each checked kernel to just after the last step it depends on: no
step it passes produces a buffer it reads or reads a buffer it writes, and it never passes
a library fallback or a collective (they may alias or hold their arguments). Results are
unchanged; the kernel's output lives longer (a checked kernel's output is an index or a
gathered tensor, used soon or kept for the backward anyway).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir.nodes import ExternKernel
from ..passes.collectives import is_collective_op, is_wait_op
from .fuse import AccessTable, FusedGroup, Step


def _reads(step: Step) -> set[str]:
    if isinstance(step, FusedGroup):
        return {*step.inputs, *step.opaque_reads}
    return set(step.input_buffers())


def _writes(step: Step) -> set[str]:
    if isinstance(step, FusedGroup):
        return {*step.outputs, *step.aliases}
    return {o.name for o in step.outputs}


def _checked(step: Step, accesses: AccessTable) -> bool:
    return isinstance(step, FusedGroup) and any(
        n.name in accesses and accesses[n.name].checked for n in step.nodes
    )


def hoist_checked(steps: Sequence[Step], accesses: AccessTable) -> list[Step]:
    """``steps`` with every kernel holding a bounds check moved as early as its data
    allows (module docstring)."""
    out = list(steps)
    for step in [s for s in steps if _checked(s, accesses)]:
        i = out.index(step)
        reads, writes = _reads(step), _writes(step)
        j = i
        while j > 0:
            prev = out[j - 1]
            if isinstance(prev, ExternKernel) and prev.kind != "extern":
                break
            if _checked(prev, accesses):
                break  # checked kernels keep their order among themselves
            if _writes(prev) & reads or _reads(prev) & writes:
                break
            if isinstance(prev, ExternKernel) and (
                is_collective_op(prev.op) or is_wait_op(prev.op)
            ):
                break
            j -= 1
        if j < i:
            out.insert(j, out.pop(i))
    return out
