"""Python constants: numbers, strings, None, dtypes, devices, ranges, slices of constants."""

from __future__ import annotations

import enum
import types

import torch

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.variables.base import Var

# Types whose values are immutable and are safe to fold during capture.
LITERAL_TYPES = (
    int,
    float,
    bool,
    str,
    bytes,
    type(None),
    complex,
    type(Ellipsis),
    type(NotImplemented),
)
IMMUTABLE_TYPES = LITERAL_TYPES + (
    torch.dtype,
    torch.device,
    torch.memory_format,
    torch.layout,
    range,
    slice,
    enum.Enum,
    torch.finfo,
    torch.iinfo,
    types.CodeType,
)


def is_constant_value(value: object) -> bool:
    if isinstance(value, slice):  # a slice is as constant as its bounds (a tensor's is not)
        return all(is_constant_value(v) for v in (value.start, value.stop, value.step))
    if isinstance(value, IMMUTABLE_TYPES):
        return True
    if type(value) in (tuple, frozenset):
        return all(is_constant_value(v) for v in value)
    return False


class ConstVar(Var):
    def __init__(self, value: object, source=None) -> None:
        self.value = value
        self.source = source

    def __repr__(self) -> str:
        return f"Const({self.value!r})"

    def python_type(self) -> type:
        return type(self.value)

    def is_const(self) -> bool:
        return True

    def as_const(self) -> object:
        return self.value

    def truth(self, tx) -> bool:
        return bool(self.value)

    def getattr(self, tx, name: str) -> Var:
        attr = getattr(self.value, name)
        if isinstance(attr, types.BuiltinMethodType | types.MethodWrapperType | types.MethodType):
            return ConstMethodVar(self.value, name)
        return tx.out.wrap_value(attr)

    def unpack(self, tx) -> list[Var]:
        if isinstance(self.value, range | tuple | str | bytes | frozenset):
            if isinstance(self.value, frozenset):
                from kiln_capture.frame_store import note_process_specific, stable_hash

                if not all(stable_hash(v) for v in self.value):  # str/object order
                    note_process_specific(tx.out, "iteration order of a frozenset")
            return [ConstVar(v) for v in self.value]
        return super().unpack(tx)

    def getitem(self, tx, key: Var) -> Var:
        return ConstVar(self.value[key.as_const()])

    def reconstruct(self, cg) -> str:
        return cg.const(self.value)


class ConstMethodVar(Var):
    """A method of a constant (``"a{}".format``, ``dtype.is_floating_point``...)."""

    def __init__(self, obj: object, name: str) -> None:
        self.obj = obj
        self.name = name

    def __repr__(self) -> str:
        return f"ConstMethod({self.obj!r}.{self.name})"

    def reconstruct(self, cg) -> str:
        return f"{cg.const(self.obj)}.{self.name}"

    def call(self, tx, args, kwargs) -> Var:
        args = [_known_list(a) for a in args]  # "-".join(parts) over a list of strings
        if not all(a.is_const() for a in args) or not all(v.is_const() for v in kwargs.values()):
            if isinstance(self.obj, str) and self.name == "format":
                raise Unsupported(breaks.TENSOR_TO_PYTHON, "formatting a tensor into a string")
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, f"{self.obj!r}.{self.name} on non-constants"
            )
        fn = getattr(self.obj, self.name)
        result = fn(*[a.as_const() for a in args], **{k: v.as_const() for k, v in kwargs.items()})
        return tx.out.wrap_value(result)


def _known_list(v):
    """A list of constants read by a method that does not keep it, as a constant tuple."""
    items = getattr(v, "items", None)
    if type(v).__name__ == "ListVar" and all(i.is_const() for i in items):
        return ConstVar(tuple(i.as_const() for i in items))
    return v


def fold(fn, *values: object) -> object:
    """Apply ``fn`` to constants, turning Python exceptions into graph breaks."""
    try:
        return fn(*values)
    except Exception as e:  # the eager run raises it again, at the same place
        from kiln_capture.variables.exceptions import raised_real  # it imports this module

        err = raised_real(e)  # a plain builtin exception: the trace's handlers may catch it
        if err is not None:
            raise err from e
        raise Unsupported(
            breaks.EXCEPTION, f"{getattr(fn, '__name__', fn)} raised {type(e).__name__}: {e}"
        ) from e
