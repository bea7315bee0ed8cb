"""Common subexpression elimination on the ATen graph (a pass before lowering).

Traced programs repeat work that eager does once per call site: every layer of a
transformers model turns the same boolean attention mask into the same additive float
mask (``where(mask, 0, -inf)`` with two fresh ``scalar_tensor`` constants), so the
compiled graph computed and stored the mask once per layer. Two nodes that call the same
op on the same arguments (after their own arguments were merged) compute the same value;
the later one is replaced by the earlier one.

Only ops that are functions of their arguments are merged: no op with a mutable or aliased
argument, no random op (``nondeterministic_seeded``), no ``empty`` (uninitialized), nothing
with side effects; and no node after a mutating op (or an op of unknown kind) with one
before it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .node_builder import finish_pass


def _pure(target: Any) -> bool:
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if {torch.Tag.nondeterministic_seeded, torch.Tag.nondeterministic_bitwise} & set(target.tags):
        return False  # random numbers
    schema = target._schema
    if "empty" in schema.name:
        return False  # uninitialized memory: each is a buffer of its own
    return not schema.is_mutable and not any(a.alias_info is not None for a in schema.arguments)


def _key(value: Any) -> Any:
    """A hashable stand-in for an argument (nodes by identity; lists, dicts by contents)."""
    if isinstance(value, torch.fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _key(v)) for k, v in value.items())))
    if isinstance(value, float):
        return ("float", str(value))  # -0.0 and 0.0 differ, as do their results
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(value).__name__, str(value))
    if value is None or isinstance(value, (bool, int, str)):
        return (type(value).__name__, value)
    raise TypeError  # an argument we do not know how to compare: keep the node


def eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> int:
    """Merge nodes that compute the same value; returns how many were removed."""
    seen: dict[Any, torch.fx.Node] = {}
    removed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if not _pure(node.target):
            schema = getattr(node.target, "_schema", None)
            if schema is None or schema.is_mutable:
                seen.clear()  # values read after a mutation may differ from before it
            continue
        try:
            key = (node.target, _key(node.args), _key(node.kwargs))
        except TypeError:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        node.replace_all_uses_with(first)
        gm.graph.erase_node(node)
        removed += 1
    return finish_pass(gm, removed, f"common subexpressions: {removed} node(s) merged")
