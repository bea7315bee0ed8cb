"""Context managers of grad mode: ``torch.no_grad()``, ``enable_grad()``, ``set_grad_enabled``.

Entering one flips the trace's grad mode (metadata is computed under it) and records
``torch._C._set_grad_enabled`` in the graph, so the graph carries the same mode.
"""

from __future__ import annotations

import torch

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.variables.base import Var
from kiln_capture.variables.constants import ConstVar

GRAD_MODE_CLASSES = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)


class GradModeVar(Var):
    def __init__(self, tx, cls: type, args: list[Var]) -> None:
        self.cls = cls
        if cls is torch.no_grad:
            self.target = False
        elif cls is torch.enable_grad:
            self.target = True
        else:
            self.target = bool(args[0].as_const())
        self.prev: bool | None = None
        if cls is torch.set_grad_enabled:  # takes effect at construction, like torch's
            self.prev = tx.out.set_grad(self.target)

    def __repr__(self) -> str:
        return f"GradMode({self.cls.__name__}, {self.target})"

    def python_type(self) -> type:
        return self.cls

    def enter(self, tx) -> Var:
        if self.cls is not torch.set_grad_enabled:
            self.prev = tx.out.set_grad(self.target)
        tx.contexts.append(self)
        return ConstVar(None)

    def exit(self, tx) -> None:
        if self.prev is None:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, "exit of a grad-mode context that was not entered"
            )
        tx.out.set_grad(self.prev)
        if tx.contexts and tx.contexts[-1] is self:
            tx.contexts.pop()

    def getattr(self, tx, name):
        if name == "__enter__":
            return ContextMethodVar(self, "enter")
        if name == "__exit__":
            return ContextMethodVar(self, "exit")
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self.cls.__name__}.{name}")

    def reconstruct(self, cg) -> str:
        raise Unsupported(
            breaks.UNSUPPORTED_VALUE, "a grad-mode context manager live across a graph break"
        )


class ContextMethodVar(Var):
    def __init__(self, ctx: GradModeVar, which: str) -> None:
        self.ctx = ctx
        self.which = which

    def call(self, tx, args, kwargs) -> Var:
        if self.which == "enter":
            return self.ctx.enter(tx)
        self.ctx.exit(tx)
        return ConstVar(None)

    def reconstruct(self, cg) -> str:
        """At a graph break inside ``with <grad mode>:`` the generated code enters a real
        context manager of the same kind (once) and hands its ``__exit__`` on the stack to
        the continuation, whose with-statement then exits it as usual."""
        if self.which != "exit":
            return super().reconstruct(cg)
        name = cg.context_name(self.ctx)
        if name is None:
            cls = cg.const(self.ctx.cls)
            arg = repr(self.ctx.target) if self.ctx.cls is torch.set_grad_enabled else ""
            name = cg.context_name(self.ctx, create=True)
            cg.preamble.append(f"{name} = {cls}({arg})")
            cg.preamble.append(f"{name}.__enter__()")
        return f"{name}.__exit__"
