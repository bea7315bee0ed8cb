"""What each scheduler node reads and writes, with the index of every access.

Bodies are run once under a recording handler with canonical loop variables (``i*`` for
the iteration ranges, ``r*`` for the reduction ranges).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy

from ..ir.nodes import ComputedBuffer, Reduction
from ..ir.ops import ops_handler
from ..ir.symbols import Expr, index_vars


@dataclass(frozen=True)
class Access:
    ranges: tuple[Expr, ...]
    rranges: tuple[Expr, ...]
    vars: tuple[sympy.Symbol, ...]
    rvars: tuple[sympy.Symbol, ...]
    loads: tuple[tuple[str, Expr], ...]
    store: Expr
    indirect: bool  # some load index depends on loaded data


class _Recorder:
    def __init__(self) -> None:
        self.loads: list[tuple[str, Expr]] = []
        self.indirect = False

    def load(self, name: str, index: Expr) -> object:
        self.loads.append((name, sympy.expand(index)))
        return object()

    def indirect_indexing(self, value: Any, size: Any, check: bool = True) -> Expr:
        self.indirect = True
        return sympy.Symbol(f"ind{len(self.loads)}", integer=True, nonnegative=True)

    def masked(self, mask: Any, body: Any, other: Any) -> object:
        body()
        return object()

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: object()


def node_access(node: ComputedBuffer) -> Access:
    body = node.body
    assert body is not None
    ivars = tuple(index_vars("i", len(body.size)))
    rec = _Recorder()
    if isinstance(body, Reduction):
        rvars = tuple(index_vars("r", len(body.reduction_ranges)))
        with ops_handler(rec):
            body.inner_fn(list(ivars), list(rvars))
        rr = body.reduction_ranges
    else:
        rvars, rr = (), ()
        with ops_handler(rec):
            body.inner_fn(list(ivars))
    store = sympy.expand(node.layout.index(ivars))
    return Access(tuple(body.size), tuple(rr), ivars, rvars, tuple(rec.loads), store, rec.indirect)
