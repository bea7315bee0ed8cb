"""kiln's own decomposition table: ``register(op, ...)`` records a function by overload."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KILN_DECOMPOSITIONS: dict[Any, Callable] = {}


def register(*ops: Any) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        for op in ops:
            if op in KILN_DECOMPOSITIONS:
                raise ValueError(f"two kiln decompositions for {op}")
            KILN_DECOMPOSITIONS[op] = fn
        return fn

    return deco
