"""plan_memory: decide, for each kernel output buffer, whether it gets fresh storage or
reuses the storage of a buffer that is dead by then, and when each buffer can be freed.

Before: the ordered steps of ``fuse_nodes``. After: a ``MemoryPlan``.

Only storage the wrapper holds the one reference to is recycled: what it allocated itself,
and what an ATen call returned fresh (an op whose schema marks no result as an alias of
an argument: mm, convolution, attention, a convolution's backward; never a collective,
whose result its wait hands back), but never graph inputs or constants. A matmul's result
taken over by the kernel after it (a GELU's backward written over the mm's output) saves
an allocation and, where no later buffer of its size follows, memory at that point: HF
ConvNeXt's small training step peaked in a pointwise kernel reading one dead mm output
and writing a buffer of the same size. A buffer is dead after the last
step that reads it; graph outputs never die. A kernel may write its output in place of an
input it is the last reader of when every read of that input is at the very index it
writes (a pointwise output written over a dead input). A scatter always writes over its
base (the copy of the tensor it updates, which only it reads).

``donated`` (output buffer -> graph input) names graph inputs whose caller wants them
overwritten by that output (kiln-aot's inference graphs: the new value of an input the
program writes in place, such as an optimizer's parameters and states): the kernel that
computes the output writes it into the input's storage when the input is read nowhere
after that kernel and only at the very index written (as for a dead input), so the write
back after the graph has nothing left to copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from ..ir.nodes import ComputedBuffer, ExternKernel, GraphIR, Scatter, StorageView
from ..passes.collectives import is_collective_op, is_wait_op
from .fuse import FusedGroup, Step


@dataclass
class MemoryPlan:
    # step index -> [(buffer, reused buffer or None, 'new' | 'pool' | 'inplace')]
    allocations: dict[int, list[tuple[str, str | None, str]]] = field(default_factory=dict)
    frees: dict[int, list[str]] = field(default_factory=dict)  # freed after the step
    reused: int = 0


def _reads(step: Step) -> list[str]:
    if isinstance(step, ExternKernel):
        return step.input_buffers()
    return list(step.inputs)


def plan_memory(
    steps: list[Step],
    ir: GraphIR,
    donated: dict[str, str] | None = None,
    release_early: bool | None = None,
) -> MemoryPlan:
    """``release_early``: dead storage waits in the pool for a later buffer only while
    nothing allocates fresh storage (held across a fresh allocation it adds to the live
    bytes there); None: so in graphs holding collectives (FSDP2's units, whose dead
    gradients were held through the next units' gathers), where it was measured; other
    graphs keep their dead storage for reuse, as the CPU's allocator pays for fresh
    pages."""
    plan = MemoryPlan()
    donated = donated or {}
    if release_early is None:
        release_early = any(isinstance(s, ExternKernel) and is_collective_op(s.op) for s in steps)
    last_use: dict[str, int] = {}
    for k, step in enumerate(steps):
        for b in _reads(step):
            last_use[b] = k
        if isinstance(step, ExternKernel) and step.kind == "fallback":
            # a fallback may return a view of its input: keep the input alive with it
            pass
    outputs = {o.buffer.name for o in ir.outputs if isinstance(o, StorageView)}
    # fallback outputs may alias their inputs: inputs live as long as the outputs
    for k, step in enumerate(steps):
        if isinstance(step, ExternKernel) and step.kind == "fallback" and _may_alias(step.op):
            ends = [last_use.get(o.name, k) for o in step.outputs]
            alias_end = max(ends, default=k)
            if any(o.name in outputs for o in step.outputs):
                alias_end = len(steps)
            for b in step.input_buffers():
                last_use[b] = max(last_use.get(b, k), alias_end)
    # a collective in flight may read its inputs until its wait: they live until then
    started: dict[str, list[str]] = {}  # a collective's output -> its inputs
    for k, step in enumerate(steps):
        if isinstance(step, ExternKernel) and is_collective_op(step.op):
            for o in step.outputs:
                started[o.name] = step.input_buffers()
        elif isinstance(step, ExternKernel) and is_wait_op(step.op):
            for b in step.input_buffers():
                for src in started.get(b, ()):
                    last_use[src] = max(last_use.get(src, k), k)
    for b in outputs:
        last_use[b] = len(steps)
    owned: set[str] = set()
    pool: list[str] = []  # dead storage the wrapper owns
    pooled_at: dict[str, int] = {}  # a pooled buffer -> the step after which it died
    dying_here: dict[int, list[str]] = {}
    for b, k in last_use.items():
        dying_here.setdefault(k, []).append(b)
    for k, step in enumerate(steps):
        allocs: list[tuple[str, str | None, str]] = []
        if release_early and isinstance(step, ExternKernel) and _allocates(step):
            pool.clear()  # held across fresh storage, dead storage would add to the peak
        if isinstance(step, ExternKernel) and _returns_fresh(step):
            owned.update(o.name for o in step.outputs)
        if isinstance(step, FusedGroup):
            for name in step.outputs:
                buf = ir.buffers[name]
                if isinstance(buf, ComputedBuffer) and isinstance(buf.body, Scatter):
                    # a scatter updates its base (a copy only it reads) in place
                    base = buf.body.base
                    assert base in owned and last_use.get(base) == k, (name, base)
                    owned.discard(base)
                    step.aliases.update((base, name))
                    allocs.append((name, base, "inplace"))
                    owned.add(name)
                    plan.reused += 1
                    continue
                given = donated.get(name)
                if given is not None and _in_place(step, name, k, last_use, {given}, ir) == given:
                    step.aliases.add(given)
                    step.aliases.add(name)
                    allocs.append((name, given, "inplace"))
                    plan.reused += 1
                    continue
                reuse = _pick(pool, buf, ir)
                kind = "pool" if reuse is not None else "new"
                if reuse is None:
                    reuse = _in_place(step, name, k, last_use, owned, ir)
                    if reuse is not None:
                        owned.discard(reuse)  # its storage now belongs to ``name``
                        step.aliases.add(reuse)
                        step.aliases.add(name)
                        kind = "inplace"
                if reuse is not None:
                    if reuse in pool:
                        pool.remove(reuse)
                        pooled_at.pop(reuse, None)
                    plan.reused += 1
                elif release_early:
                    pool.clear()  # fresh storage (above)
                allocs.append((name, reuse, kind))
                owned.add(name)
        plan.allocations[k] = allocs
        freed = [b for b in dying_here.get(k, []) if b not in outputs]
        # owned storage stays referenced (in the pool) until a later buffer takes it over
        plan.frees[k] = [b for b in freed if b not in owned]
        for b in freed:
            if b in owned and b not in pool:
                pool.append(b)
                pooled_at[b] = k
        for name, _, _ in allocs:
            if last_use.get(name) is None and name not in outputs:
                pool.append(name)  # written but never read (dead output)
                pooled_at[name] = k
    # storage no later buffer takes over is freed when it dies: kept in the pool to the
    # graph's end, it counted against the peak (ResNet-50's backward held a dozen dead
    # activation-sized buffers through its last, largest layers)
    for b, k in pooled_at.items():
        plan.frees.setdefault(k, []).append(b)
    return plan


def _allocates(step: ExternKernel) -> bool:
    """Whether a library call allocates storage: a fresh result, or a collective's output
    buffer (its wait hands that buffer back)."""
    return _returns_fresh(step) or is_collective_op(step.op) or is_wait_op(step.op)


def _returns_fresh(step: ExternKernel) -> bool:
    """Whether a library call's results are tensors of their own, which only the wrapper
    references (module docstring)."""
    if is_collective_op(step.op) or is_wait_op(step.op):
        return False
    return getattr(step.op, "_schema", None) is not None and not _may_alias(step.op)


def _may_alias(op: object) -> bool:
    """Whether a fallback's results may share storage with its arguments: an ATen op whose
    schema marks no result as an alias (``Tensor(a)``) returns fresh tensors (the backward
    of a convolution kept its inputs alive to the graph's end because its weight gradient
    is a graph output)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return True
    return any(r.alias_info is not None for r in schema.returns)


def _span_bytes(name: str, ir: GraphIR) -> sympy.Expr:
    lay = ir.buffers[name].layout
    return lay.storage_span() * lay.dtype.itemsize


def _pick(pool: list[str], buf: ComputedBuffer, ir: GraphIR) -> str | None:
    need = _span_bytes(buf.name, ir)
    best, best_size = None, None
    for cand in pool:
        have = _span_bytes(cand, ir)
        other = ir.buffers[cand]
        if other.device != buf.device or other.dtype != buf.dtype:
            continue
        if not (have - need).is_number or have < need:
            continue
        if have > 2 * need:
            continue  # keep big blocks for big buffers
        if best_size is None or have < best_size:
            best, best_size = cand, have
    return best


def _in_place(
    group: FusedGroup, name: str, k: int, last_use: dict[str, int], owned: set[str], ir: GraphIR
) -> str | None:
    store = group.bound[name][2]
    kb = group.block_of(name)
    buf = ir.buffers[name]
    for cand in group.inputs:
        if cand not in owned or last_use.get(cand) != k:
            continue
        if cand in group.opaque_reads:
            continue
        other = ir.buffers[cand]
        if other.layout != buf.layout:
            continue
        ok = True
        for node in group.nodes:
            for b, e in group.bound[node.name][3]:
                if b == cand and (group.block_of(node.name) != kb or sympy.expand(e - store) != 0):
                    ok = False
        # every reader must be in the block at or before the writer; readers after it would
        # see the new values, except in a pointwise block: backends store an output that
        # aliases an input after the whole block has read it (kiln-cpp's pointwise_body,
        # kiln-triton's pointwise)
        if ok and group.blocks[kb].kind != "pointwise":
            names = [n.name for n in group.blocks[kb].nodes]
            pos = names.index(name)
            for later in names[pos + 1 :]:
                if any(b == cand for b, _ in group.bound[later][3]):
                    ok = False
        if ok:
            return cand
    return None
