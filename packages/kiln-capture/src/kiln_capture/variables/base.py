"""The base of all symbolic values ("Var"s) and the few that belong to no family."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.sources import Source

if TYPE_CHECKING:
    from kiln_capture.codegen import CodeGen
    from kiln_capture.evaluator import Frame


class Var:
    """A Python value during symbolic evaluation; ``source`` says where it was read from."""

    source: Source | None = None

    def python_type(self) -> type:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"type of {self!r}")

    def is_const(self) -> bool:
        return False

    def as_const(self) -> object:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r} is not a Python constant")

    def truth(self, tx: Frame) -> bool:
        # Python's rule: an object whose type has neither __bool__ nor __len__ is true
        # (``if self.activation:`` holding F.relu, a module, a method)
        try:
            cls = self.python_type()
        except Unsupported:
            cls = None
        if isinstance(cls, type) and not (hasattr(cls, "__bool__") or hasattr(cls, "__len__")):
            return True
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"truth value of {self!r}")

    def getattr(self, tx: Frame, name: str) -> Var:
        if type(self).call_method is not Var.call_method and callable(
            getattr(self.python_type(), name, None)
        ):
            return MethodCallVar(self, name)
        raise AttributeError(name)

    def setattr(self, tx: Frame, name: str, value: Var) -> None:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"setting attribute {name!r} of {self!r}")

    def hasattr(self, tx: Frame, name: str) -> bool:
        try:
            self.getattr(tx, name)
            return True
        except Unsupported:
            raise
        except AttributeError:
            return False

    def call(self, tx: Frame, args: list[Var], kwargs: dict[str, Var]) -> Var:
        raise Unsupported(breaks.UNKNOWN_CALLABLE, f"call of {self!r}")

    def call_method(self, tx: Frame, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def unpack(self, tx: Frame) -> list[Var]:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"iteration over {self!r}")

    def getitem(self, tx: Frame, key: Var) -> Var:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r}[...]")

    def setitem(self, tx: Frame, key: Var, value: Var) -> None:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r}[...] = ...")

    def children(self) -> list[Var]:
        """Vars this one holds (for finding the tensors a reconstruction needs)."""
        return []

    def reconstruct(self, cg: CodeGen) -> str:
        """A Python expression that rebuilds this value in generated code."""
        if self.source is not None:
            return self.source.expr()
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"cannot rebuild {self!r} outside the graph")


class MethodCallVar(Var):
    """``obj.method`` for Vars that model their methods in ``call_method``."""

    def __init__(self, obj: Var, name: str) -> None:
        self.obj = obj
        self.name = name

    def __repr__(self) -> str:
        return f"Method({self.obj!r}.{self.name})"

    def call(self, tx: Frame, args: list[Var], kwargs: dict[str, Var]) -> Var:
        return self.obj.call_method(tx, self.name, args, kwargs)

    def children(self) -> list[Var]:
        return [self.obj]

    def reconstruct(self, cg) -> str:
        return f"{cg.rebuild(self.obj)}.{self.name}"


class NullVar(Var):
    """The NULL that CPython pushes below a callable."""

    def __repr__(self) -> str:
        return "NULL"


NULL = NullVar()


class CellObjectVar(Var):
    """A real cell object, read from its source: a write to a real cell in the trace is
    replayed after the graph as ``cell.cell_contents = value``."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def __repr__(self) -> str:
        return f"CellObject({self.source.expr()})"


class CellVar(Var):
    """A closure cell; ``contents`` is a Var (or None while empty)."""

    def __init__(self, contents: Var | None = None) -> None:
        self.contents = contents

    def __repr__(self) -> str:
        return f"Cell({self.contents!r})"
