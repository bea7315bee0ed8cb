"""Communication overlaps computation: collectives start early, waits come late.

torch.distributed's functional collectives reach the ATen graph as two ops each: the
collective (``_c10d_functional.all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_to_all_single``, ...), which enqueues the communication
and returns its output buffer at once, and ``_c10d_functional.wait_tensor`` on that
buffer, which blocks until the communication finished. Capture records the wait right
after the collective (where the library's Python calls it), which leaves nothing to
overlap. This pass moves

- each view of a collective's result (a ``narrow`` to unpadded rows, a transpose), and
  each other op computed from results alone (the copies that take a coalesced
  all-gather's parameters out of its buffer), down to just before its first reader, so
  that what reads the result is where it is used,
- each wait down to just before the first node that reads its result,
- each collective up to just after the last node it reads (and never above an earlier
  collective: every rank issues its collectives in the graph's order, so the order is
  kept), except the collectives of a *group* (below), which also bound their waits;
  the ops that only pack its input (views, copies, casts, padding, concatenation; a
  coalesced all-gather's flattening of a unit's shards) and that nothing else reads move
  with it, to just before it, so that packing a buffer does not hold the collective
  where its input was packed,

so the kernels between them run while the data is on the wire. Every rank runs the same
pass over the same graph, so their schedules agree. Both ops are library calls of the
compiled graph (``lowering/extern.py``); while a collective is in flight it may still read
its input, so the memory plan keeps that input's storage until the wait
(``scheduler/memory.py``).

# Prefetch groups

A collective tagged ``meta["collective_group"]`` (a key kiln-aot carries from the
torch-level node: kiln's FSDP graph tags each all-gather of a sharded unit's parameters
with the unit) is a load that its group needs only where the group is first used; started
when its input exists (the graph's start), every group's result would be alive at once
(the whole unsharded model). Groups the graph reads (not only returns) are ranked by their
first use (the earliest reader of any of their collectives, once waits are sunk); group
``i``'s collectives start just before the first use of group ``i - prefetch``
(``KILN_PREFETCH_GROUPS``, default 1: the next unit's gather is in flight while the
current unit computes), or just after their inputs where those come later; the first
``prefetch`` groups start after their inputs. A negative ``prefetch`` hoists them as any
other collective. Grouped collectives may so pass other collectives: the order is then a
function of the graph's nodes and their order, the same on ranks whose graphs differ only
in sizes (kiln's FSDP graph pads every rank's shard where any rank's needs it, so that
its ranks' graphs have the same nodes).

Groups also bound what is in flight: a grouped collective is waited on no later than just
before the first collective of the group of the same op issued ``max(prefetch, 1)`` groups
after its own (with 1: the next group's collectives start once this group's are done, as
eager FSDP2 waits for one unit's reduce-scatter when it issues the next). Gathers are
waited on about there anyway; the reduce-scatters of FSDP's gradients (grouped per unit
too), whose results only the graph's output reads, would otherwise be waited on at the
backward's end, holding every unit's unsharded gradient until then.

# One collective in flight on the CPU

Collectives over CPU tensors (gloo) are waited on before the next one starts: each wait
moves up to just before the next CPU collective where it came later. Communication still
overlaps the computation between a collective and the next one, but two never run at
once. torch 2.13's ProcessGroupGloo runs queued collectives on two worker threads, and
several of them in flight at once with different sizes corrupt the heap within gloo's tcp
transport on 4 ranks (a crash inside gloo's ring allreduce, ``malloc(): unaligned tcache
chunk detected`` or a segfault; kiln's 4-rank FSDP2 test crashed so in CI), reproduced
with torch alone (``tools/gloo_inflight_repro.py``: 4 processes each issuing
``_c10d_functional`` reduce-scatters of 8 to 1024 elements and all-gathers, four of each
before their waits; a race: 3 crashes in 9 runs one hour, none in 15 the next; waited one
at a time, none). Eager PyTorch on gloo (FSDP2's CPU path) waits on each before the next.
Collectives on an accelerator (NCCL) keep every one in flight that the schedule above
allows; ``KILN_CPU_COLLECTIVES_IN_FLIGHT`` sets the bound on the CPU (0: none, for a torch
whose gloo passes the script).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable

import torch
import torch.fx

from kiln_aot.core_ops import VIEW_OPS

from ..config import read_config

_NAMESPACE = "_c10d_functional"
GROUP = "collective_group"

aten = torch.ops.aten
# ops that only pack a collective's input (module docstring): they move with it
_PACKING = VIEW_OPS | {
    aten.cat.default,
    aten.clone.default,
    aten.constant_pad_nd.default,
    aten._to_copy.default,
}


def is_collective(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and is_collective_op(node.target)


def is_wait(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and is_wait_op(node.target)


def is_collective_op(op: object) -> bool:
    """A collective start (its communication runs in the background until its wait)."""
    return _op_name(op) not in (None, "wait_tensor")


def is_wait_op(op: object) -> bool:
    return _op_name(op) == "wait_tensor"


def _op_name(op: object) -> str | None:
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != _NAMESPACE:
        return None
    return op._opname


def schedule_collectives(gm: torch.fx.GraphModule, prefetch: int | None = None) -> int:
    """Sink views of collective results and waits, then place each collective (see the
    module docstring); ``prefetch`` defaults to ``KILN_PREFETCH_GROUPS``. Returns the
    number of graph positions whose node changed."""
    graph = gm.graph
    before = list(graph.nodes)
    if not any(is_collective(n) for n in before):
        return 0
    if prefetch is None:
        prefetch = read_config().prefetch_groups
    _sink_views(graph)
    _sink_waits(graph)
    order = list(graph.nodes)
    packing = _packing(order)
    after = _placed(order, _issue_points(order, prefetch, packing), packing)
    after = _bounded_waits(after, prefetch)
    after = _cpu_collectives_in_flight(after, read_config().cpu_collectives_in_flight)
    prev = None
    for node in after:
        if prev is not None and prev.next is not node:
            prev.append(node)
        prev = node
    moved = sum(a is not b for a, b in zip(before, after))
    if moved:
        graph.lint()
        gm.recompile()
    return moved


def _positions(graph: torch.fx.Graph) -> dict[torch.fx.Node, int]:
    return {n: k for k, n in enumerate(graph.nodes)}


def _of_wait(node: torch.fx.Node) -> bool:
    """A wait, or a view (of a view ...) of a wait's result."""
    while node.op == "call_function" and node.target in VIEW_OPS:
        node = node.args[0]
    return is_wait(node)


def _only_returned(collective: torch.fx.Node, derived: set[torch.fx.Node]) -> bool:
    """Only the graph's output reads the collective's result (through its waits and ops
    computed from results alone: a coalesced reduce-scatter's gradients split out of its
    buffer)."""
    if not all(is_wait(u) for u in collective.users):
        return False
    readers = [r for w in collective.users for r in w.users]
    while readers:
        r = readers.pop()
        if r.op != "output":
            if r not in derived:
                return False
            readers.extend(r.users)
    return True


def _from_results(nodes: Iterable[torch.fx.Node]) -> set[torch.fx.Node]:
    """The ops that compute from collectives' results alone (waits, and such ops of them),
    are neither collectives nor waits, and write nothing: each can run anywhere before its
    first reader."""
    found: set[torch.fx.Node] = set()
    for node in nodes:
        if node.op != "call_function" or is_collective(node) or is_wait(node):
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            continue
        inputs = node.all_input_nodes
        if inputs and all(is_wait(a) or a in found for a in inputs):
            found.add(node)
    return found


def _sink_views(graph: torch.fx.Graph) -> None:
    """Each view of a wait's result, and each op computed from results alone, just before
    its first reader (the last ones first)."""
    derived = _from_results(graph.nodes)
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or not node.users:
            continue
        view = node.target in VIEW_OPS and _of_wait(node.args[0])
        if not (view or node in derived):
            continue
        position = _positions(graph)
        first = min(node.users, key=lambda u: position[u])
        if node.next is not first:
            first.prepend(node)


def _sink_waits(graph: torch.fx.Graph) -> None:
    """Each wait just before its first reader (the output node when only returned)."""
    position = _positions(graph)
    for node in [n for n in graph.nodes if is_wait(n)]:
        first = min(node.users, key=lambda u: position[u], default=None)
        if first is None or node.next is first:
            continue
        first.prepend(node)
        position = _positions(graph)


def _packing(order: list[torch.fx.Node]) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """For each collective, the ops that only pack its input and that only it reads
    (through each other), in ``order``'s order: they move with it."""
    found: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for k, c in enumerate(order):
        if not is_collective(c):
            continue
        chain = {c}
        for n in reversed(order[:k]):
            if (
                n.op == "call_function"
                and n.target in _PACKING
                and n.users
                and all(u in chain for u in n.users)
            ):
                chain.add(n)
        chain.discard(c)
        if chain:
            found[c] = [n for n in order[:k] if n in chain]
    return found


def _issue_points(
    order: list[torch.fx.Node],
    prefetch: int,
    packing: dict[torch.fx.Node, list[torch.fx.Node]],
) -> dict[torch.fx.Node, int]:
    """For each collective, the index in ``order`` right after which it is issued (its
    packing ops with it: what they read is its input)."""
    pos = {n: k for k, n in enumerate(order)}
    collectives = [n for n in order if is_collective(n)]
    groups: dict[Hashable, list[torch.fx.Node]] = defaultdict(list)
    if prefetch >= 0:
        for c in collectives:
            if c.meta.get(GROUP) is not None:
                groups[c.meta[GROUP]].append(c)
    first_use = {
        key: min((pos[u] for c in members for u in c.users), default=len(order))
        for key, members in groups.items()
    }
    derived = _from_results(order)
    returned = [
        k for k, members in groups.items() if all(_only_returned(c, derived) for c in members)
    ]
    for key in returned:
        del groups[key], first_use[key]  # nothing to fetch ahead of
    ranked = sorted(groups, key=lambda key: (first_use[key], pos[groups[key][0]]))
    bound = {
        key: first_use[ranked[i - prefetch]] - 1 for i, key in enumerate(ranked) if i >= prefetch
    }
    points: dict[torch.fx.Node, int] = {}
    floor = -1  # ungrouped: never above the previous ungrouped collective
    for c in collectives:
        packed = set(packing.get(c, ()))
        reads = {a for n in (c, *packed) for a in n.all_input_nodes if a not in packed}
        inputs = max((points.get(a, pos[a]) for a in reads), default=-1)
        key = c.meta.get(GROUP)
        if key not in groups:
            points[c] = floor = max(inputs, floor)
        else:
            points[c] = max(inputs, bound.get(key, -1))
    return points


def _placed(
    order: list[torch.fx.Node],
    points: dict[torch.fx.Node, int],
    packing: dict[torch.fx.Node, list[torch.fx.Node]],
) -> list[torch.fx.Node]:
    """``order`` with each collective, its packing ops just before it, right after the
    last other node at or before its issue point (collectives at one point in
    issue-point, then graph order)."""
    pos = {n: k for k, n in enumerate(order)}
    moving = set(points) | {n for chain in packing.values() for n in chain}
    anchor_at: list[torch.fx.Node | None] = []
    last = None
    for n in order:
        if n not in moving:
            last = n
        anchor_at.append(last)
    after: dict[torch.fx.Node | None, list[torch.fx.Node]] = defaultdict(list)
    for c in sorted(points, key=lambda c: (points[c], pos[c])):
        anchor = anchor_at[points[c]] if points[c] >= 0 else None
        after[anchor] += [*packing.get(c, ()), c]
    out = list(after[None])
    for n in order:
        if n not in moving:
            out.append(n)
            out.extend(after.get(n, ()))
    return out


def _bounded_waits(order: list[torch.fx.Node], prefetch: int) -> list[torch.fx.Node]:
    """``order`` with each grouped collective's wait no later than just before the first
    collective of the group of the same op issued ``max(prefetch, 1)`` groups after its
    own: at most that many groups of one op in flight (a gradient's reduce-scatter, whose
    result only the graph's output reads, keeps its input alive until its wait)."""
    if prefetch < 0:
        return order
    ahead = max(prefetch, 1)
    pos = {n: k for k, n in enumerate(order)}
    groups: dict[Hashable, list[torch.fx.Node]] = defaultdict(list)
    for n in order:
        if is_collective(n) and n.meta.get(GROUP) is not None:
            groups[n.meta[GROUP]].append(n)
    by_op: dict[object, list[Hashable]] = defaultdict(list)  # in issue order
    for key in sorted(groups, key=lambda key: pos[groups[key][0]]):
        by_op[groups[key][0].target].append(key)
    early: dict[torch.fx.Node, list[torch.fx.Node]] = defaultdict(list)  # before -> waits
    for ranked in by_op.values():
        for key, later in zip(ranked, ranked[ahead:]):
            limit = groups[later][0]
            for c in groups[key]:
                if pos[c] < pos[limit]:
                    early[limit] += [w for w in c.users if is_wait(w) and pos[w] > pos[limit]]
    if not early:
        return order
    moved = {w for waits in early.values() for w in waits}
    out = []
    for n in order:
        out.extend(sorted(early.get(n, ()), key=lambda w: pos[w]))
        if n not in moved:
            out.append(n)
    return out


def _on_cpu(collective: torch.fx.Node) -> bool:
    """The collective communicates CPU tensors (its result's device as the graph records
    it; hand-built graphs without one are left alone)."""
    val = collective.meta.get("val")
    if not isinstance(val, torch.Tensor):
        val = next((a.meta.get("val") for a in collective.all_input_nodes), None)
    return isinstance(val, torch.Tensor) and val.device.type == "cpu"


def _cpu_collectives_in_flight(order: list[torch.fx.Node], most: int) -> list[torch.fx.Node]:
    """``order`` with at most ``most`` CPU collectives in flight (0: any number): where
    another starts, the waits of the earliest ones still in flight move up to just before
    it (module docstring, "One collective in flight on the CPU")."""
    if most <= 0:
        return order
    early: dict[torch.fx.Node, list[torch.fx.Node]] = defaultdict(list)  # before -> waits
    moved: set[torch.fx.Node] = set()
    flying: list[torch.fx.Node] = []  # CPU collectives issued whose waits come later
    for n in order:
        if is_wait(n) and n not in moved:
            flying = [c for c in flying if c is not n.args[0]]
        elif is_collective(n) and _on_cpu(n):
            while len(flying) >= most:
                waits = [w for w in flying.pop(0).users if is_wait(w) and w not in moved]
                early[n] += waits
                moved.update(waits)
            flying.append(n)
    if not early:
        return order
    out = []
    for n in order:
        out.extend(early.get(n, ()))
        if n not in moved:
            out.append(n)
    return out


__all__ = ["is_collective", "is_collective_op", "is_wait", "is_wait_op", "schedule_collectives"]
