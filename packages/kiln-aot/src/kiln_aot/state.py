"""Per-tensor bookkeeping of a running trace: which graph node holds a fake's value, which
storage it aliases and through which views.

# Aliasing model

Every traced tensor belongs to a ``StorageState`` (one per eager storage). The storage's
*root* is the tensor that created it (a graph input, an op output or a constant); every
other tensor of the storage is the root seen through a chain of ``ViewStep``s. Values in
the graph are immutable: a write through any alias produces new nodes, makes them the
root's value and bumps the storage's ``version``; aliases whose ``version`` is older are
regenerated (their view chain replayed on the root's new value) when next read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

if TYPE_CHECKING:
    from kiln_aot.fake import FakeTensor
    from kiln_aot.op_tracer import Tracer


@dataclass(frozen=True)
class ViewStep:
    """One view op applied to the previous alias: ``op(prev, *args)`` (the positional
    arguments, defaults filled in)."""

    op: torch._ops.OpOverload
    args: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.op}{self.args}"


@dataclass(eq=False)
class StorageState:
    root: FakeTensor
    version: int = 0
    input_index: int | None = None
    mutation_order: int | None = None  # when a graph input's storage was first written


@dataclass(eq=False)
class TensorState:
    tracer: Tracer
    node: fx.Node
    storage: StorageState
    views: tuple[ViewStep, ...]
    version: int


def bind_args(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[Any, ...]:
    """All of ``op``'s arguments positionally, defaults filled in (kwarg-only ones too)."""
    out = []
    for i, arg in enumerate(op._schema.arguments):
        if i < len(args):
            out.append(args[i])
        elif arg.name in kwargs:
            out.append(kwargs[arg.name])
        elif arg.has_default_value():
            out.append(arg.default_value)
        else:
            out.append(None)
    return tuple(out)
