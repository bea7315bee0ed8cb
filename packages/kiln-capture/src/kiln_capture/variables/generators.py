"""Generators and ``@contextlib.contextmanager`` managers made inside the trace.

Design note: "suspended frames"
-------------------------------
Calling a generator function in captured code runs none of its body, as in CPython: it
makes a GeneratorVar holding a child Frame of the evaluator over the function's code.
The evaluator keeps a frame's whole state (stack, instruction pointer, locals, cells)
on the Frame object, so suspending one is stopping its loop: ``YIELD_VALUE`` raises
``Yield`` out of ``Frame.step`` and the GeneratorVar catches it; resuming pushes the sent
value and steps on. So a generator's body interleaves with its consumer exactly as in
eager code (side effects in order, infinite generators read lazily), and ``yield from``
(``SEND``) drives an inner generator the same way.

A ``@contextlib.contextmanager`` function called in the trace makes a GeneratorCMVar:
``__enter__`` runs the generator to its first ``yield`` (setup) and ``__exit__`` runs it
to its end (teardown), both traced into the graph. Exceptions are never raised inside a
traced block (a raise is a graph break), so ``__exit__`` is only traced for a block that
completes; a graph break inside the block (or inside setup or teardown) moves to the
``with`` statement itself (break B011), where the real manager is made and entered in
Python: a manager not yet entered is rebuilt as the call that made it.

A generator still suspended where a graph break cuts the frame cannot be handed to
generated code; ``drain`` runs it to its end in the trace and hands on its remaining
items (``iter([...])``), which is what eager code sees unless the generator's body
has effects a later step observes.
"""

from __future__ import annotations

import contextlib
import dis
import types

from kiln_capture import breaks
from kiln_capture.bytecode.rewrite import parse_exception_table
from kiln_capture.errors import Raised, Unsupported
from kiln_capture.variables.base import MethodCallVar, Var
from kiln_capture.variables.constants import ConstVar
from kiln_capture.variables.exceptions import ExcVar, raised, stop_iteration_error
from kiln_capture.variables.iterators import IteratorVar

# the code of every function @contextlib.contextmanager returns
CONTEXTMANAGER_HELPER = contextlib.contextmanager(lambda: iter(())).__code__


_DRAIN_LIMIT = 10_000


class Yield(Exception):
    """Raised by a generator frame's ``YIELD_VALUE``: the frame stops there."""

    def __init__(self, value: Var) -> None:
        self.value = value


class LazyIteratorVar(IteratorVar):
    """An iterator whose items are computed when read (``pull``); ``drain`` computes the
    rest now and keeps them, after which it is an iterator over materialized items."""

    def __init__(self) -> None:
        super().__init__([])
        self.drained = False

    def pull(self) -> Var | None:
        raise NotImplementedError

    def next(self) -> Var | None:
        return super().next() if self.drained else self.pull()

    def unpack(self, tx) -> list[Var]:
        if self.drained:
            return super().unpack(tx)
        items = []
        while (v := self.pull()) is not None:
            items.append(v)
        return items

    def drain(self) -> None:
        if self.drained:
            return
        items = []
        while (v := self.pull()) is not None:
            items.append(v)
            if len(items) > _DRAIN_LIMIT:  # itertools.count(): eager code reads it lazily
                raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r} has no end in sight")
        self.items, self.pos, self.drained = items, 0, True

    def sources(self) -> list[Var]:
        """The iterators it reads from (drained after it at a break)."""
        return []

    def children(self) -> list[Var]:
        return super().children() if self.drained else self.sources()

    def reconstruct(self, cg) -> str:
        if self.drained:
            return super().reconstruct(cg)
        raise Unsupported(
            breaks.UNSUPPORTED_VALUE, f"an iterator ({self!r}) leaving the captured region"
        )


class PullIteratorVar(LazyIteratorVar):
    """An iterator over others, computed on demand (zip, map, enumerate, islice, count
    over generators or endless iterators): ``step()`` gives the next item or None."""

    def __init__(self, name: str, step, sources: list[Var]) -> None:
        super().__init__()
        self.name, self.step, self.inputs = name, step, sources
        self.done = False

    def __repr__(self) -> str:
        return f"LazyIterator({self.name})"

    def pull(self) -> Var | None:
        if self.done:
            return None
        v = self.step()
        if v is None:
            self.done = True
        return v

    def sources(self) -> list[Var]:
        return list(self.inputs)

    # ``map(fn, *its)`` / ``filter(fn, it)``: (the builtin, fn); rebuilt at a break as the
    # builtin over its sources where they stand (their rest is its rest: neither keeps
    # state of its own)
    remake: tuple | None = None

    def children(self) -> list[Var]:
        if self.remake is not None and not self.drained:
            return [self.remake[1], *self.inputs]
        return super().children()

    def reconstruct(self, cg) -> str:
        if self.remake is None or self.drained:
            return super().reconstruct(cg)
        builtin, fn = self.remake
        args = ", ".join(cg.rebuild(v) for v in [fn, *self.inputs])
        return f"{cg.const(builtin)}({args})"


class GeneratorVar(LazyIteratorVar):
    """A generator made by calling a generator function in the trace."""

    def __init__(self, frame) -> None:
        super().__init__()
        self.frame = frame
        self.started = False
        self.done = False
        self.running = False
        self.result: Var = ConstVar(None)  # what its ``return`` gave (StopIteration.value)

    def __repr__(self) -> str:
        return f"Generator({self.frame.name})"

    def python_type(self) -> type:
        return types.GeneratorType

    def pull(self) -> Var | None:
        return self.send(ConstVar(None))

    def send(self, value: Var) -> Var | None:
        """Resume with ``value`` (None for next()); the next yielded value, or None when
        the generator returns."""
        if self.drained:
            return super().next()
        if self.done:
            return None
        if self.running:
            raise Unsupported(breaks.EXCEPTION, "ValueError: generator already executing")
        f = self.frame
        if not self.started:
            if not (value.is_const() and value.as_const() is None):
                raise Unsupported(
                    breaks.EXCEPTION, "TypeError: can't send non-None value to a new generator"
                )
            self.started = True
        else:
            f.push(value)
        return self._resume()

    def throw(self, exc: ExcVar) -> Var | None:
        """``gen.throw(exc)``: raised at the ``yield`` the generator is suspended at, where
        its own handlers see it; the next yielded value, or None when it returns."""
        if self.running:
            raise Unsupported(breaks.EXCEPTION, "ValueError: generator already executing")
        if self.drained:
            raise Unsupported(breaks.EXCEPTION, "throw() into a generator drained at a break")
        f = self.frame
        if self.done or not self.started or not f.unwind(f.instructions[f.ip - 1].offset, exc):
            self.done = True
            raise Raised(exc, exc.message())
        return self._resume()

    def _resume(self) -> Var | None:
        f = self.frame
        out = f.out
        caller = out.frame
        if caller is not None and caller is not f:
            f.parent = caller  # stack traces and break locations read the current caller
            f.exc_state = caller.exc_state
        self.running = True
        try:
            while True:
                f.step()
        except Yield as y:
            return y.value
        except _return() as r:
            self.done = True
            self.result = r.value
            return None
        except Raised as e:  # it leaves the generator, which is finished (PEP 479 on 3.11)
            self.done = True
            e.exc = stop_iteration_error(e.exc)
            raise
        finally:
            self.running = False
            out.frame = caller

    def call_method(self, tx, name, args, kwargs) -> Var:
        if name == "__next__" and not args:
            v = self.next()
            if v is None:
                raise raised(StopIteration, *self._stop_args())
            return v
        if name == "__iter__" and not args:
            return self
        if name == "send" and len(args) == 1:
            v = self.send(args[0])
            if v is None:
                raise raised(StopIteration, *self._stop_args())
            return v
        if name == "throw" and len(args) == 1:
            from kiln_capture.variables.exceptions import as_exception

            v = self.throw(as_exception(tx, args[0]))
            if v is None:
                raise raised(StopIteration, *self._stop_args())
            return v
        if name == "close" and not args:
            self.close()
            return ConstVar(None)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"generator.{name}")

    def _stop_args(self) -> list[Var]:
        """StopIteration's arguments once it returned: its return value, if not None."""
        r = self.result
        return [] if r.is_const() and r.as_const() is None else [r]

    def close(self) -> None:
        """``close()`` throws GeneratorExit at the current ``yield``: its handlers and
        ``finally`` blocks run; yielding again is a RuntimeError."""
        if self.done or not self.started or self.drained:
            self.done = True
            return
        if not _handled_at(self.frame.code, self.frame.instructions[self.frame.ip - 1].offset):
            self.done = True  # nothing of the body runs
            return
        try:
            value = self.throw(ExcVar(GeneratorExit, []))
        except Raised as e:
            if issubclass(e.exc.python_type(), GeneratorExit | StopIteration):
                return
            raise
        if value is not None:
            raise raised(RuntimeError, "generator ignored GeneratorExit")


def drain_generators(roots: list[Var]) -> None:
    """At a graph break, every generator reachable from ``roots`` (the frame's stack and
    locals) runs to its end in the trace, so that generated code can hand on its remaining
    items (see the design note). One whose body cannot be traced stays as it is, and
    rebuilding it fails (the frame then runs eagerly)."""
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if (
            isinstance(v, LazyIteratorVar)
            and not v.drained
            and not getattr(v, "running", False)
            and getattr(v, "remake", None) is None  # map/filter: rebuilt over its sources
        ):
            try:
                v.drain()
            except Unsupported:
                continue
        todo.extend(v.children())
        contents = getattr(v, "contents", None)
        if isinstance(contents, Var):
            todo.append(contents)


def _handled_at(code, offset: int) -> bool:
    """Whether a handler of ``code`` (other than 3.12's implicit one, which turns a
    StopIteration into a RuntimeError) covers ``offset``."""
    instructions = {ins.offset: ins for ins in dis.get_instructions(code)}
    for start, end, target, _depth, _lasti in parse_exception_table(code):
        handler = instructions.get(target)
        implicit = handler is not None and handler.opname == "CALL_INTRINSIC_1" and handler.arg == 3
        if start <= offset < end and not implicit:
            return True
    return False


def _return() -> type[Exception]:
    from kiln_capture.evaluator import Return  # the evaluator imports this module

    return Return


def contextmanager_function(fn) -> types.FunctionType | None:
    """The generator function behind a ``@contextlib.contextmanager`` function (the
    ``__wrapped__`` that ``functools.wraps`` sets)."""
    if getattr(fn, "__code__", None) is not CONTEXTMANAGER_HELPER:
        return None
    func = getattr(fn, "__wrapped__", None)
    return func if isinstance(func, types.FunctionType) else None


class GeneratorCMVar(Var):
    """``my_cm(...)`` for a ``@contextlib.contextmanager`` function ``my_cm``."""

    def __init__(self, maker, args: list[Var], kwargs: dict[str, Var], gen: GeneratorVar) -> None:
        self.maker = maker  # the decorated function: calling it again makes a fresh manager
        self.args = args
        self.kwargs = kwargs
        self.gen = gen

    def __repr__(self) -> str:
        return f"GeneratorContextManager({self.gen.frame.name})"

    def python_type(self) -> type:
        return contextlib._GeneratorContextManager

    def getattr(self, tx, name):
        if name in ("__enter__", "__exit__"):
            return MethodCallVar(self, name)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r}.{name}")

    def call_method(self, tx, name, args, kwargs) -> Var:
        if name == "__enter__":
            if self.gen.started:
                raise Unsupported(breaks.EXCEPTION, "a generator context manager entered twice")
            value = self.gen.next()
            if value is None:
                raise Unsupported(breaks.EXCEPTION, "RuntimeError: generator didn't yield")
            return value
        if name == "__exit__":
            typ = args[0] if args else ConstVar(None)
            if not (typ.is_const() and typ.as_const() is None):
                return self._exit_with(args[1])
            if self.gen.next() is not None:
                raise raised(RuntimeError, "generator didn't stop")
            return ConstVar(False)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r}.{name}")

    def _exit_with(self, exc: Var) -> Var:
        """``__exit__`` for a block left by ``exc``: thrown into the generator at its
        ``yield`` (contextlib's rules: suppressed when the generator returns; the same
        exception coming back out, or a StopIteration turned RuntimeError, is not
        suppressed; another exception replaces it)."""
        if not isinstance(exc, ExcVar):
            raise Unsupported(breaks.EXCEPTION, f"{exc!r} thrown into a generator context manager")
        try:
            value = self.gen.throw(exc)
        except Raised as e:
            if e.exc is exc or (
                issubclass(exc.cls, StopIteration) and e.exc.attrs.get("__cause__") is exc
            ):
                return ConstVar(False)
            raise
        if value is None:  # it returned: StopIteration, the exception is suppressed
            return ConstVar(True)
        raise raised(RuntimeError, "generator didn't stop after throw()")

    def children(self) -> list[Var]:
        return [*self.args, *self.kwargs.values()]

    def reconstruct(self, cg) -> str:
        if self.gen.started:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, f"{self!r} entered in the trace, live across a break"
            )
        parts = [cg.rebuild(a) for a in self.args]
        parts += [f"{k}={cg.rebuild(v)}" for k, v in self.kwargs.items()]
        return f"{cg.const(self.maker)}({', '.join(parts)})"


def make_generator_cm(tx, maker, args: list[Var], kwargs: dict[str, Var], source) -> Var | None:
    """The call of a ``@contextlib.contextmanager`` function ``maker`` read from
    ``source`` (or None), or None for another function."""
    func = contextmanager_function(maker)
    if func is None:
        return None
    from kiln_capture.sources import AttrSource
    from kiln_capture.variables.functions import UserFunctionVar

    fn = UserFunctionVar(func)
    if source is not None:  # its closure is read (and guarded) through the maker's source
        wrapped = tx.out.wrap(func, AttrSource(source, "__wrapped__"))  # guards its identity
        fn = UserFunctionVar(func, wrapped.source)  # inlined, even where torch defines it
    gen = fn.call(tx, list(args), dict(kwargs))
    if not isinstance(gen, GeneratorVar):
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{maker.__qualname__} is not a generator")
    return GeneratorCMVar(maker, list(args), dict(kwargs), gen)


__all__ = [
    "CONTEXTMANAGER_HELPER",
    "GeneratorCMVar",
    "GeneratorVar",
    "LazyIteratorVar",
    "PullIteratorVar",
    "Yield",
    "contextmanager_function",
    "drain_generators",
    "make_generator_cm",
]
