"""NodeBuilder (and traced_tensor): adds ATen nodes to an FX graph with their metadata, for graph passes that
rewrite one node into several (broadcast_bmm.py, patch_conv.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .. import log

aten = torch.ops.aten


def finish_pass(gm: torch.fx.GraphModule, changed: int, message: str) -> int:
    """After a graph pass changed ``changed`` places of ``gm``: lint and recompile it and
    log ``message`` (nothing when it changed nothing); returns ``changed``."""
    if changed:
        gm.graph.lint()
        gm.recompile()
        log.log("graphs", message)
    return changed


def traced_tensor(x: object) -> torch.Tensor | None:
    """The traced tensor metadata (``meta['val']``) of a node, or None (also where its
    shape is symbolic: the graph passes rewrite static shapes only)."""
    val = getattr(x, "meta", {}).get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return val


class NodeBuilder:
    """Adds nodes before ``at``, each with ``meta['val']`` computed from its arguments'
    (on the meta device where they are meta tensors) and ``at``'s other metadata (its
    source location); ``undo()`` removes them again."""

    def __init__(self, graph: torch.fx.Graph, at: torch.fx.Node):
        self.graph, self.at = graph, at
        self.added: list[torch.fx.Node] = []

    def __call__(self, op: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        with self.graph.inserting_before(self.at):
            node = self.graph.call_function(op, args, kwargs)
        meta_args = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
        meta_kwargs = torch.fx.node.map_arg(kwargs, lambda n: n.meta["val"])
        node.meta = {k: v for k, v in self.at.meta.items() if k != "val"}
        node.meta["val"] = op(*meta_args, **meta_kwargs)
        self.added.append(node)
        return node

    def in_layout_of(self, node: torch.fx.Node, like: torch.Tensor) -> torch.fx.Node:
        """``node`` with the strides of ``like`` (a clone unless it has them already)."""
        if node.meta["val"].stride() == like.stride():
            return node
        fmt = (
            torch.channels_last
            if like.dim() == 4 and like.is_contiguous(memory_format=torch.channels_last)
            else torch.contiguous_format
        )
        return self(aten.clone.default, node, memory_format=fmt)

    def undo(self) -> None:
        for node in reversed(self.added):
            self.graph.erase_node(node)
        self.added.clear()
