"""The table of lowerings: one entry per ATen overload, registered beside its op family.

``LOWERINGS[overload] = fn``: ``fn(*args, **kwargs)`` receives ``TensorValue`` for tensor
arguments and Python values for the rest, and returns a ``TensorValue`` (or a tuple of
them). ``EXTERN_OPS`` are overloads we deliberately call from ATen (mm, convolution...);
``FALLBACK_OPS`` are ops we know run eagerly (data-dependent shapes, random numbers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

LOWERINGS: dict[Any, Callable[..., Any]] = {}
EXTERN_OPS: set[Any] = set()
FALLBACK_OPS: dict[Any, str] = {}


def _overloads(op: Any) -> list[Any]:
    """An OpOverloadPacket stands for all of its overloads."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def register_lowering(*ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            for overload in _overloads(op):
                LOWERINGS[overload] = fn
        return fn

    return wrap


def register_extern(*ops: Any) -> None:
    for op in ops:
        EXTERN_OPS.update(_overloads(op))


def register_fallback(reason: str, *ops: Any) -> None:
    for op in ops:
        for overload in _overloads(op):
            FALLBACK_OPS[overload] = reason
