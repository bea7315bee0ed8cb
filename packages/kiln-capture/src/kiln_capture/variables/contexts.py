"""Context managers the trace models: grad modes and autocast.

Grad modes (``torch.no_grad()``, ``enable_grad()``, ``set_grad_enabled``): entering one
flips the trace's grad mode (metadata is computed under it) and records
``torch._C._set_grad_enabled`` in the graph, so the graph carries the same mode.

Autocast (``torch.autocast``, ``torch.amp.autocast``, ``torch.cpu.amp.autocast``, the
decorator form too): entering records ``torch.amp._enter_autocast(device, dtype, enabled,
cache_enabled)`` and exiting ``torch.amp._exit_autocast(mode)``, so running the graph as
given casts as eager does, and a tracer that runs the graph's nodes under its own
dispatch mode sees the casts (autocast sits above the Python dispatch key). Metadata
inside the region is computed under the same autocast state (see autocast_state.py).
Every graph leaves the autocast state as it found it: regions still open at the end of
a graph (a graph break inside the block) are closed by the graph, and the generated
code enters a real autocast for the continuation (see ``ContextMethodVar.reconstruct``).
"""

from __future__ import annotations

import inspect
import types
import warnings

import torch

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.variables.base import Var
from kiln_capture.variables.constants import ConstVar

GRAD_MODE_CLASSES = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)


class ContextVar(Var):
    """A context manager the trace models: ``enter``/``exit`` change the trace's state."""

    def enter(self, tx) -> Var:
        raise NotImplementedError

    def exit(self, tx) -> None:
        raise NotImplementedError

    def constructor(self, cg) -> str:
        """An expression that makes an equivalent, not yet entered, real context manager."""
        raise NotImplementedError

    def getattr(self, tx, name):
        if name == "__enter__":
            return ContextMethodVar(self, "enter")
        if name == "__exit__":
            return ContextMethodVar(self, "exit")
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r}.{name}")

    def reconstruct(self, cg) -> str:
        raise Unsupported(
            breaks.UNSUPPORTED_VALUE, f"context manager {self!r} live across a graph break"
        )


class GradModeVar(ContextVar):
    def __init__(self, tx, cls: type, args: list[Var]) -> None:
        self.cls = cls
        if cls is torch.no_grad:
            self.target = False
        elif cls is torch.enable_grad:
            self.target = True
        else:
            self.target = bool(args[0].as_const())
        self.prev: bool | None = None
        self.entered = False
        if cls is torch.set_grad_enabled:  # takes effect at construction, like torch's
            self.prev = tx.out.set_grad(self.target)

    def __repr__(self) -> str:
        return f"GradMode({self.cls.__name__}, {self.target})"

    def python_type(self) -> type:
        return self.cls

    def enter(self, tx) -> Var:
        if self.cls is not torch.set_grad_enabled:
            self.prev = tx.out.set_grad(self.target)
        else:  # its __enter__ sets the mode again; __exit__ restores the one before making
            tx.out.set_grad(self.target)
        self.entered = True
        tx.contexts.append(self)
        return ConstVar(None)

    def exit(self, tx) -> None:
        if self.prev is None:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, "exit of a grad-mode context that was not entered"
            )
        tx.out.set_grad(self.prev)
        self.entered = False
        if tx.contexts and tx.contexts[-1] is self:
            tx.contexts.pop()

    def constructor(self, cg) -> str:
        arg = repr(self.target) if self.cls is torch.set_grad_enabled else ""
        return f"{cg.const(self.cls)}({arg})"

    def reconstruct(self, cg) -> str:
        """A grad mode made but not entered, live across a graph break (``ctx =
        torch.set_grad_enabled(True)`` before a break, ``with ctx:`` after it): an equal
        real object. ``set_grad_enabled`` keeps the mode it found when made, which it
        restores on exit: rebuilt holding that mode, without setting any."""
        if self.entered:
            return super().reconstruct(cg)
        if self.cls is not torch.set_grad_enabled:
            return self.constructor(cg)
        return f"{cg.const(_made_set_grad_enabled)}({self.prev!r}, {self.target!r})"

    def call(self, tx, args: list[Var], kwargs: dict[str, Var]) -> Var:
        """``torch.no_grad()(fn)``: a decorator applied in the trace."""
        fn = args[0] if len(args) == 1 and not kwargs else None
        code = getattr(getattr(fn, "fn", None), "__code__", None) or getattr(fn, "code", None)
        if code is None or code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE):
            return super().call(tx, args, kwargs)
        if self.cls is torch.set_grad_enabled:
            # set_grad_enabled(mode) took effect when made; as a decorator it puts the
            # mode back (torch's __call__) and sets it around each call of the function
            if self.prev is None:
                return super().call(tx, args, kwargs)
            tx.out.set_grad(self.prev)
            return GradModeDecoratedVar(self.cls, fn, self.target)
        return GradModeDecoratedVar(self.cls, fn)


def _made_set_grad_enabled(prev: bool, mode: bool) -> torch.set_grad_enabled:
    """A ``torch.set_grad_enabled(mode)`` made when the mode was ``prev`` (its state: what
    its ``__init__`` records), without changing the mode now."""
    made = torch.set_grad_enabled.__new__(torch.set_grad_enabled)
    made.prev, made.mode = prev, mode
    return made


class GradModeDecoratedVar(Var):
    """A function decorated in the trace with ``torch.no_grad()`` / ``enable_grad()``:
    each call runs it in that grad mode."""

    def __init__(self, cls: type, fn: Var, mode: bool | None = None) -> None:
        self.cls, self.fn, self.mode = cls, fn, mode

    def __repr__(self) -> str:
        return f"{self.cls.__name__}()({self.fn!r})"

    def python_type(self) -> type:
        return types.FunctionType

    def call(self, tx, args: list[Var], kwargs: dict[str, Var]) -> Var:
        if self.mode is None:
            mode = GradModeVar(tx, self.cls, [])
        else:  # set_grad_enabled(m): the mode is set as the object is made
            mode = GradModeVar(tx, self.cls, [ConstVar(self.mode)])
        mode.enter(tx)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:
            mode.exit(tx)

    def children(self) -> list[Var]:
        return [self.fn]

    def reconstruct(self, cg) -> str:
        if self.mode is None:
            return f"{cg.const(self.cls)}()({cg.rebuild(self.fn)})"
        # made and applied at once: the mode set by the making is put back by the call
        return f"{cg.const(self.cls)}({self.mode!r})({cg.rebuild(self.fn)})"


class AutocastVar(ContextVar):
    """``torch.autocast(...)``: settings read from a real (never entered) instance."""

    def __init__(self, obj: torch.amp.autocast, source=None) -> None:
        self.obj = obj
        self.source = source
        self.device: str = obj.device
        self.dtype: torch.dtype = obj.fast_dtype
        self.enabled: bool = bool(obj._enabled)
        self.cache_enabled: bool = bool(obj._cache_enabled)
        self.node = None  # the _enter_autocast node while entered in this trace
        self.prev = None

    @staticmethod
    def construct(tx, cls: type, args: list[Var], kwargs: dict[str, Var]) -> AutocastVar:
        try:
            consts = [a.as_const() for a in args]
            kw = {k: v.as_const() for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, "torch.autocast with non-constant arguments"
            ) from None
        try:
            with warnings.catch_warnings():  # eager code warns (deprecations) when it runs
                warnings.simplefilter("ignore")
                return AutocastVar(cls(*consts, **kw))
        except Exception as e:
            raise Unsupported(breaks.EXCEPTION, f"torch.autocast raised {e}") from e

    def __repr__(self) -> str:
        return f"Autocast({self.device}, {self.dtype}, enabled={self.enabled})"

    def python_type(self) -> type:
        return type(self.obj)

    def enter(self, tx) -> Var:
        if self.node is not None:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "re-entering an autocast context")
        self.prev = tx.out.autocast
        self.node = tx.out.enter_autocast(self.device, self.dtype, self.enabled, self.cache_enabled)
        tx.contexts.append(self)
        return self

    def exit(self, tx) -> None:
        if self.node is None:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, "exit of an autocast context that was not entered"
            )
        tx.out.exit_autocast(self.node, self.prev)
        self.node = None
        if tx.contexts and tx.contexts[-1] is self:
            tx.contexts.pop()

    def constructor(self, cg) -> str:
        return (
            f"torch.amp.autocast({self.device!r}, dtype={cg.const(self.dtype)}, "
            f"enabled={self.enabled!r}, cache_enabled={self.cache_enabled!r})"
        )

    def reconstruct(self, cg) -> str:
        """Live across a break: the object read from its source, the real autocast the
        generated code entered for the continuation, or (not entered) an equal new one."""
        if self.source is not None:
            return self.source.expr()
        name = cg.context_name(self)
        if name is not None:
            return name
        if self.node is None:
            return self.constructor(cg)
        return super().reconstruct(cg)


class EnteredAutocastVar(ContextVar):
    """A real autocast entered before the frame began (by a continuation's caller); only
    its exit is modelled. The graph cannot name the real object, so at the exit it enters
    a region with the state the real ``__exit__`` restores (closed again at the graph's
    end), and the generated code calls the real ``__exit__`` after the graph."""

    def __init__(self, obj: torch.amp.autocast, source) -> None:
        self.obj = obj
        self.source = source
        self.exited = False

    def __repr__(self) -> str:
        return f"EnteredAutocast({self.obj.device})"

    def python_type(self) -> type:
        return type(self.obj)

    def exit(self, tx) -> None:
        if self.exited:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "exit of an autocast exited before")
        from kiln_capture.sources import AttrSource

        obj = self.obj
        for attr in ("device", "prev", "prev_fastdtype", "prev_cache_enabled"):
            tx.out.wrap(getattr(obj, attr), AttrSource(self.source, attr))  # guards them
        tx.out.enter_autocast(obj.device, obj.prev_fastdtype, obj.prev, obj.prev_cache_enabled)
        tx.out.side_effects.call_after(f"{self.source.expr()}.__exit__(None, None, None)")
        self.exited = True


class EnteredGradModeVar(ContextVar):
    """A real grad-mode context entered before the frame began (a continuation resuming
    inside ``with torch.no_grad():``); its exit restores the mode it saved."""

    def __init__(self, obj, source) -> None:
        self.obj = obj
        self.source = source

    def __repr__(self) -> str:
        return f"EnteredGradMode({type(self.obj).__name__})"

    def python_type(self) -> type:
        return type(self.obj)

    def exit(self, tx) -> None:
        from kiln_capture.sources import AttrSource

        prev = tx.out.wrap(self.obj.prev, AttrSource(self.source, "prev")).as_const()
        tx.out.set_grad(bool(prev))


ENTERED_OUTSIDE = (EnteredAutocastVar, EnteredGradModeVar)


class ContextMethodVar(Var):
    def __init__(self, ctx: ContextVar, which: str) -> None:
        self.ctx = ctx
        self.which = which

    def call(self, tx, args, kwargs) -> Var:
        if self.which == "enter":
            return self.ctx.enter(tx)
        self.ctx.exit(tx)
        return ConstVar(None)

    def reconstruct(self, cg) -> str:
        """At a graph break inside ``with <grad mode or autocast>:`` the generated code enters a real
        context manager of the same kind (once) and hands its ``__exit__`` on the stack to
        the continuation, whose with-statement then exits it as usual."""
        if self.which != "exit":
            return super().reconstruct(cg)
        if isinstance(self.ctx, ENTERED_OUTSIDE):
            return f"{self.ctx.source.expr()}.__exit__"
        name = cg.context_name(self.ctx)
        if name is None:
            ctor = self.ctx.constructor(cg)
            name = cg.context_name(self.ctx, create=True)
            cg.preamble.append(f"{name} = {ctor}")
            cg.preamble.append(f"{name}.__enter__()")
        return f"{name}.__exit__"
