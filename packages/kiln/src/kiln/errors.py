"""Exceptions raised by the kiln facade."""

from __future__ import annotations

import kiln_capture

# fullgraph=True and the program needs a graph break (raised by the capture engine).
GraphBreakError = kiln_capture.GraphBreakError


class KilnError(RuntimeError):
    """Base of kiln's own errors."""


class InvalidOption(KilnError):
    """`options=` holds an unknown key or a value of the wrong type."""


class UnknownBackend(KilnError):
    """`backend=` names no registered backend."""


class BackendCompilerFailed(KilnError, kiln_capture.BackendError):
    """A backend raised while compiling a graph and fallback was not allowed.

    Raised with ``fullgraph=True`` or ``options={"raise_on_error": True}``; otherwise the
    graph runs eagerly and a warning says the same thing.
    """

    def __init__(self, backend_name: str, stage: str | None, op: str | None, cause: BaseException):
        self.backend_name = backend_name
        self.stage = stage
        self.op = op
        where = " ".join(
            part
            for part in (f"in stage {stage}" if stage else "", f"at {op}" if op else "")
            if part
        )
        self.cause = cause
        RuntimeError.__init__(
            self,
            f"backend {backend_name!r} failed {where or 'to compile a graph'}: "
            f"{type(cause).__name__}: {cause}\n"
            "  fix: report the op; meanwhile drop fullgraph=True / raise_on_error to run "
            "this graph eagerly",
        )
