"""Iterators: over materialized items, and live ones over the trace's lists, dicts and
deques (CPython's semantics: items appended by a loop body are visited, a dict or deque
that changes size while iterated raises), ``enumerate``/``zip`` read on demand, and the
real iterators a continuation is handed (a loop's iterator at a break).

Each is rebuilt at a break as a real iterator over the rebuilt container, advanced as
far as the trace read it, so the continuation still iterates live; one over a container
the generated code writes back after the graph is handed on as its remaining items.
"""

from __future__ import annotations

import collections

from kiln_capture.variables.base import Var
from kiln_capture.variables.constants import ConstVar
from kiln_capture.variables.containers import (
    _VIEW_TYPES_OF_EMPTY,
    DequeVar,
    DictVar,
    DictViewVar,
    ListVar,
    TupleVar,
    _raised,
    key_var,
)


def _drain(self, tx) -> list[Var]:
    """``unpack`` of a live iterator: every item left, read one by one with ``next`` (so
    the container's changes and the iterator's own position are honoured)."""
    out = []
    while (v := self.next()) is not None:
        out.append(v)
    return out


class IteratorVar(Var):
    """An iterator over materialized items (lists, tuples, ranges, zip, enumerate...)."""

    def __init__(self, items: list[Var]) -> None:
        self.items = list(items)
        self.pos = 0

    def __repr__(self) -> str:
        return f"Iterator({self.items[self.pos :]!r})"

    def python_type(self) -> type:
        return LIST_ITERATOR_TYPES[0]  # as reconstruct() rebuilds it

    def next(self) -> Var | None:
        if self.pos >= len(self.items):
            return None
        self.pos += 1
        return self.items[self.pos - 1]

    def unpack(self, tx) -> list[Var]:
        rest = self.items[self.pos :]
        self.pos = len(self.items)
        return rest

    def children(self) -> list[Var]:
        return self.items[self.pos :]

    def reconstruct(self, cg) -> str:
        return "iter([" + ", ".join(cg.rebuild(i) for i in self.items[self.pos :]) + "])"


LIST_ITERATOR_TYPES = (type(iter([])), type(iter(())))


class ListIteratorVar(IteratorVar):
    """``iter(lst)`` of a list in the trace: live, as CPython's list iterator is. Each
    step reads the list's current items at the next position, so items appended while
    a ``for`` loop runs are visited; once exhausted it stays exhausted. Rebuilt at a
    break as the real list's iterator advanced as far (so it stays live there too)."""

    def __init__(self, seq: ListVar) -> None:
        super().__init__([])
        self.seq = seq
        self.done = False

    def __repr__(self) -> str:
        return f"ListIterator(at {self.pos} of {self.seq!r})"

    def next(self) -> Var | None:
        if self.done or self.pos >= len(self.seq.items):
            self.done = True
            return None
        self.pos += 1
        return self.seq.items[self.pos - 1]

    unpack = _drain

    def children(self) -> list[Var]:
        return [self.seq]

    def reconstruct(self, cg) -> str:
        if self.done:
            return "iter([])"
        return f"{cg.const(iter_advance)}(iter({cg.rebuild(self.seq)}), {self.pos})"


class ListReverseIteratorVar(IteratorVar):
    """``reversed(lst)`` of a list in the trace: live, as CPython's: it reads the item at
    its index (counting down) while the index is inside the list, and once it is not, it
    is exhausted for good. Rebuilt at a break as the real list's reverse iterator at the
    same index; one handed to a continuation is read the same way (``wrap_collection``)."""

    def __init__(self, seq: ListVar, index: int | None = None, source=None) -> None:
        super().__init__([])
        self.seq, self.source = seq, source
        self.index = len(seq.items) - 1 if index is None else index

    def __repr__(self) -> str:
        return f"ListReverseIterator(at {self.index} of {self.seq!r})"

    def python_type(self) -> type:
        return type(reversed([]))

    def next(self) -> Var | None:
        if 0 <= self.index < len(self.seq.items):
            self.index -= 1
            return self.seq.items[self.index + 1]
        self.index = -1
        return None

    unpack = _drain

    def children(self) -> list[Var]:
        return [self.seq]

    def reconstruct(self, cg) -> str:  # never the real object read: its index moved on
        return f"{cg.const(reversed_at)}({cg.rebuild(self.seq)}, {self.index})"


def reversed_at(lst: list, index: int):
    """``reversed(lst)`` at ``index`` (-1: exhausted)."""
    it = reversed(lst)
    if index < 0:
        for _ in it:
            pass
    else:
        it.__setstate__(index)
    return it


def wrap_reversed(out, value: object, source) -> Var | None:
    """A list's reverse iterator handed to a continuation: the list is the trace's (the
    frame's own reference to it, identity guarded), the index guarded; the real iterator
    is put at the trace's index after the list is written back."""
    from kiln_capture.sources import CallSource

    r = value.__reduce__()
    index = CallSource(out.const_ref(reduce_index), source, ()).expr()
    if len(r) < 3:  # exhausted for good
        out.guards.type_is(source, value)
        out.guards.add(f"{index} == -1", f"{source.expr()} is exhausted")
        return IteratorVar([])
    if type(r[1][0]) is not list:
        return None
    ref = out.const_ref(reduce_arg)
    seq = out.wrap(r[1][0], CallSource(ref, source, (0,)))
    if not isinstance(seq, ListVar):
        return None
    out.guards.type_is(source, value)
    out.guards.add(f"{index} == {r[2]}", f"{source.expr()} is at item {r[2]}")
    made = ListReverseIteratorVar(seq, r[2], source)
    out.side_effects.mutated(seq)  # written back before the iterator is moved
    out.side_effects.call_after(
        lambda cg: f"{cg.const(set_reversed)}({source.expr()}, {made.index})"
    )
    return made


def reduce_index(it) -> int:
    r = it.__reduce__()
    return r[2] if len(r) > 2 else -1


def set_reversed(it, index: int) -> None:
    if index < 0:
        for _ in it:
            pass
    else:
        it.__setstate__(index)


_DICT_ITERATOR_TYPES = {k: type(iter(v)) for k, v in _VIEW_TYPES_OF_EMPTY.items()}


class DictIteratorVar(IteratorVar):
    """``iter(d)``, ``iter(d.values())``, ``iter(d.items())`` of a dict in the trace:
    a real iterator over the Python dict (or OrderedDict) that holds the DictVar's
    entries (changed in place only), so CPython itself decides what it yields and when it raises: a key added
    or removed while a loop runs raises RuntimeError("dictionary changed size during
    iteration") in the trace, where the code's handlers may catch it."""

    def __init__(self, d: DictVar, kind: str = "keys") -> None:
        super().__init__([])
        self.d, self.kind = d, kind
        self.real = iter(d.items)
        self.size = len(d.items)  # CPython's iterator raises once the size differs
        self.done = False

    def __repr__(self) -> str:
        return f"DictIterator({self.kind} at {self.pos} of {self.d!r})"

    def python_type(self) -> type:
        return _DICT_ITERATOR_TYPES[self.kind]

    def next(self) -> Var | None:
        try:
            k = next(self.real)
        except StopIteration:
            self.done = True
            return None
        except RuntimeError as e:  # the dict changed size (an OrderedDict: or order)
            raise _raised(RuntimeError, str(e)) from None
        self.pos += 1
        if self.kind == "keys":
            return key_var(k)
        if self.kind == "values":
            return self.d.items[k]
        return TupleVar([key_var(k), self.d.items[k]])

    unpack = _drain

    def children(self) -> list[Var]:
        return [self.d]

    def reconstruct(self, cg) -> str:
        """At a break: the items still to come, as an iterator over them (a list iterator
        the continuation reads like any other), or, where the dict already changed size,
        an iterator that raises as CPython's would on its next read. A real dict
        iterator would tie the continuation to an object it cannot read."""
        if self.done:
            return "iter([])"
        if len(self.d.items) != self.size:
            ordered = isinstance(self.d.items, collections.OrderedDict)
            what = "OrderedDict mutated" if ordered else "dictionary changed size"
            return f"{cg.const(raises_on_next)}({what + ' during iteration'!r})"
        rest = list(self.d.items)[self.pos :]
        return "iter([" + "".join(cg.rebuild(self._item(k)) + ", " for k in rest) + "])"

    def _item(self, k) -> Var:
        if self.kind == "keys":
            return key_var(k)
        if self.kind == "values":
            return self.d.items[k]
        return TupleVar([key_var(k), self.d.items[k]])


def iterate(tx, v: Var) -> IteratorVar:
    """What ``iter(v)`` (GET_ITER, ``for``) gives: ``v`` itself for an iterator, a live
    iterator over a list, dict or dict view, else one over ``v``'s items."""
    if isinstance(v, IteratorVar):
        return v
    if type(v) is ListVar:
        return ListIteratorVar(v)
    if isinstance(v, DictVar):
        return DictIteratorVar(v, "keys")
    if isinstance(v, DictViewVar):
        return DictIteratorVar(v.d, v.kind)
    if isinstance(v, DequeVar):
        return DequeIteratorVar(v)
    entries = getattr(v, "entries_var", None)  # a record (objects.py): over its entries
    if entries is not None:
        return DictIteratorVar(entries(), "keys")
    return IteratorVar(v.unpack(tx))


def iter_remaining(it) -> int:
    """Items left in a list/tuple iterator, read without consuming any."""
    r = it.__reduce__()
    return len(r[1][0]) - r[2] if len(r) > 2 else 0


def iter_peek(it, i: int):
    """The ``i``-th item still to come from a list/tuple iterator, without consuming it."""
    r = it.__reduce__()
    return r[1][0][r[2] + i]


def iter_advance(it, n: int):
    for _ in range(n):
        next(it)
    return it


def iter_list(it) -> list | None:
    """The list a list iterator reads (None once it is exhausted)."""
    r = it.__reduce__()
    return r[1][0] if len(r) > 2 and type(r[1][0]) is list else None


def iter_index(it) -> int:
    """The position of a list iterator in its list."""
    r = it.__reduce__()
    return r[2] if len(r) > 2 else -1


def iter_seek(it, index: int, exhausted: bool):
    """Put a list iterator at ``index`` of its list (written back already), or exhaust it."""
    if exhausted:
        for _ in it:
            pass
    else:
        it.__setstate__(index)
    return it


class SourcedIteratorVar(IteratorVar):
    """A real list/tuple iterator read from the frame: how a continuation resuming inside
    a ``for`` loop receives the loop's iterator (the generated code hands it on as
    ``iter([<remaining items>])``). Items are read lazily, through ``iter_peek``, and
    guarded as they are consumed; the generated code then advances the real iterator by
    as many items as the trace consumed, so it is where eager code would leave it."""

    def __init__(self, out, it, source) -> None:
        super().__init__([])
        self.out = out
        self.real = it
        self.source = source
        self.available = iter_remaining(it)
        self._advance_registered = False
        self.seq: ListVar | None = None  # the list it reads, where the trace holds it
        self.done = False
        # followed at the first read: an iterator only handed on (the loop's iterator in a
        # continuation that ends at its FOR_ITER, capture.py) is guarded by type alone
        self._unread = type(it) is LIST_ITERATOR_TYPES[0] and iter_list(it) is not None

    def _follow_list(self, lst: list) -> None:
        """A list iterator reads the list's items live, as ListIteratorVar does: the
        continuation of a ``for`` loop over a list that the loop body appends to (a
        graph break inside the loop) sees the items the trace appends. The list is the
        trace's (the same Var as the frame's own reference to it, identity guarded); the
        iterator's position is guarded, and generated code sets the real iterator's
        position after the list's contents are written back."""
        from kiln_capture.sources import CallSource

        out, src = self.out, self.source
        self.start = iter_index(self.real)
        index = CallSource(out.const_ref(iter_index), src, ()).expr()
        out.guards.add(f"{index} == {self.start}", f"{src.expr()} is at item {self.start}")
        seq = out.wrap(lst, CallSource(out.const_ref(iter_list), src, ()))
        if not isinstance(seq, ListVar):
            return
        self.seq = seq
        out.side_effects.mutated(seq)  # written back before the iterator is moved
        out.side_effects.call_after(
            lambda cg: f"{cg.const(iter_seek)}({src.expr()}, {self.start + self.pos}, {self.done})"
        )

    def __repr__(self) -> str:
        return f"Iterator({self.source.expr()}, consumed {self.pos} of {self.available})"

    def _guard_count(self, exact: bool) -> None:
        from kiln_capture.sources import CallSource

        g = self.out.guards
        n = CallSource(self.out.const_ref(iter_remaining), self.source, ()).expr()
        if exact:
            g.add(f"{n} == {self.pos}", f"{self.source.expr()} has {self.pos} items left")
        else:
            g.add(f"{n} >= {self.pos}", f"{self.source.expr()} has >= {self.pos} items left")
        if not self._advance_registered:
            self._advance_registered = True
            self.out.side_effects.call_after(
                lambda cg: f"{cg.const(iter_advance)}({self.source.expr()}, {self.pos})"
            )

    def next(self) -> Var | None:
        from kiln_capture.sources import CallSource

        if self._unread:
            self._unread = False
            self._follow_list(iter_list(self.real))
        if self.seq is not None:
            i = self.start + self.pos
            if self.done or i >= len(self.seq.items):
                self.done = True
                return None
            self.pos += 1
            item = self.seq.items[i]
            self.items.append(item)
            return item
        if self.pos >= self.available:
            self._guard_count(exact=True)
            return None
        src = CallSource(self.out.const_ref(iter_peek), self.source, (self.pos,))
        item = self.out.wrap(iter_peek(self.real, self.pos), src)
        self.items.append(item)
        self.pos += 1
        self._guard_count(exact=False)
        return item

    def unpack(self, tx) -> list[Var]:
        start = self.pos
        while self.next() is not None:
            pass
        return self.items[start:]

    def children(self) -> list[Var]:
        return [self.seq] if self.seq is not None else []

    def reconstruct(self, cg) -> str:
        return self.source.expr()


class DequeIteratorVar(IteratorVar):
    """``iter(d)`` of a deque in the trace: CPython's own iterator over the real deque
    that holds the items, so changing the deque while a loop runs raises RuntimeError
    ("deque mutated during iteration") in the trace, as eager code does."""

    def __init__(self, d: DequeVar) -> None:
        super().__init__([])
        self.d = d
        self.real = iter(d.items)
        self.changes = d.changes  # CPython's iterator raises after any change
        self.done = False

    def __repr__(self) -> str:
        return f"DequeIterator(at {self.pos} of {self.d!r})"

    def python_type(self) -> type:
        return type(iter(collections.deque()))

    def next(self) -> Var | None:
        try:
            v = next(self.real)
        except StopIteration:
            self.done = True
            return None
        except RuntimeError as e:
            raise _raised(RuntimeError, str(e)) from None
        self.pos += 1
        return v

    unpack = _drain

    def children(self) -> list[Var]:
        return [self.d]

    def reconstruct(self, cg) -> str:  # as DictIteratorVar's
        if self.done:
            return "iter([])"
        if self.d.changes != self.changes:
            return f"{cg.const(raises_on_next)}('deque mutated during iteration')"
        rest = list(self.d.items)[self.pos :]
        return "iter([" + "".join(cg.rebuild(v) + ", " for v in rest) + "])"


def raises_on_next(message: str):
    """An iterator whose first read raises RuntimeError(message): a dict's or deque's
    iterator after its container changed, handed to a continuation."""
    raise RuntimeError(message)
    yield


# -- enumerate and zip over iterators the trace reads on demand ------------------------------


class EnumerateVar(IteratorVar):
    """``enumerate(it, start)``: reads ``it`` one item at a time (live over a list the loop
    body changes). Rebuilt at a break as a real ``enumerate`` over the rebuilt iterator
    and the next count, so the continuation still reads the list live; one handed to a
    continuation is read the same way (``wrap_collection``)."""

    def __init__(self, it: IteratorVar, count: int, source=None) -> None:
        super().__init__([])
        self.it, self.count, self.source = it, count, source

    def __repr__(self) -> str:
        return f"Enumerate({self.it!r} from {self.count})"

    def python_type(self) -> type:
        return enumerate

    def next(self) -> Var | None:
        v = self.it.next()
        if v is None:
            return None
        self.count += 1
        return TupleVar([ConstVar(self.count - 1), v])

    unpack = _drain

    def children(self) -> list[Var]:
        return [self.it]

    def reconstruct(self, cg) -> str:  # never the real object read: its count moved on
        return f"enumerate({cg.rebuild(self.it)}, {self.count})"


class ZipVar(IteratorVar):
    """``zip(*iterators)`` (not strict): one item of each in turn, stopping at the first
    exhausted one, as CPython reads them; rebuilt at a break as a real ``zip``."""

    def __init__(self, iters: list[IteratorVar], source=None) -> None:
        super().__init__([])
        self.iters, self.source = list(iters), source
        self.done = False

    def __repr__(self) -> str:
        return f"Zip({self.iters!r})"

    def python_type(self) -> type:
        return zip

    def next(self) -> Var | None:
        if self.done or not self.iters:
            return None
        row = []
        for it in self.iters:
            v = it.next()
            if v is None:
                self.done = True
                return None
            row.append(v)
        return TupleVar(row)

    unpack = _drain

    def children(self) -> list[Var]:
        return list(self.iters)

    def reconstruct(self, cg) -> str:
        if self.done:
            return "iter([])"
        return "zip(" + "".join(cg.rebuild(i) + ", " for i in self.iters) + ")"


def reduce_arg(obj, i: int):
    """``obj.__reduce__()[1][i]``: the iterator an enumerate or zip object reads."""
    return obj.__reduce__()[1][i]


def wrap_enumerate_zip(out, value: object, source) -> Var | None:
    from kiln_capture.sources import CallSource

    r = value.__reduce__()
    if type(value) is zip and len(r) > 2:
        return None  # strict=True
    ref = out.const_ref(reduce_arg)
    n = len(r[1]) if type(value) is zip else 1
    inner = [out.wrap(r[1][i], CallSource(ref, source, (i,))) for i in range(n)]
    if not all(isinstance(i, IteratorVar) for i in inner):
        return None
    out.guards.type_is(source, value)
    if type(value) is zip:
        return ZipVar(inner, source)
    count = r[1][1]
    e = CallSource(ref, source, (1,)).expr()
    out.guards.add(f"{e} == {count!r}", f"{source.expr()} counts from {count}")
    return EnumerateVar(inner[0], count, source)
