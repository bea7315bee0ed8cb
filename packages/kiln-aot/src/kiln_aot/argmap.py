"""Fast maps over op arguments (tuples, lists and dicts of leaves). ``torch.utils._pytree``
is general but slow, and tracing calls these several times per recorded op."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def map_args(fn: Callable[[Any], Any], x: Any) -> Any:
    t = type(x)
    if t is tuple or t is list:
        return t(map_args(fn, a) for a in x)
    if t is dict:
        return {k: map_args(fn, v) for k, v in x.items()}
    return fn(x)


def iter_leaves(x: Any) -> Iterator[Any]:
    t = type(x)
    if t is tuple or t is list:
        for a in x:
            yield from iter_leaves(a)
    elif t is dict:
        for v in x.values():
            yield from iter_leaves(v)
    else:
        yield x
