"""Decomposition tables: kiln's own (``KILN_DECOMPOSITIONS``, by op family in this folder)
first, then ``torch._decomp``'s table used as data for everything else.

``default_decompositions()`` is what ``trace``/``aot_graph`` use when given none; a caller's
table passed as ``decompositions=`` is consulted before it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch._decomp

from kiln_aot.decompositions import (  # noqa: F401  (registers)
    attention,
    foreach,
    indexing,
    linalg,
    meta,
    nn,
    prims,
    reductions,
    tensor,
)
from kiln_aot.decompositions.registry import KILN_DECOMPOSITIONS, register


def _chain(first: Callable, second: Callable) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        out = first(*args, **kwargs)
        return second(*args, **kwargs) if out is NotImplemented else out

    return run


# ops whose torch decomposition only reaches a prim of the same name (nothing to fuse), and
# whose prims' meta kernels do not broadcast (on meta tensors a 0-dim operand is no longer a
# CPU scalar they let through): kept whole, as library calls, or as kernels where the
# compiler lowers the op itself (hypot)
_LIBRARY_PREFERRED = frozenset(
    getattr(getattr(torch.ops.aten, name), overload)
    for name, overload in (
        ("hypot", "default"),
        ("nextafter", "default"),
        ("igamma", "default"),
        ("igammac", "default"),
        ("special_zeta", "default"),
    )
    if hasattr(torch.ops.aten, name)
)


@functools.cache
def _defaults() -> dict[Any, Callable]:
    table: dict[Any, Callable] = {
        op: fn
        for op, fn in torch._decomp.decomposition_table.items()
        if op not in _LIBRARY_PREFERRED
    }
    for op, fn in KILN_DECOMPOSITIONS.items():
        table[op] = _chain(fn, table[op]) if op in table else fn
    return table


def default_decompositions() -> dict[Any, Callable]:
    """kiln's decompositions, backed by torch's table for ops kiln does not cover."""
    return dict(_defaults())


def with_overrides(overrides: dict[Any, Callable] | None) -> dict[Any, Callable]:
    """The default table with ``overrides`` taking precedence."""
    if not overrides:
        return _defaults()
    table = dict(_defaults())
    table.update(overrides)
    return table


__all__ = ["KILN_DECOMPOSITIONS", "default_decompositions", "register", "with_overrides"]
