"""Communication overlaps computation: collectives start early, waits come late.

torch.distributed's functional collectives reach the ATen graph as two ops each: the
collective (``_c10d_functional.all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_to_all_single``, ...), which enqueues the communication
and returns its output buffer at once, and ``_c10d_functional.wait_tensor`` on that
buffer, which blocks until the communication finished. Capture records the wait right
after the collective (where the library's Python calls it), which leaves nothing to
overlap. This pass moves

- each collective up to just after the last node it reads (and never above an earlier
  collective: every rank issues its collectives in the graph's order, so the order is kept),
- each wait down to just before the first node that reads its result,

so the kernels between them run while the data is on the wire. Every rank runs the same
pass over the same graph, so their schedules agree. Both ops are library calls of the
compiled graph (``lowering/extern.py``); while a collective is in flight it may still read
its input, so the memory plan keeps that input's storage until the wait
(``scheduler/memory.py``).
"""

from __future__ import annotations

import torch
import torch.fx

_NAMESPACE = "_c10d_functional"


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


def schedule_collectives(gm: torch.fx.GraphModule) -> int:
    """Hoist collectives and sink their waits (see the module docstring); returns the number
    of nodes moved."""
    graph = gm.graph
    nodes = list(graph.nodes)
    if not any(is_collective(n) for n in nodes):
        return 0
    moved = 0
    # collectives, in order: just after their latest input or the previous collective
    position = {n: k for k, n in enumerate(nodes)}
    floor: torch.fx.Node | None = None
    for node in [n for n in nodes if is_collective(n)]:
        anchors = [*node.all_input_nodes, *([floor] if floor is not None else [])]
        after = max(anchors, key=lambda a: position[a], default=None)
        if after is not None and after.next is not node:
            after.append(node)
            moved += 1
            position = {n: k for k, n in enumerate(graph.nodes)}
        floor = node
    # waits: just before their first reader (the output node when only returned)
    position = {n: k for k, n in enumerate(graph.nodes)}
    for node in [n for n in graph.nodes if is_wait(n)]:
        first = min(node.users, key=lambda u: position[u], default=None)
        if first is None or node.next is first:
            continue
        first.prepend(node)
        moved += 1
        position = {n: k for k, n in enumerate(graph.nodes)}
    if moved:
        graph.lint()
        gm.recompile()
    return moved


__all__ = ["is_collective", "is_collective_op", "is_wait", "is_wait_op", "schedule_collectives"]
