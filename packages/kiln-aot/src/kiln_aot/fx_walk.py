"""A node's ancestry in an FX graph, for the passes that ask whether a value is computed
from constants alone (kiln-aot's causal-mask fold, kiln-inductor's regional reuse)."""

from __future__ import annotations

from collections.abc import Callable

from torch import fx


def ancestry(
    node: fx.Node, admit: Callable[[fx.Node], bool], limit: int | None = None
) -> list[fx.Node] | None:
    """``node`` and every node it is computed from, when ``admit`` accepts each of them
    (and there are at most ``limit``); None as soon as one is refused. Unordered: sort by
    graph position where order matters."""
    order: list[fx.Node] = []
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if (limit is not None and len(seen) > limit) or not admit(n):
            return None
        order.append(n)
        stack.extend(n.all_input_nodes)
    return order
