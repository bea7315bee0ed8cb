"""The graph being lowered and the FX node being lowered, for lowerings to consult."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch.fx

from ..ir.symbols import refine, shape_env

__all__ = ["current_graph", "current_node", "lowering_context", "node_val", "refine"]

if TYPE_CHECKING:
    from ..graph import GraphLowering

_state = threading.local()


@contextmanager
def lowering_context(graph: GraphLowering) -> Iterator[None]:
    prev = getattr(_state, "graph", None)
    _state.graph = graph
    try:
        with shape_env(getattr(graph, "shape_env", None)):
            yield
    finally:
        _state.graph = prev


def current_graph() -> GraphLowering:
    graph = getattr(_state, "graph", None)
    assert graph is not None, "lowering outside of GraphLowering.run"
    return graph


def current_node() -> torch.fx.Node | None:
    return current_graph().current_node


def node_val() -> Any:
    """meta['val'] of the FX node being lowered (its output's shape, strides and dtype)."""
    node = current_node()
    return None if node is None else node.meta.get("val")
