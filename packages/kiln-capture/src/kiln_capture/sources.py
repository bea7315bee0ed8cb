"""Sources: where a value the trace read comes from, as a Python expression.

Guards and generated code re-read inputs through these expressions. In generated code
the frame's arguments are plain parameters, ``__k_fn`` is the running function and
``__k_G`` its globals dict.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

_CACHES = ("_expr", "_hash")  # kept in an instance's __dict__, never pickled


class Source:
    """A source is immutable, and a read chain a dozen sources deep is hashed (the
    frozen-source check, guard dedupe) and printed (every guard) many times: each
    source's text and hash are made once, from its parts' (made once too)."""

    def expr(self) -> str:
        e = self.__dict__.get("_expr")
        if e is None:
            e = self.__dict__["_expr"] = self._text()
        return e

    def _text(self) -> str:
        raise NotImplementedError

    def _cached_hash(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            names = _FIELDS[type(self)]
            h = self.__dict__["_hash"] = hash((type(self), *(getattr(self, n) for n in names)))
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in _CACHES}


@dataclass(frozen=True)
class LocalSource(Source):
    name: str

    def _text(self) -> str:
        return self.name


@dataclass(frozen=True)
class GlobalSource(Source):
    name: str

    def _text(self) -> str:
        return f"__k_G[{self.name!r}]"


@dataclass(frozen=True)
class ClosureSource(Source):
    fn: Source | None  # None: the frame's own function
    index: int

    def _text(self) -> str:
        base = self.fn.expr() if self.fn is not None else "__k_fn"
        return f"{base}.__closure__[{self.index}].cell_contents"


@dataclass(frozen=True)
class CellSource(Source):
    """The cell object itself (``ClosureSource`` reads its contents): a write to it is
    replayed as ``cell.cell_contents = value``."""

    fn: Source | None  # None: the frame's own function
    index: int

    def _text(self) -> str:
        base = self.fn.expr() if self.fn is not None else "__k_fn"
        return f"{base}.__closure__[{self.index}]"


@dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    name: str

    def _text(self) -> str:
        if self.name.isidentifier() and not self.name.startswith("__"):
            return f"{self.base.expr()}.{self.name}"
        return f"getattr({self.base.expr()}, {self.name!r})"


@dataclass(frozen=True)
class DictKeySource(Source):
    """The ``index``-th key of the dict ``base``: a tensor used as a key."""

    base: Source
    index: int

    def _text(self) -> str:
        return f"list({self.base.expr()})[{self.index}]"


@dataclass(frozen=True)
class DictEntrySource(Source):
    """``base.<table>[key]`` for nn.Module tables (_modules, _parameters, _buffers)."""

    base: Source
    table: str
    key: str

    def _text(self) -> str:
        return f"{self.base.expr()}.{self.table}[{self.key!r}]"


@dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: object  # int or str

    def _text(self) -> str:
        return f"{self.base.expr()}[{self.key!r}]"


@dataclass(frozen=True)
class ConstRef(Source):
    """An object held by the cache entry itself (``__k_C[i]``): no guard needed on it."""

    index: int

    def _text(self) -> str:
        return f"__k_C[{self.index}]"


@dataclass(frozen=True)
class FreshSource(Source):
    """A torch.nn module the generated code builds before the graph runs, as the frame
    built it (``__k_m<i>``; see variables/fresh_modules.py): what is read inside it
    follows from its constructor's (guarded) arguments and needs no guard."""

    index: int

    def _text(self) -> str:
        return f"__k_m{self.index}"


@dataclass(frozen=True)
class CallSource(Source):
    """The result of a read-only call, re-evaluated by guards: ``fn(base, *args)``."""

    fn: Source
    base: Source
    args: tuple

    def _text(self) -> str:
        args = "".join(f", {a!r}" for a in self.args)
        return f"{self.fn.expr()}({self.base.expr()}{args})"


@dataclass(frozen=True)
class TensorKeySource(Source):
    """``base[key]`` where ``key`` is a tensor read from its own source (an optimizer's
    state entry of a parameter: variables/optimizers.py)."""

    base: Source
    key: Source

    def _text(self) -> str:
        return f"{self.base.expr()}[{self.key.expr()}]"


# the hash dataclasses generate for each class hashes its fields, a base source's too:
# replaced by one that hashes the same values once per instance
_FIELDS: dict[type, tuple[str, ...]] = {}
for _cls in Source.__subclasses__():
    _FIELDS[_cls] = tuple(f.name for f in fields(_cls))
    _cls.__hash__ = Source._cached_hash  # type: ignore[method-assign]
