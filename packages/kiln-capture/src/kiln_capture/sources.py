"""Sources: where a value the trace read comes from, as a Python expression.

Guards and generated code re-read inputs through these expressions. In generated code
the frame's arguments are plain parameters, ``__k_fn`` is the running function and
``__k_G`` its globals dict.
"""

from __future__ import annotations

from dataclasses import dataclass


class Source:
    def expr(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class LocalSource(Source):
    name: str

    def expr(self) -> str:
        return self.name


@dataclass(frozen=True)
class GlobalSource(Source):
    name: str

    def expr(self) -> str:
        return f"__k_G[{self.name!r}]"


@dataclass(frozen=True)
class ClosureSource(Source):
    fn: Source | None  # None: the frame's own function
    index: int

    def expr(self) -> str:
        base = self.fn.expr() if self.fn is not None else "__k_fn"
        return f"{base}.__closure__[{self.index}].cell_contents"


@dataclass(frozen=True)
class CellSource(Source):
    """The cell object itself (``ClosureSource`` reads its contents): a write to it is
    replayed as ``cell.cell_contents = value``."""

    fn: Source | None  # None: the frame's own function
    index: int

    def expr(self) -> str:
        base = self.fn.expr() if self.fn is not None else "__k_fn"
        return f"{base}.__closure__[{self.index}]"


@dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    name: str

    def expr(self) -> str:
        if self.name.isidentifier() and not self.name.startswith("__"):
            return f"{self.base.expr()}.{self.name}"
        return f"getattr({self.base.expr()}, {self.name!r})"


@dataclass(frozen=True)
class DictKeySource(Source):
    """The ``index``-th key of the dict ``base``: a tensor used as a key."""

    base: Source
    index: int

    def expr(self) -> str:
        return f"list({self.base.expr()})[{self.index}]"


@dataclass(frozen=True)
class DictEntrySource(Source):
    """``base.<table>[key]`` for nn.Module tables (_modules, _parameters, _buffers)."""

    base: Source
    table: str
    key: str

    def expr(self) -> str:
        return f"{self.base.expr()}.{self.table}[{self.key!r}]"


@dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: object  # int or str

    def expr(self) -> str:
        return f"{self.base.expr()}[{self.key!r}]"


@dataclass(frozen=True)
class ConstRef(Source):
    """An object held by the cache entry itself (``__k_C[i]``): no guard needed on it."""

    index: int

    def expr(self) -> str:
        return f"__k_C[{self.index}]"


@dataclass(frozen=True)
class FreshSource(Source):
    """A torch.nn module the generated code builds before the graph runs, as the frame
    built it (``__k_m<i>``; see variables/fresh_modules.py): what is read inside it
    follows from its constructor's (guarded) arguments and needs no guard."""

    index: int

    def expr(self) -> str:
        return f"__k_m{self.index}"


@dataclass(frozen=True)
class CallSource(Source):
    """The result of a read-only call, re-evaluated by guards: ``fn(base, *args)``."""

    fn: Source
    base: Source
    args: tuple

    def expr(self) -> str:
        args = "".join(f", {a!r}" for a in self.args)
        return f"{self.fn.expr()}({self.base.expr()}{args})"


@dataclass(frozen=True)
class TensorKeySource(Source):
    """``base[key]`` where ``key`` is a tensor read from its own source (an optimizer's
    state entry of a parameter: variables/optimizers.py)."""

    base: Source
    key: Source

    def expr(self) -> str:
        return f"{self.base.expr()}[{self.key.expr()}]"
