"""fuse_nodes: group scheduler nodes into kernels.

Before: ``GraphIR.nodes`` in program order. After: a list of steps, each a ``FusedGroup``
(one generated kernel) or an ``ExternKernel`` (an ATen call), in an order that respects
every dependency.

A group has *outer* loops shared by all its members (the longest common prefix of their
iteration ranges; parallel) and a sequence of *blocks* inside them, each an inner loop nest
(vectorized) over the rest of a member's ranges: a pointwise block holds nodes of equal
inner ranges computed in one loop, a reduction block holds reductions over equal ranges
computed in one pass. Pointwise chains are already one body (inlined at lowering), so
this fuses: pointwise → reduction → pointwise (softmax, layer_norm: one kernel), and
independent nodes sharing an iteration space: with the kernel just before them, or with an
earlier one they share a buffer with and no library call in between (``_shares_data``).

A member may read a buffer another member writes only when, for every outer iteration, it
reads exactly what that iteration wrote (checked on the affine index), and inside one
block only at the very index it was written. Buffers that no one outside the group reads
stay in registers (``FusedGroup.local``).

Loop order: each node's loops follow the stride order of the buffer it writes (see
``access``). The members of a group that have the logical size of its first node share
one order (``group_order``): the one most of them write in (ties: the first node's), so a
contiguous copy of an NHWC value fuses with it in one flat loop. A group holding a member
whose loops are not in logical order is kept to the shapes that stay parallel over the
outer loops (``_row_shaped``): flat pointwise loops, or rows that reductions reduce (loop
orders that disagree would otherwise leave a short common outer prefix, e.g. only N, with
the rest run inside each program). Where memory order gives no group, logical order is
tried, rows only: an NHWC value and its sum over (H, W) fuse as rows over (N, C), the
value read once and stored strided.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import sympy

from ..ir.nodes import ComputedBuffer, ExternKernel, GraphIR, Reduction, Scan, Scatter, StorageView
from ..ir.symbols import (
    Expr,
    coefficients,
    contiguous_strides,
    index_vars,
    is_size_symbol,
    simplify_index,
    size_hint,
    statically_less,
    upper_bound,
)
from .access import Access, node_access, own_order
from .refine import refine_to_finest

MAX_GROUP_NODES = 48
# a node that shares data with a kernel at most this many steps back joins it even across
# library calls (its output lives that much longer): a backward's GELU gradient joins the
# kernel that recomputes the GELU for the weight gradient's matmul, both reading the saved
# pre-activation
MAX_STEPS_BACK = 2


@dataclass
class Block:
    kind: str  # "pointwise" | "reduction" | "welford" | "scan" | "scatter"
    inner: tuple[Expr, ...]  # non-reduced inner ranges
    rranges: tuple[Expr, ...]
    vars: tuple[sympy.Symbol, ...]
    rvars: tuple[sympy.Symbol, ...]
    nodes: list[ComputedBuffer] = field(default_factory=list)


@dataclass
class FusedGroup:
    name: str
    nodes: list[ComputedBuffer]
    outer: tuple[Expr, ...]
    outer_vars: tuple[sympy.Symbol, ...]
    blocks: list[Block]
    # for each node: (its body's index and reduction index in the group's loop variables
    # (0 for dimensions of size 1, which get no loop), store index, loads)
    bound: dict[str, tuple[list[Expr], list[Expr], Expr, list[tuple[str, Expr]]]]
    local: set[str] = field(default_factory=set)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    aliases: set[str] = field(default_factory=set)  # arguments that may share storage
    # inputs read at indices the members' loads do not show (a template's matmul operands):
    # memory planning never writes an output over them
    opaque_reads: set[str] = field(default_factory=set)

    def block_of(self, name: str) -> int:
        for k, b in enumerate(self.blocks):
            if any(n.name == name for n in b.nodes):
                return k
        raise KeyError(name)


Step = FusedGroup | ExternKernel


class AccessTable(dict[str, Access]):
    """Each node's accesses in its own loop order (``table[name]``), and, computed once, in
    another order (``in_order``)."""

    def __init__(self, nodes: Sequence[ComputedBuffer]):
        super().__init__((n.name, node_access(n)) for n in nodes)
        self._other: dict[tuple[str, tuple[int, ...]], Access] = {}

    def in_order(self, node: ComputedBuffer, order: tuple[int, ...]) -> Access:
        if order == own_order(node):
            return self[node.name]
        key = (node.name, order)
        if key not in self._other:
            self._other[key] = node_access(node, order)
        return self._other[key]


def _size(node: ComputedBuffer) -> tuple[Expr, ...] | None:
    if node.body is None or isinstance(node.body, (Scan, Scatter)):
        return None
    return tuple(node.body.size)


def group_order(nodes: Sequence[ComputedBuffer]) -> tuple[int, ...] | None:
    """The loop order of the members with the first node's logical size: the one most of
    them write in, the first node's on a tie (None for a scan)."""
    size = _size(nodes[0])
    if size is None:
        return None
    votes = Counter(own_order(n) for n in nodes if _size(n) == size)
    first = own_order(nodes[0])
    return max(votes, key=lambda o: (votes[o], o == first))


def _common_prefix(seqs: Sequence[Sequence[Expr]]) -> tuple[Expr, ...]:
    out: list[Expr] = []
    for items in zip(*seqs):
        if all(x == items[0] for x in items):
            out.append(items[0])
        else:
            break
    return tuple(out)


def _dense_inner(
    store: Expr,
    outer_vars: Sequence[sympy.Symbol],
    inner_vars: Sequence[sympy.Symbol],
    inner: Sequence[Expr],
) -> tuple[list[Expr], Expr] | None:
    """(outer strides, inner extent) when the store covers [0, extent) for each outer index."""
    co = coefficients(store, [*outer_vars, *inner_vars])
    if co is None or co[1] != 0:
        return None
    outer_strides = co[0][: len(outer_vars)]
    pairs = sorted(
        ((s, n) for s, n in zip(co[0][len(outer_vars) :], inner) if n != 1), key=lambda p: str(p[0])
    )
    ordered = sorted(pairs, key=lambda p: _stride_hint(p[0]), reverse=True)
    sizes = [n for _, n in ordered]
    strides = [s for s, _ in ordered]
    if [sympy.expand(a - b) for a, b in zip(strides, contiguous_strides(sizes))] != [0] * len(
        strides
    ):
        return None
    extent: Expr = sympy.Integer(1)
    for n in sizes:
        extent = extent * n
    return outer_strides, extent


def _stride_hint(stride: Expr) -> int:
    """A stride's value at the size symbols' hints (0 when it is not a size expression)."""
    try:
        return size_hint(sympy.sympify(stride))
    except (ValueError, TypeError):
        return 0


def _row_shaped(blocks: Sequence[Block]) -> bool:
    """Every block is a flat pointwise loop, a reduction with no inner loops, or a pointwise
    loop over a row that a reduction block reduces."""
    rows = {b.rranges for b in blocks if b.kind in ("reduction", "welford")}
    for b in blocks:
        if not b.inner:
            continue
        if b.kind != "pointwise" or b.inner not in rows:
            return False
    return True


def plan_group(name: str, nodes: list[ComputedBuffer], table: AccessTable) -> FusedGroup | None:
    """Loops and blocks for ``nodes`` as one kernel, or None if they cannot share one.

    In memory order first (``group_order``); where that fails and a member's loops were
    reordered, in logical order, if that gives rows (an NHWC value and its reduction over
    H, W: one kernel over (N, C) rows, reading the value once, rather than two)."""
    order = group_order(nodes)
    size = _size(nodes[0])
    accesses = {
        n.name: table.in_order(n, order)
        if order is not None and _size(n) == size
        else table[n.name]
        for n in nodes
    }
    plan = _plan(name, nodes, accesses)
    if plan is None and len(nodes) > 1 and any(table[n.name].reordered for n in nodes):
        logical = {
            n.name: table[n.name]
            if _size(n) is None
            else table.in_order(n, tuple(range(len(n.body.size))))  # type: ignore[union-attr]
            for n in nodes
        }
        plan = _plan(name, nodes, logical, rows_only=True)
    return plan


def _plan(
    name: str, nodes: list[ComputedBuffer], accesses: dict[str, Access], rows_only: bool = False
) -> FusedGroup | None:
    if len(nodes) > 1:
        accesses = refine_to_finest(accesses)
    ranges = [accesses[n.name].ranges for n in nodes]
    outer = _common_prefix(ranges)
    if not outer and any(r for r in ranges) and len(nodes) > 1:
        return None
    if (
        len(nodes) > 1
        and any(s == 1 for s in outer)
        and sympy.prod(outer) == 1
        and any(r for r in ranges)
    ):
        return None
    ovars = tuple(sympy.Symbol(f"x{k}", integer=True, nonnegative=True) for k in range(len(outer)))
    blocks: list[Block] = []
    bound: dict[str, tuple[list[Expr], list[Expr], Expr, list[tuple[str, Expr]]]] = {}
    written: dict[str, int] = {}  # buffer -> block index
    for node in nodes:
        acc = accesses[node.name]
        kind = "pointwise"
        if isinstance(node.body, Reduction):
            kind = "welford" if node.body.reduction_type.startswith("welford") else "reduction"
        elif isinstance(node.body, (Scan, Scatter)):
            if len(nodes) > 1:
                return None  # a scan or a scatter is a kernel of its own
            kind = "scan" if isinstance(node.body, Scan) else "scatter"
        inner = acc.ranges[len(outer) :]
        rr = acc.rranges
        # a load of a member at a data-dependent index fails the affine checks below
        reads_group = [ld for ld in acc.loads if ld[0] in written]
        last = blocks[-1] if blocks else None
        same = last is not None and last.kind == kind and last.inner == inner and last.rranges == rr
        if same and kind != "pointwise":
            same = not any(written[b] == len(blocks) - 1 for b, _ in reads_group)
        candidates = [last] if same else []
        chosen: Block | None = None
        for block in [*candidates, None]:
            if block is None:
                k = len(blocks)
                bvars = tuple(
                    sympy.Symbol(f"y{k}_{j}", integer=True, nonnegative=True)
                    for j in range(len(inner))
                )
                brvars = tuple(
                    sympy.Symbol(f"z{k}_{j}", integer=True, nonnegative=True)
                    for j in range(len(rr))
                )
                block = Block(kind, inner, rr, bvars, brvars)
            vars_ = [*ovars, *block.vars]
            subs = dict(zip(acc.vars, vars_)) | dict(zip(acc.rvars, block.rvars))
            var_ranges = (
                dict(zip(ovars, outer)) | dict(zip(block.vars, inner)) | dict(zip(block.rvars, rr))
            )
            loads = [
                (b, simplify_index(sympy.expand(e.xreplace(subs)), var_ranges))
                for b, e in acc.loads
            ]
            store = sympy.expand(acc.store.xreplace(subs))
            ok = True
            this_block = len(blocks) if block not in blocks else blocks.index(block)
            for b, e in loads:
                if b not in written:
                    continue
                wb = written[b]
                wvars, _, wstore, _ = bound[b]
                if wb == this_block:
                    if sympy.expand(e - wstore) != 0:
                        ok = False
                        break
                    continue
                wblock = blocks[wb]
                dense = _dense_inner(wstore, ovars, wblock.vars, wblock.inner)
                if dense is None:
                    ok = False
                    break
                co = coefficients(e, list(ovars))
                if co is None or [sympy.expand(c) for c in co[0]] != [
                    sympy.expand(c) for c in dense[0]
                ]:
                    ok = False
                    break
                rest = co[1]
                loop_syms = {v for v in rest.free_symbols if not is_size_symbol(v)}
                if not loop_syms <= set(block.vars) | set(block.rvars):
                    ok = False
                    break
                if not _within(rest, var_ranges, dense[1]):
                    ok = False
                    break
            if ok:
                chosen = block
                if block not in blocks:
                    blocks.append(block)
                block.nodes.append(node)
                index = [sympy.sympify(e).xreplace(subs) for e in acc.index]
                rindex = [sympy.sympify(e).xreplace(subs) for e in acc.rindex]
                bound[node.name] = (index, rindex, store, loads)
                written[node.name] = blocks.index(block)
                break
        if chosen is None:
            return None
    reordered = any(a.reordered for a in accesses.values())
    if len(nodes) > 1 and (rows_only or reordered) and not _row_shaped(blocks):
        return None
    if len(nodes) > 1:
        rows = {b.rranges for b in blocks if b.kind in ("reduction", "welford")}
        if any(_sequential(b, rows) for b in blocks):
            return None
    return FusedGroup(name, list(nodes), outer, ovars, blocks, bound)


# a reduction block's inner loops run one after another inside each program (backends have
# no parallel dimension left for them): past this many iterations the group is not formed
MAX_SEQUENTIAL_INNER = 8


def _sequential(block: Block, rows: set[tuple[Expr, ...]]) -> bool:
    """Whether ``block`` runs a long sequential inner loop inside each program, the group's
    outer loops being all the parallelism a backend has:

    - a reduction (or scan) with inner loops: a layer_norm over C of an NCHW value grouped
      with its NCHW output shares only the outer loop over N, and each of N programs
      reduced all H*W rows in turn (timm ConvNeXt's LayerNorm2d on the H200: 7 ms per call
      in 5 such kernels against 0.8 ms for all of eager's kernels);
    - a pointwise block whose inner loops are not a row a reduction of the group reduces
      (``rows``): two independent values of different shapes that share only their batch
      dimension (a ResNet backward's recomputed ReLU of (N, 1024, H, W) beside a
      convolution gradient of (N, 2048, H/2, W/2)) ran as N programs, each looping over
      C*H*W elements (timm ResNet-50, batch 64, on the H200: 10.7 ms per training step in
      seven such kernels)."""
    if not block.inner:
        return False
    if block.kind == "pointwise" and block.inner in rows:
        return False
    n = sympy.prod(block.inner)
    return not (n.is_number and int(n) <= MAX_SEQUENTIAL_INNER)


def _within(rest: Expr, var_ranges: dict[sympy.Symbol, Expr], extent: Expr) -> bool:
    """0 <= rest <= extent - 1 over the loop ranges (rest affine, coefficients >= 0)."""
    syms = sorted((v for v in rest.free_symbols if not is_size_symbol(v)), key=str)
    co = coefficients(rest, syms)
    # coefficients may be sizes (products of the positive size symbols)
    if co is None or not co[1].is_nonnegative:
        return False
    if any(not c.is_nonnegative for c in co[0]):
        return False
    ub = upper_bound(rest, var_ranges)
    return ub is not None and statically_less(ub, extent)


def _users(ir: GraphIR, accesses: AccessTable) -> dict[str, set[str]]:
    users: dict[str, set[str]] = {}
    for node in ir.nodes:
        reads = (
            [b for b, _ in accesses[node.name].loads]
            if isinstance(node, ComputedBuffer)
            else node.input_buffers()
        )
        for b in reads:
            users.setdefault(b, set()).add(node.name)
    for out in ir.outputs:
        if isinstance(out, StorageView):
            users.setdefault(out.buffer.name, set()).add("<output>")
    return users


def fuse_nodes(ir: GraphIR) -> list[Step]:
    accesses = AccessTable([n for n in ir.nodes if isinstance(n, ComputedBuffer)])
    users = _users(ir, accesses)
    steps: list[Step] = []
    where: dict[str, int] = {}  # buffer -> step index
    count = 0
    last_extern = -1  # position of the last library call in ``steps``
    graph_outputs = {o.buffer.name for o in ir.outputs if isinstance(o, StorageView)}
    for node in ir.nodes:
        if isinstance(node, ExternKernel):
            last_extern = len(steps)
            steps.append(node)
            for out in node.outputs:
                where[out.name] = len(steps) - 1
            continue
        reads = {b for b, _ in accesses[node.name].loads}
        deps = [b for b in reads if b in where]
        first = max((where[b] for b in deps), default=0)
        placed = False
        for pos in range(first, len(steps)):
            step = steps[pos]
            if not isinstance(step, FusedGroup) or len(step.nodes) >= MAX_GROUP_NODES:
                continue
            if pos < len(steps) - 1:
                shares = _shares_data(step, reads, accesses)
                near = len(steps) - 1 - pos <= MAX_STEPS_BACK
                if not shares or (
                    pos < last_extern and node.name not in graph_outputs and not near
                ):
                    continue  # moved earlier, its output would stay alive longer
            plan = plan_group(step.name, [*step.nodes, node], accesses)
            if plan is not None:
                steps[pos] = plan
                where[node.name] = pos
                placed = True
                break
        if not placed:
            plan = plan_group(f"kernel{count}", [node], accesses)
            count += 1
            assert plan is not None, node.name
            steps.append(plan)
            where[node.name] = len(steps) - 1
    for step in steps:
        if isinstance(step, FusedGroup):
            _finish_group(step, users)
    from .order import hoist_checked  # (order.py imports this module)

    return hoist_checked(steps, accesses)


def _shares_data(group: FusedGroup, reads: set[str], accesses: AccessTable) -> bool:
    """Whether a node reading ``reads`` reads a buffer ``group`` writes or reads: then
    computing it in that earlier kernel saves memory traffic. Otherwise (or with a library
    call in between) it joins only the last kernel, in program order: moved earlier, to
    the first kernel whose loops fit, its output would stay alive from there on (a
    backward's recomputed activations of every layer, all at its start). A graph output
    lives to the end anyway, so it moves across library calls into a kernel that shares its
    data: a forward's saved ``mm + bias`` is stored by the kernel that already reads the
    matmul for the activation, instead of by a kernel of its own at the graph's end, which
    read the matmul's output again and kept it alive until then."""
    for member in group.nodes:
        if member.name in reads or any(b in reads for b, _ in accesses[member.name].loads):
            return True
    return False


def _finish_group(group: FusedGroup, users: dict[str, set[str]]) -> None:
    """Mark the members that stay in registers (``local``) and list the kernel's arguments.

    A member is local when no one outside the group reads it and every reader's load of it
    is at its store index (a backend forwards the stored value by that index): a reduction
    to one value per outer iteration, read by later blocks of the same iteration, or a
    pointwise value read in its own block at the index it was written."""
    members = {n.name for n in group.nodes}
    for node in group.nodes:
        readers = users.get(node.name, set())
        if not readers or not readers <= members:
            continue
        kb = group.block_of(node.name)
        block = group.blocks[kb]
        store = group.bound[node.name][2]
        at_store = all(
            sympy.expand(e - store) == 0
            for r in readers
            for b, e in group.bound[r][3]
            if b == node.name
        )
        if not at_store:
            continue
        if block.kind != "pointwise":
            if not block.inner:
                group.local.add(node.name)
            continue
        if all(group.block_of(r) == kb for r in readers):
            group.local.add(node.name)
    reads: list[str] = []
    for node in group.nodes:
        for b, _ in group.bound[node.name][3]:
            if b not in members and b not in reads:
                reads.append(b)
    group.inputs = reads
    group.outputs = [n.name for n in group.nodes if n.name not in group.local]


def loop_var_ranges(group: FusedGroup, block: Block) -> dict[sympy.Symbol, Expr]:
    return (
        dict(zip(group.outer_vars, group.outer))
        | dict(zip(block.vars, block.inner))
        | dict(zip(block.rvars, block.rranges))
    )


_ = index_vars
