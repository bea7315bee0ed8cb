"""transformers' ModelOutput-style records: dataclasses that are also dicts.

Design note: "records built in the trace"
------------------------------------------
A record has two parts, as the real object does: its attributes (``values``, what
``obj.name`` and ``obj.__dict__`` read) and its dict entries (``entries``, what ``keys()``,
``obj[k]`` and ``to_tuple()`` read). One made in the trace runs its class's ``__init__``
(the dataclass's generated one) in the trace, and with it the class's ``__setattr__``
(ModelOutput's stores non-None fields as entries, renames ``past_key_values`` to
``cache``) and ``__post_init__`` (which reads ``self.__dict__`` and unpacks a first field
that is a dict or an iterator of pairs), so both parts are what eager code builds.
Generated code rebuilds it from those parts (``build_record``: no ``__init__`` runs
again). Where the class's ``__init__`` cannot be traced, the record is built opaquely
(attributes from the arguments, entries the non-None fields in field order), only where
that is what ModelOutput builds (``_opaque_is_exact``); else the construction breaks.

A record read from the frame (``source`` set) has its writes replayed on the caller's
object after the graph: ``super().__setitem__`` (a dict C method) and
``object.__setattr__`` through the side-effect log, ``super().__delitem__`` in program
order.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
from typing import Any

from kiln_capture import breaks
from kiln_capture.errors import Raised, Unsupported
from kiln_capture.sources import AttrSource
from kiln_capture.variables.base import MethodCallVar, Var
from kiln_capture.variables.constants import ConstVar
from kiln_capture.variables.containers import DictVar, TupleVar
from kiln_capture.variables.modules import lookup_class_attr
from kiln_capture.variables.tensors import TensorVar


def is_record_type(cls: type) -> bool:
    """dataclasses that are also dicts (transformers' ModelOutput): built opaquely."""
    return dataclasses.is_dataclass(cls) and issubclass(cls, dict)


def _is_none(v: Var | None) -> bool:
    return v is None or (v.is_const() and v.as_const() is None)


_DICTS = (dict, collections.OrderedDict)
# dict methods a record answers from its entries (the class's Python ones are traced)
_RECORD_DICT_READS = frozenset(
    {"keys", "values", "items", "get", "__contains__", "__len__", "__iter__", "copy"}
)


class RecordVar(Var):
    """A ModelOutput-style record (see the design note above)."""

    def __init__(
        self,
        cls: type,
        values: dict[str, Var],
        source: Any = None,
        entries: dict[str, Var] | None = None,
    ) -> None:
        self.cls = cls
        self.values = values
        self.source = source  # a record read from the frame: writes are replayed on it
        if entries is None:
            entries = {}
            for f in dataclasses.fields(cls):
                if not _is_none(values.get(f.name)):
                    entries[f.name] = values[f.name]
        ordered = issubclass(cls, collections.OrderedDict)  # ModelOutput is one
        self.entries = collections.OrderedDict(entries) if ordered else dict(entries)
        self.built_in_trace = False  # __init__ ran in the trace: rebuilt from its parts
        self._entries_var: DictVar | None = None
        self._attrs_var: DictVar | None = None

    def __repr__(self) -> str:
        return f"Record({self.cls.__name__})"

    def python_type(self) -> type:
        return self.cls

    def children(self) -> list[Var]:
        return [*self.values.values(), *self.entries.values()]

    def _present(self) -> list[tuple[str, Var]]:
        return list(self.entries.items())

    def entries_var(self) -> DictVar:
        """A dict Var over the record's entries (the same Python dict: it stays live)."""
        if self._entries_var is None:
            kind = (
                collections.OrderedDict
                if isinstance(self.entries, collections.OrderedDict)
                else dict
            )
            self._entries_var = DictVar({}, cls=kind)
            self._entries_var.items = self.entries
        return self._entries_var

    def _attrs(self) -> DictVar:
        """``record.__dict__``: a dict Var over its attributes (the same Python dict)."""
        if self._attrs_var is None:
            src = AttrSource(self.source, "__dict__") if self.source is not None else None
            self._attrs_var = DictVar({}, source=src)
            self._attrs_var.items = self.values
        return self._attrs_var

    def getattr(self, tx, name):
        if name in self.values:
            return self.values[name]
        if name == "__dict__":
            return self._attrs()
        if name == "to_tuple":
            return _RecordToTuple(self)
        static = inspect.getattr_static(self.cls, name, None)
        if name in _RECORD_DICT_READS and getattr(static, "__objclass__", None) in _DICTS:
            return MethodCallVar(self.entries_var(), name)
        if name in {f.name for f in dataclasses.fields(self.cls)} and not inspect.isfunction(
            static
        ):
            return tx.out.wrap_value(static)  # the field's default (a class attribute)
        found = lookup_class_attr(tx, self, self.cls, name, None)
        if found is not None:
            return found
        raise AttributeError(name)

    def getitem(self, tx, key):
        own = inspect.getattr_static(self.cls, "__getitem__", None)
        if inspect.isfunction(own) and self.built_in_trace:
            return tx.out.wrap_value(own).call(tx, [self, key], {})
        k = key.as_const()  # ModelOutput's rule: a key, else a position among entries
        present = self._present()
        if isinstance(k, str):
            return dict(present)[k]
        if isinstance(k, slice):
            return TupleVar([v for _, v in present][k])
        return present[k][1]

    def setattr(self, tx, name, value):
        # its class's own __setattr__ runs in the trace (ModelOutput's stores the entry
        # and the attribute); for one passed in, its writes are replayed on the object
        own = inspect.getattr_static(self.cls, "__setattr__", None)
        if inspect.isfunction(own) and (self.source is not None or self.built_in_trace):
            tx.out.wrap_value(own).call(tx, [self, ConstVar(name), value], {})
        else:
            self.raw_setattr(tx, name, value)

    def raw_setattr(self, tx, name: str, value: Var) -> None:
        """``object.__setattr__(record, name, value)``."""
        self.values[name] = value
        if self.source is not None:
            tx.out.side_effects.store_attr(self, name, value, raw=True)

    def setitem(self, tx, key, value):
        own = inspect.getattr_static(self.cls, "__setitem__", None)
        if inspect.isfunction(own):
            tx.out.wrap_value(own).call(tx, [self, key, value], {})
            return
        self.raw_setitem(tx, dict.__setitem__, key, value)

    def raw_setitem(self, tx, method, key: Var, value: Var) -> None:
        """A dict's C ``__setitem__`` (``super().__setitem__`` in ModelOutput's)."""
        if not key.is_const() or not isinstance(key.as_const(), str):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"setting a non-string key of {self!r}")
        self.entries[key.as_const()] = value
        if self.source is not None:
            tx.out.side_effects.store_item(self, method, key.as_const(), value)

    def raw_delitem(self, tx, key: Var) -> None:
        """A dict's C ``__delitem__`` (``super().__delitem__`` in ``__post_init__``)."""
        k = key.as_const()
        if k not in self.entries:
            from kiln_capture.variables.exceptions import raised

            raise raised(KeyError, k)
        del self.entries[k]
        if self.source is not None:  # replayed on the caller's object, in program order
            method = (
                collections.OrderedDict.__delitem__
                if isinstance(self.entries, collections.OrderedDict)
                else dict.__delitem__
            )
            tx.out.side_effects.call_after(
                lambda cg: f"{cg.const(method)}({self.source.expr()}, {cg.const(k)})"
            )

    def contains(self, tx, item: Var) -> bool:
        own = inspect.getattr_static(self.cls, "__contains__", None)
        if inspect.isfunction(own):  # ModelOutput's (it renames old cache names)
            return tx.out.wrap_value(own).call(tx, [self, item], {}).truth(tx)
        return item.as_const() in self.entries

    def unpack(self, tx):
        return [ConstVar(k) for k in self.entries]

    def length(self, tx) -> int:
        return len(self.entries)

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        return self.getattr(tx, name).call(tx, args, kwargs)

    def reconstruct(self, cg) -> str:
        if self.source is not None:  # the caller's own object (writes are replayed)
            return self.source.expr()
        if not self.built_in_trace:
            fields = ", ".join(f"{k}={cg.rebuild(v)}" for k, v in self.values.items())
            return f"{cg.const(self.cls)}({fields})"
        attrs = ", ".join(f"{k!r}: {cg.rebuild(v)}" for k, v in self.values.items())
        entries = ", ".join(f"{k!r}: {cg.rebuild(v)}" for k, v in self.entries.items())
        return f"{cg.const(build_record)}({cg.const(self.cls)}, {{{attrs}}}, {{{entries}}})"


def build_record(cls: type, attrs: dict, entries: dict) -> object:
    """What generated code calls to make a record the trace built: its entries (through
    the dict's own ``__setitem__``, not the class's) and attributes as the trace left
    them; ``__init__`` and ``__post_init__`` already ran in the trace."""
    obj = cls.__new__(cls)
    ordered = isinstance(obj, collections.OrderedDict)
    setitem = collections.OrderedDict.__setitem__ if ordered else dict.__setitem__
    for k, v in entries.items():
        setitem(obj, k, v)
    obj.__dict__.update(attrs)
    return obj


def make_record(tx, cls: type, args: list[Var], kwargs: dict[str, Var]) -> RecordVar:
    """``cls(*args, **kwargs)`` for a record class: its ``__init__`` traced (see the
    design note), else built opaquely."""
    init = inspect.getattr_static(cls, "__init__", None)
    if inspect.isfunction(init):
        rec = RecordVar(cls, {}, entries={})
        rec.built_in_trace = True
        try:
            result = tx.out.wrap_value(init).call(tx, [rec, *args], kwargs)
        except Unsupported as e:
            if isinstance(e, Raised) or not _opaque_is_exact(cls, args, kwargs):
                raise
        else:
            if _is_none(result):
                return rec
    names = [f.name for f in dataclasses.fields(cls)]
    values = dict(zip(names, args))
    values.update(kwargs)
    return RecordVar(cls, values)


def _opaque_is_exact(cls: type, args: list[Var], kwargs: dict[str, Var]) -> bool:
    """Whether the opaque model (entries: the non-None fields in field order) is what
    ModelOutput's ``__post_init__`` builds for these arguments: no renamed (BC) field,
    and the first field a tensor or None, or another field set (a first field that is
    a dict or an iterator of pairs is unpacked into entries)."""
    names = [f.name for f in dataclasses.fields(cls)]
    values = dict(zip(names, args))
    values.update(kwargs)
    if not names or set(values) - set(names):
        return False
    first = values.get(names[0])
    others_set = any(not _is_none(values.get(n)) for n in names[1:])
    return others_set or _is_none(first) or isinstance(first, TensorVar)


class _RecordToTuple(Var):
    """``record.to_tuple()``: its entries' values (ModelOutput's ``to_tuple``)."""

    def __init__(self, rec: RecordVar) -> None:
        self.rec = rec

    def call(self, tx, args, kwargs):
        return TupleVar([v for _, v in self.rec._present()])


class _RecordSetitemVar(Var):
    """A dict's C ``__setitem__`` bound to a record (``super().__setitem__(k, v)``)."""

    def __init__(self, method, record: RecordVar) -> None:
        self.method, self.record = method, record

    def call(self, tx, args, kwargs):
        if kwargs or len(args) != 2:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self.method.__qualname__} arguments")
        self.record.raw_setitem(tx, self.method, *args)
        return ConstVar(None)


class _RecordDelitemVar(Var):
    """A dict's C ``__delitem__`` bound to a record (``super().__delitem__(k)``)."""

    def __init__(self, record: RecordVar) -> None:
        self.record = record

    def call(self, tx, args, kwargs):
        if kwargs or len(args) != 1:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "dict.__delitem__ arguments")
        self.record.raw_delitem(tx, args[0])
        return ConstVar(None)


def wrap_record(out, value: object, source) -> RecordVar | None:
    """A record read from ``source`` (a ModelOutput handed in, or the ``self`` of its
    ``__init__``/``__post_init__`` captured as a frame of its own): its entries and its
    attributes as the real object holds them, in their order, each guarded (its keys, its
    attribute names), so ``self.__dict__`` and ``keys()`` are the object's own. None for
    other values."""
    from kiln_capture.sources import ItemSource

    attrs = getattr(value, "__dict__", None)
    if (
        not is_record_type(type(value))
        or not all(isinstance(k, str) for k in value)
        or not isinstance(attrs, dict)
    ):
        return None
    g, src = out.guards, source.expr()
    g.type_is(source, value)
    g.dict_keys(source, tuple(value))
    g.add(f"tuple(vars({src})) == {tuple(attrs)!r}", f"attributes of {src}: {tuple(attrs)!r}")
    entries = {k: out.wrap(v, ItemSource(source, k)) for k, v in value.items()}
    values = {
        k: entries[k] if k in entries and v is value[k] else out.wrap(v, AttrSource(source, k))
        for k, v in attrs.items()
    }
    return RecordVar(type(value), values, source=source, entries=entries)
