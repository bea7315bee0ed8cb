"""Tuples, lists, dicts, sets, named tuples, slices, Counter and deque (their iterators:
iterators.py).

Lists and dicts that came from the frame's inputs keep their source; mutating them marks
them in the side-effect log, and their final contents are written back after the graph.
"""

from __future__ import annotations

import collections
import inspect
import operator
import types

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.variables.base import MethodCallVar, Var
from kiln_capture.variables.constants import ConstVar, is_constant_value
from kiln_capture.variables.sizes import SymIntVar


def _raised(cls: type, *args: object) -> Unsupported:
    from kiln_capture.variables.exceptions import raised  # it imports this module

    return raised(cls, *args)


def consts_of(items: list[Var]) -> list[object]:
    return [i.as_const() for i in items]


class SequenceVar(Var):
    kind = "sequence"

    def __init__(self, items: list[Var], source=None) -> None:
        self.items = list(items)
        self.source = source

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.items!r})"

    def is_const(self) -> bool:
        return all(i.is_const() for i in self.items)

    def truth(self, tx) -> bool:
        return bool(self.items)

    def unpack(self, tx) -> list[Var]:
        return list(self.items)

    def children(self) -> list[Var]:
        return list(self.items)

    def getitem(self, tx, key: Var) -> Var:
        k = known_index(key)
        if k is None:
            k = key.as_const()
        if isinstance(k, slice):
            return self.new(self.items[k])
        try:
            return self.items[k]
        except (IndexError, TypeError) as e:
            raise _raised(type(e), str(e)) from e

    def new(self, items: list[Var]) -> SequenceVar:
        return type(self)(items)

    def call_method(self, tx, name, args, kwargs) -> Var:
        if name == "index" and len(args) == 1:
            for i, item in enumerate(self.items):
                if same_item(tx, args[0], item):
                    return ConstVar(i)
            raise _raised(ValueError, "item not in sequence")
        if name == "count" and len(args) == 1:
            return ConstVar(sum(same_item(tx, args[0], item) for item in self.items))
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstVar(len(self.items))
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self.python_type().__name__}.{name}")


class TupleVar(SequenceVar):
    def python_type(self) -> type:
        return tuple

    def as_const(self) -> object:
        return tuple(consts_of(self.items))

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        return "(" + "".join(cg.rebuild(i) + ", " for i in self.items) + ")"


class NamedTupleVar(TupleVar):
    """A namedtuple or a structseq (``torch.return_types.max``) of Vars."""

    def __init__(self, cls: type, items: list[Var], source=None) -> None:
        super().__init__(items, source)
        self.cls = cls

    def python_type(self) -> type:
        return self.cls

    def new(self, items):
        return TupleVar(items)

    def as_const(self):
        return self._make(consts_of(self.items))

    def _make(self, values):
        if hasattr(self.cls, "_make"):
            return self.cls._make(values)
        return self.cls(tuple(values))

    def getattr(self, tx, name):
        probe = self._make(range(len(self.items)))
        try:
            idx = getattr(probe, name)
        except AttributeError as e:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self.cls.__name__}.{name}") from e
        if isinstance(idx, int) and not callable(idx):
            return self.items[idx]
        if name in ("_replace", "_asdict"):
            return MethodCallVar(self, name)
        static = inspect.getattr_static(self.cls, name)
        if isinstance(static, types.FunctionType) and static.__module__ != "collections":
            from kiln_capture.variables.functions import BoundMethodVar

            return BoundMethodVar(tx.out.wrap_value(static), self)  # a method of the class
        if isinstance(static, staticmethod):
            return tx.out.wrap_value(static.__func__)
        if isinstance(static, classmethod):
            from kiln_capture.variables.functions import BoundMethodVar

            return BoundMethodVar(tx.out.wrap_value(static.__func__), tx.out.wrap_value(self.cls))
        attr = getattr(self.cls, name)
        if callable(attr):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self.cls.__name__}.{name}()")
        return tx.out.wrap_value(attr)

    def call_method(self, tx, name, args, kwargs) -> Var:
        fields = getattr(self.cls, "_fields", None)
        if name == "_replace" and fields is not None and not args:
            unknown = set(kwargs) - set(fields)
            if unknown:
                raise Unsupported(
                    breaks.EXCEPTION, f"ValueError: unexpected field names {sorted(unknown)}"
                )
            return NamedTupleVar(self.cls, [kwargs.get(f, v) for f, v in zip(fields, self.items)])
        if name == "_asdict" and fields is not None:
            return DictVar(dict(zip(fields, self.items)))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        items = "".join(cg.rebuild(i) + ", " for i in self.items)
        if hasattr(self.cls, "_make"):
            return f"{cg.const(self.cls)}({items})"
        return f"{cg.const(self.cls)}(({items}))"


def same_item(tx, a: Var, b: Var) -> bool:
    """``a == b`` as list.index/count/remove and ``in`` decide it: identity first."""
    from kiln_capture.variables.builtins import binary, identical

    return identical(tx, a, b) or binary(tx, operator.eq, a, b).truth(tx)


def sort_items(tx, items: list[Var], key: Var | None, reverse: Var | None) -> list[Var]:
    """``sorted(items, key=key, reverse=reverse)``: by constant keys (the items', or what
    ``key`` returns for each), stable as Python's sort."""
    if key is None or (key.is_const() and key.as_const() is None):
        keys = items
    else:
        keys = [key.call(tx, [i], {}) for i in items]
    if not all(k.is_const() for k in keys):
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "sorting by non-constant keys")
    values = [k.as_const() for k in keys]
    down = bool(reverse.as_const()) if reverse is not None else False
    order = sorted(range(len(items)), key=values.__getitem__, reverse=down)
    return [items[i] for i in order]


class ListVar(SequenceVar):
    def python_type(self) -> type:
        return list

    def as_const(self) -> object:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "a list is not a constant")

    def is_const(self) -> bool:
        return False

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        return "[" + ", ".join(cg.rebuild(i) for i in self.items) + "]"

    def _mutated(self, tx) -> None:
        tx.out.side_effects.mutated(self)

    def setitem(self, tx, key, value) -> None:
        k = key.as_const()
        if isinstance(k, slice):
            self.items[k] = value.unpack(tx)
        else:
            self.items[k] = value
        self._mutated(tx)

    def call_method(self, tx, name, args, kwargs) -> Var:
        if name == "append":
            self.items.append(args[0])
        elif name == "extend":
            self.items.extend(args[0].unpack(tx))
        elif name == "insert":
            self.items.insert(args[0].as_const(), args[1])
        elif name == "pop":
            v = self.items.pop(*(a.as_const() for a in args))
            self._mutated(tx)
            return v
        elif name == "clear":
            self.items.clear()
        elif name == "reverse":
            self.items.reverse()
        elif name == "remove":
            i = self.call_method(tx, "index", args, {}).as_const()
            del self.items[i]
        elif name == "sort":
            self.items[:] = sort_items(tx, self.items, kwargs.get("key"), kwargs.get("reverse"))
        elif name == "copy":
            return ListVar(list(self.items))
        elif name == "__setitem__":
            self.setitem(tx, args[0], args[1])
        else:
            return super().call_method(tx, name, args, kwargs)
        self._mutated(tx)
        return ConstVar(None)


class DictVar(Var):
    """A dict with constant keys; ``cls`` is dict or OrderedDict."""

    def __init__(self, items: dict[object, Var], source=None, cls: type = dict) -> None:
        # an OrderedDict's entries are a real OrderedDict: its iterators and move_to_end
        # are CPython's own (live iterators hold this object: it is only changed in place)
        ordered = issubclass(cls, collections.OrderedDict)
        self.items = collections.OrderedDict(items) if ordered else dict(items)
        self.source = source
        self.cls = cls

    def __repr__(self) -> str:
        return f"Dict({self.items!r})"

    def python_type(self) -> type:
        return self.cls

    def truth(self, tx) -> bool:
        return bool(self.items)

    def children(self) -> list[Var]:
        return list(self.items.values())

    def unpack(self, tx) -> list[Var]:
        return [key_var(k) for k in self.items]

    def getitem(self, tx, key: Var) -> Var:
        k = key_of(tx, key)
        if k not in self.items:
            raise _raised(KeyError, k)
        return self.items[k]

    def setitem(self, tx, key: Var, value: Var) -> None:
        k = key_of(tx, key)
        if k in self.items and self.items[k] is value:
            return  # storing the value it holds: no change (an optimizer's state entries)
        self.items[k] = value
        tx.out.side_effects.mutated(self)

    def call_method(self, tx, name, args, kwargs) -> Var:
        c = [key_of(tx, args[0])] if args and name not in ("update",) else []
        if name == "get":
            default = args[1] if len(args) > 1 else ConstVar(None)
            return self.items.get(c[0], default)
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__contains__":
            return ConstVar(c[0] in self.items)
        if name in ("keys", "values", "items"):
            return DictViewVar(self, name)
        if name == "copy":
            return DictVar(self.items, cls=self.cls)
        if name in ("__setitem__", "setdefault", "pop", "update", "clear", "popitem"):
            tx.out.side_effects.mutated(self)
            if name == "__setitem__":
                self.items[c[0]] = args[1]
            elif name == "setdefault":
                return self.items.setdefault(c[0], args[1] if len(args) > 1 else ConstVar(None))
            elif name == "pop":
                if c[0] not in self.items and len(args) < 2:
                    raise _raised(KeyError, c[0])
                if c[0] in self.items or len(args) < 2:
                    return self.items.pop(c[0])
                return args[1]
            elif name == "update":
                other = args[0] if args else DictVar({})
                if not isinstance(other, DictVar):  # pairs, or a mapping: as dict() reads it
                    from kiln_capture.variables.builtins import BuiltinVar

                    other = BuiltinVar(dict).call(tx, [other], {})
                self.items.update(other.items)
                self.items.update(kwargs)
            elif name == "clear":
                self.items.clear()
            elif not self.items:
                raise _raised(KeyError, "popitem(): dictionary is empty")
            else:
                key, value = self.items.popitem()
                return TupleVar([key_var(key), value])
            return ConstVar(None)
        if name == "move_to_end" and isinstance(self.items, collections.OrderedDict):
            last = kwargs.get("last", args[1] if len(args) > 1 else ConstVar(True)).as_const()
            if c[0] not in self.items:
                raise _raised(KeyError, c[0])
            self.items.move_to_end(c[0], last)
            tx.out.side_effects.mutated(self)
            return ConstVar(None)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"dict.{name}")

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        body = ", ".join(f"{rebuild_key(cg, k)}: {cg.rebuild(v)}" for k, v in self.items.items())
        if self.cls is dict:
            return "{" + body + "}"
        return f"{cg.const(self.cls)}({{{body}}})"


_VIEW_TYPES_OF_EMPTY = {"keys": {}.keys(), "values": {}.values(), "items": {}.items()}
_VIEW_TYPES = {k: type(v) for k, v in _VIEW_TYPES_OF_EMPTY.items()}


class DictViewVar(Var):
    """``d.keys()``, ``d.values()``, ``d.items()``: live views, as in Python: reading one
    after ``d`` changed sees the change (they were lists frozen at creation)."""

    def __init__(self, d: DictVar, kind: str) -> None:
        self.d, self.kind = d, kind

    def __repr__(self) -> str:
        return f"DictView({self.kind} of {self.d!r})"

    def python_type(self) -> type:
        return _VIEW_TYPES[self.kind]

    def unpack(self, tx) -> list[Var]:
        items = self.d.items
        if self.kind == "keys":
            return [key_var(k) for k in items]
        if self.kind == "values":
            return list(items.values())
        return [TupleVar([key_var(k), v]) for k, v in items.items()]

    def truth(self, tx) -> bool:
        return bool(self.d.items)

    def length(self, tx) -> int:
        return len(self.d.items)

    def children(self) -> list[Var]:
        return [self.d]

    def contains(self, tx, item: Var) -> bool:
        from kiln_capture.variables.builtins import contains

        if self.kind == "keys":
            return key_of(tx, item) in self.d.items
        return contains(tx, item, ListVar(self.unpack(tx)))

    def call_method(self, tx, name, args, kwargs) -> Var:
        if name == "__len__":
            return ConstVar(len(self.d.items))
        if name == "__contains__":
            return ConstVar(self.contains(tx, args[0]))
        if name == "__iter__":
            from kiln_capture.variables.iterators import DictIteratorVar

            return DictIteratorVar(self.d, self.kind)
        return ListVar(self.unpack(tx)).call_method(tx, name, args, kwargs)

    def set_like(self) -> object:
        """A real view equal to this one (keys, or items of constant values), for set
        operations and comparisons; None for a values view (it is not set-like)."""
        if self.kind == "keys":
            return dict.fromkeys(self.d.items).keys()
        if self.kind == "items" and all(v.is_const() for v in self.d.items.values()):
            return {k: v.as_const() for k, v in self.d.items.items()}.items()
        if self.kind == "items":
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "set operation on items of non-constants")
        return None

    def reconstruct(self, cg) -> str:
        return f"{cg.rebuild(self.d)}.{self.kind}()"


_IDENTITY_HASHES = (object.__hash__, type.__hash__)


class TracedKey:
    """A dict key or set member that is a tensor of the trace. Python hashes a tensor by
    its identity, so this key is hashed and compared by the tensor's identity in the
    trace (its meta tensor: ``x.add_(1)`` is ``x``, builtins.identical)."""

    __slots__ = ("var",)

    def __init__(self, var: Var) -> None:
        self.var = var

    def __hash__(self) -> int:
        return id(self.var.meta)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TracedKey)
            and other.var.meta is self.var.meta
            and other.var.device == self.var.device
        )

    def __repr__(self) -> str:
        return f"TracedKey({self.var!r})"


def key_of(tx, v: Var) -> object:
    """What a dict holds as the key ``v``: a constant's value, or a tensor's TracedKey."""
    from kiln_capture.variables.tensors import TensorVar

    if isinstance(v, TensorVar):
        return TracedKey(v)
    return v.as_const()


def key_var(k: object) -> Var:
    """The Var of a key ``key_of`` made."""
    return k.var if isinstance(k, TracedKey) else ConstVar(k)


def rebuild_key(cg, k: object) -> str:
    return cg.rebuild(k.var) if isinstance(k, TracedKey) else cg.const(k)


def set_key(tx, v: Var) -> object:
    """What a set holds for ``v``, hashed as Python hashes it: a constant's value, or the
    object the trace knows ``v`` to be (a module, class, function: anything whose hash is
    its identity). A symbolic size takes its value (guarded), as a dict key does; a
    tensor is its TracedKey; another value computed in the trace is not supported; an
    unhashable value raises eager's TypeError."""
    try:
        kind = v.python_type()
    except Unsupported:
        kind = object
    if kind.__hash__ is None:
        raise _raised(TypeError, f"unhashable type: '{kind.__name__}'")
    from kiln_capture.variables.tensors import TensorVar

    if isinstance(v, TensorVar):
        return TracedKey(v)
    if v.is_const() or isinstance(v, SymIntVar):  # a size: specialized, as a dict key is
        value = v.as_const()
    else:
        from kiln_capture.variables.functions import _NO_VALUE, python_value

        value = python_value(v)
        if value is _NO_VALUE or type(value).__hash__ not in _IDENTITY_HASHES:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, f"a set member computed in the trace ({v!r})"
            )
    try:
        hash(value)
    except TypeError as e:
        raise _raised(TypeError, str(e)) from e
    return value


class SetVar(Var):
    """A set (or frozenset) made inside the trace. It holds the real members (constants,
    and objects the trace knows, such as the modules of ``named_modules``' ``memo``) in a
    Python set, so membership and iteration order are Python's own; ``members`` keeps the
    Var of each member that is not a constant, to hand back when iterated and rebuilt."""

    def __init__(
        self, values: set, members: dict | None = None, kind: type = set, source=None
    ) -> None:
        self.values = set(values)
        self.members = dict(members or {})
        self.kind = kind
        self.source = source  # a set of constants read from the frame (wrap_collection)

    def __repr__(self) -> str:
        return f"Set({self.values!r})"

    def python_type(self) -> type:
        return self.kind

    def is_const(self) -> bool:
        return not self.members

    def as_const(self) -> object:
        return frozenset(self.values)

    def truth(self, tx) -> bool:
        return bool(self.values)

    def length(self, tx) -> int:
        return len(self.values)

    def contains(self, tx, item: Var) -> bool:
        return set_key(tx, item) in self.values

    def unpack(self, tx) -> list[Var]:
        if any(isinstance(v, TracedKey) for v in self.values):
            # eager iterates tensors in the order of their addresses' hashes
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "iteration over a set of tensors")
        from kiln_capture.frame_store import note_process_specific, stable_hash

        if not all(stable_hash(v) for v in self.values):  # str/object order: per process
            note_process_specific(tx.out, "iteration order of a set")
        return [self.members[v] if v in self.members else ConstVar(v) for v in self.values]

    def add(self, tx, item: Var) -> None:
        key = set_key(tx, item)
        if key not in self.values:
            self.values.add(key)
            if not item.is_const():
                self.members[key] = item

    def _keep(self) -> None:
        self.members = {k: v for k, v in self.members.items() if k in self.values}

    def _others(self, tx, args: list[Var]) -> list[SetVar]:
        others = []
        for a in args:
            if isinstance(a, SetVar):
                others.append(a)
            elif a.is_const():
                others.append(SetVar(set(a.as_const())))
            else:
                others.append(make_set(tx, a.unpack(tx)))
        return others

    def call_method(self, tx, name, args, kwargs) -> Var:
        mutating = name in (
            "add",
            "discard",
            "remove",
            "pop",
            "update",
            "clear",
            "difference_update",
            "intersection_update",
            "symmetric_difference_update",
        )
        if mutating and self.kind is frozenset:
            raise _raised(AttributeError, f"'frozenset' object has no attribute '{name}'")
        if mutating:
            tx.out.side_effects.mutated(self)  # one read from the frame: written back
        if kwargs:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"set.{name} with keyword arguments")
        if name == "add":
            self.add(tx, args[0])
            return ConstVar(None)
        if name in ("discard", "remove", "__contains__"):
            key = set_key(tx, args[0])
            if name == "__contains__":
                return ConstVar(key in self.values)
            if name == "remove" and key not in self.values:
                raise _raised(KeyError, key)
            self.values.discard(key)
            self.members.pop(key, None)
            return ConstVar(None)
        if name == "pop":
            if not self.values:
                raise _raised(KeyError, "pop from an empty set")
            key = next(iter(self.values))
            item = self.unpack(tx)[0]
            self.values.discard(key)
            self.members.pop(key, None)
            return item
        if name == "clear":
            self.values.clear()
            self.members.clear()
            return ConstVar(None)
        others = self._others(tx, args)
        members = dict(self.members)
        for o in others:
            members.update(o.members)
        values = [o.values for o in others]
        if mutating:  # update, difference_update, ...
            getattr(self.values, name)(*values)
            self.members = members
            self._keep()
            return ConstVar(None)
        if name in ("union", "intersection", "difference", "symmetric_difference", "copy"):
            made = SetVar(getattr(self.values, name)(*values), members, self.kind)
            made._keep()
            return made
        if name in ("issubset", "issuperset", "isdisjoint"):
            return ConstVar(getattr(self.values, name)(*values))
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"set.{name}")

    def children(self) -> list[Var]:
        return list(self.members.values())

    def write_back(self, cg, src: str, tmp: str) -> tuple[str, str]:
        """The side-effect statements for a set read from the frame (SideEffects.replay)."""
        return f"{tmp} = {self._rebuild(cg)}", f"__k_s = {src}; __k_s.clear(); __k_s.update({tmp})"

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        return self._rebuild(cg)

    def _rebuild(self, cg) -> str:
        kind = "frozenset" if self.kind is frozenset else "set"
        if not self.members:
            return f"{kind}({cg.const(frozenset(self.values))})"
        items = ", ".join(
            cg.rebuild(self.members[v]) if v in self.members else cg.const(v) for v in self.values
        )
        return f"{kind}(({items},))"


def make_set(tx, items: list[Var], kind: type = set) -> SetVar:
    made = SetVar(set(), kind=kind)
    for item in items:
        made.add(tx, item)
    return made


class SliceVar(Var):
    def __init__(self, start: Var, stop: Var, step: Var) -> None:
        self.parts = [start, stop, step]

    def __repr__(self) -> str:
        return f"Slice({self.parts!r})"

    def python_type(self) -> type:
        return slice

    def is_const(self) -> bool:
        return all(p.is_const() for p in self.parts)

    def as_const(self) -> object:
        return slice(*consts_of(self.parts))

    def children(self) -> list[Var]:
        return list(self.parts)

    def reconstruct(self, cg) -> str:
        return "slice(" + ", ".join(cg.rebuild(p) for p in self.parts) + ")"


class DefaultDictVar(DictVar):
    """``collections.defaultdict(factory, ...)`` made in the trace: a missing key read
    gets ``factory()``."""

    def __init__(self, factory: Var, items: dict[object, Var], source=None) -> None:
        super().__init__(items, source, cls=collections.defaultdict)
        self.factory = factory

    def getattr(self, tx, name: str) -> Var:
        if name == "default_factory":
            return self.factory
        return super().getattr(tx, name)

    def getitem(self, tx, key: Var) -> Var:
        k = key_of(tx, key)
        if k not in self.items:
            if self.factory.is_const() and self.factory.as_const() is None:
                raise _raised(KeyError, k)
            self.items[k] = self.factory.call(tx, [], {})
            tx.out.side_effects.mutated(self)
        return self.items[k]

    def children(self) -> list[Var]:
        return [*super().children(), self.factory]

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        body = ", ".join(f"{rebuild_key(cg, k)}: {cg.rebuild(v)}" for k, v in self.items.items())
        return f"{cg.const(collections.defaultdict)}({cg.rebuild(self.factory)}, {{{body}}})"


# -- collections.Counter and collections.deque ----------------------------------------------


class CounterVar(DictVar):
    """``collections.Counter``: a dict of counts. A missing key reads 0 and is not added;
    ``update``/``subtract`` add and subtract counts; ``most_common``, ``elements``,
    ``total`` and the operators (``+ - | &``, comparisons) are computed on a real Counter
    of the (constant) counts, so ties and orders are Counter's own."""

    def __init__(self, items: dict[object, Var], source=None) -> None:
        super().__init__(items, source, cls=collections.Counter)

    def getitem(self, tx, key: Var) -> Var:
        return self.items.get(key.as_const(), ConstVar(0))

    def counts(self) -> collections.Counter:
        if not all(v.is_const() for v in self.items.values()):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "Counter arithmetic on non-constant counts")
        return collections.Counter({k: v.as_const() for k, v in self.items.items()})

    def is_const(self) -> bool:
        return False

    def _count(self, tx, name: str, arg: Var) -> None:
        """``update``/``subtract`` by one argument, as Counter's Python code computes it
        (counts may be sizes or tensors): a mapping's counts are added (or copied into an
        empty counter), an iterable's elements counted one by one."""
        from kiln_capture.variables.builtins import binary

        sign = operator.add if name == "update" else operator.sub
        if isinstance(arg, DictVar):
            if name == "update" and not self.items:
                self.items.update(arg.items)  # dict.update into an empty Counter
                return
            for k, count in list(arg.items.items()):
                have = self.items.get(k, ConstVar(0))
                self.items[k] = (
                    binary(tx, operator.add, count, have)
                    if name == "update"
                    else binary(tx, sign, have, count)
                )
            return
        for element in counter_argument(tx, arg):
            have = self.items.get(element, ConstVar(0))
            self.items[element] = binary(tx, sign, have, ConstVar(1))

    def call_method(self, tx, name, args, kwargs) -> Var:
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name in ("update", "subtract"):
            for arg in [*args[:1], *([DictVar(kwargs)] if kwargs else [])]:
                self._count(tx, name, arg)
            tx.out.side_effects.mutated(self)
            return ConstVar(None)
        if name == "most_common":
            n = args[0].as_const() if args else kwargs.get("n", ConstVar(None)).as_const()
            rows = self.counts().most_common(n)
            return ListVar([TupleVar([ConstVar(k), ConstVar(c)]) for k, c in rows])
        if name == "elements":
            from kiln_capture.variables.iterators import IteratorVar

            return IteratorVar([ConstVar(e) for e in self.counts().elements()])
        if name == "total":
            return ConstVar(self.counts().total())
        if name == "copy":
            return CounterVar(self.items)
        if name == "__delitem__":  # Counter's ignores a missing key
            if self.items.pop(args[0].as_const(), None) is not None:
                tx.out.side_effects.mutated(self)
            return ConstVar(None)
        if name == "__missing__":
            return ConstVar(0)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        body = ", ".join(f"{rebuild_key(cg, k)}: {cg.rebuild(v)}" for k, v in self.items.items())
        return f"{cg.const(collections.Counter)}({{{body}}})"


def counter_binary(tx, fn, a: Var, b: Var) -> Var | None:
    """An operator with a Counter operand (``p + q``, ``p | q``, ``p == q``): computed on
    real Counters of constant counts (the other operand a Counter or a dict of constant
    values). None where the other operand is neither."""
    real = []
    for v in (a, b):
        if isinstance(v, CounterVar):
            real.append(v.counts())
        elif isinstance(v, DictVar) and all(i.is_const() for i in v.items.values()):
            real.append({k: i.as_const() for k, i in v.items.items()})
        elif v.is_const():
            real.append(v.as_const())
        else:
            return None
    from kiln_capture.variables.constants import fold

    result = fold(fn, *real)
    if isinstance(result, collections.Counter):
        return CounterVar({k: ConstVar(n) for k, n in result.items()})
    return tx.out.wrap_value(result)


def counter_argument(tx, arg: Var) -> object:
    """What ``Counter(arg)`` counts, as a real value: a mapping of constant counts, or an
    iterable of constant elements."""
    if isinstance(arg, CounterVar):
        return arg.counts()
    if isinstance(arg, DictVar):
        if not all(v.is_const() for v in arg.items.values()):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "counting a mapping of non-constants")
        return {k: v.as_const() for k, v in arg.items.items()}
    if arg.is_const():
        return arg.as_const()
    from kiln_capture.variables.iterators import iterate

    items = iterate(tx, arg).unpack(tx)
    if not all(i.is_const() for i in items):
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "counting non-constant elements")
    return [i.as_const() for i in items]


def make_counter(tx, args: list[Var], kwargs: dict[str, Var]) -> CounterVar:
    """``Counter(iterable_or_mapping, **kwargs)``: ``update`` of an empty counter (a
    mapping's values are taken as they are, elements are counted)."""
    if len(args) > 1:
        raise _raised(TypeError, f"expected at most 1 argument, got {len(args)}")
    made = CounterVar({})
    for arg in [*args, *([DictVar(kwargs)] if kwargs else [])]:
        made._count(tx, "update", arg)
    return made


class DequeVar(Var):
    """``collections.deque``: its items (Vars) are held in a real deque with the same
    ``maxlen``, so appends that evict, ``rotate``, ``pop`` of an empty deque and the
    iterator's "deque mutated during iteration" are CPython's own. Passed in, its final
    contents are written back after the graph (``clear`` then ``extend``)."""

    def __init__(self, items: list[Var], maxlen: int | None = None, source=None) -> None:
        self.items: collections.deque = collections.deque(items, maxlen)
        self.source = source
        self.changes = 0  # how many changes so far (an iterator started before one raises)

    def __repr__(self) -> str:
        return f"Deque({list(self.items)!r})"

    def python_type(self) -> type:
        return collections.deque

    def truth(self, tx) -> bool:
        return bool(self.items)

    def length(self, tx) -> int:
        return len(self.items)

    def unpack(self, tx) -> list[Var]:
        return list(self.items)

    def children(self) -> list[Var]:
        return list(self.items)

    def contains(self, tx, item: Var) -> bool:
        return any(same_item(tx, item, x) for x in list(self.items))

    def _index(self, key: Var) -> int:
        k = key.as_const()
        if not isinstance(k, int):
            raise _raised(TypeError, f"sequence index must be integer, not '{type(k).__name__}'")
        return k

    def getitem(self, tx, key: Var) -> Var:
        try:
            return self.items[self._index(key)]
        except IndexError as e:
            raise _raised(IndexError, str(e)) from None

    def setitem(self, tx, key: Var, value: Var) -> None:
        try:
            self.items[self._index(key)] = value
        except IndexError as e:
            raise _raised(IndexError, str(e)) from None
        self._mutated(tx)

    def _mutated(self, tx) -> None:
        self.changes += 1
        tx.out.side_effects.mutated(self)

    def getattr(self, tx, name: str) -> Var:
        if name == "maxlen":
            return ConstVar(self.items.maxlen)
        return super().getattr(tx, name)

    _CHANGES = frozenset(
        {"append", "appendleft", "pop", "popleft", "extend", "extendleft", "rotate"}
        | {"clear", "reverse", "insert", "remove", "__delitem__"}
    )

    def call_method(self, tx, name, args, kwargs) -> Var:
        if kwargs:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"deque.{name} with keywords")
        if name in ("__len__",):
            return ConstVar(len(self.items))
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__setitem__":
            self.setitem(tx, args[0], args[1])
            return ConstVar(None)
        if name == "__contains__":
            return ConstVar(self.contains(tx, args[0]))
        if name == "__iter__":
            from kiln_capture.variables.iterators import iterate

            return iterate(tx, self)
        if name == "count":
            return ConstVar(sum(same_item(tx, args[0], x) for x in list(self.items)))
        if name == "index":
            for i, x in enumerate(list(self.items)):
                if same_item(tx, args[0], x):
                    return ConstVar(i)
            raise _raised(ValueError, "deque.index(x): x not in deque")
        if name == "copy":
            return DequeVar(list(self.items), self.items.maxlen)
        if name not in self._CHANGES:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"deque.{name}")
        if name == "remove":
            i = self.call_method(tx, "index", args, {}).as_const()
            del self.items[i]
            self._mutated(tx)
            return ConstVar(None)
        if name in ("extend", "extendleft"):
            values = [args[0].unpack(tx)]
        elif name == "__delitem__":
            values = [self._index(args[0])]
        elif name in ("insert", "rotate", "pop"):
            values = [a.as_const() for a in args[:1]] + list(args[1:])
        else:
            values = list(args)
        try:
            result = getattr(self.items, name)(*values)
        except (IndexError, ValueError) as e:
            raise _raised(type(e), str(e)) from None
        self._mutated(tx)
        return result if isinstance(result, Var) else ConstVar(None)

    def write_back(self, cg, src: str, tmp: str) -> tuple[str, str]:
        """The side-effect statements for a deque passed in (see SideEffects.replay)."""
        items = ", ".join(cg.rebuild(i) for i in self.items)
        return f"{tmp} = [{items}]", f"__k_q = {src}; __k_q.clear(); __k_q.extend({tmp})"

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        items = ", ".join(cg.rebuild(i) for i in self.items)
        return f"{cg.const(collections.deque)}([{items}], {self.items.maxlen!r})"


# -- indexing by a tensor of known value -----------------------------------------------------

_INPLACE_OPERATORS = frozenset(
    {
        operator.setitem,
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.imatmul,
        operator.ilshift,
        operator.irshift,
        operator.iand,
        operator.ior,
        operator.ixor,
    }
)


def _writes(node) -> bool:
    """Whether an FX node may write into one of its inputs (an in-place op)."""
    if node.target in _INPLACE_OPERATORS or "out" in node.kwargs:
        return True
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def known_index(key: Var) -> int | None:
    """The value of a one-element integer tensor made in the trace from a Python int
    (``torch.as_tensor(1)``; functions.py records it as ``index_value``), as
    ``list.__getitem__`` reads it through ``__index__``; None if no in-place op of the
    graph may have changed it since (or of anything computed from it: a view)."""
    value = getattr(key, "index_value", None)
    node = getattr(key, "node", None)
    if value is None or node is None:
        return None
    todo, seen = [node], {node}
    while todo:
        for user in todo.pop().users:
            if _writes(user):
                return None
            if user not in seen:
                seen.add(user)
                todo.append(user)
    return value


def wrap_collection(out, value: object, source, rooted: bool) -> Var | None:
    """A Counter, deque, ModelOutput-style record, enumerate or zip object read from
    ``source`` (an argument, a global, a closure): its
    type, length (a Counter's keys) and maxlen guarded, its items wrapped from their own
    sources; its changes are written back after the graph like a list's. None for other
    values."""
    from kiln_capture.sources import ItemSource

    g = out.guards
    if type(value) is collections.Counter and all(isinstance(k, str | int) for k in value):
        if rooted:
            g.type_is(source, value)
            g.dict_keys(source, tuple(value))
        items = {k: out.wrap(v, ItemSource(source, k)) for k, v in value.items()}
        return CounterVar(items, source)
    if (
        type(value) in (set, frozenset)
        and rooted
        and all(is_constant_value(v) and type(v) is not float for v in value)
    ):
        # a set of constants (an argument, a global, a closure's): its contents guarded;
        # changed in the trace, it is written back after the graph
        e = source.expr()
        g.type_is(source, value)
        g.add(f"{e} == {g.const(frozenset(value))}", f"{e} == {set(value)!r}")
        return SetVar(value, kind=type(value), source=source)
    if type(value) is collections.deque:
        if rooted:
            g.type_is(source, value)
            g.length(source, len(value))
            e = source.expr()
            g.add(f"{e}.maxlen == {value.maxlen!r}", f"{e}.maxlen == {value.maxlen!r}")
        items = [out.wrap(v, ItemSource(source, i)) for i, v in enumerate(value)]
        return DequeVar(items, value.maxlen, source)
    if rooted and isinstance(value, dict) and hasattr(value, "__dataclass_fields__"):
        from kiln_capture.variables.records import wrap_record  # a ModelOutput

        return wrap_record(out, value, source)
    if type(value) is type(reversed([])) and rooted:  # a continuation's loop iterator
        from kiln_capture.variables.iterators import wrap_reversed

        return wrap_reversed(out, value, source)
    if type(value) in (enumerate, zip) and rooted:  # a continuation's loop iterator
        from kiln_capture.variables.iterators import wrap_enumerate_zip

        return wrap_enumerate_zip(out, value, source)
    return None


# Iterators live in iterators.py; these names are still importable from here.
_MOVED_TO_ITERATORS = frozenset(
    {
        "IteratorVar",
        "LIST_ITERATOR_TYPES",
        "SourcedIteratorVar",
        "ListIteratorVar",
        "DictIteratorVar",
        "DequeIteratorVar",
        "EnumerateVar",
        "ZipVar",
        "iterate",
        "iter_remaining",
        "iter_peek",
        "iter_advance",
    }
)


def __getattr__(name: str):
    if name in _MOVED_TO_ITERATORS:
        from kiln_capture.variables import iterators

        return getattr(iterators, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
