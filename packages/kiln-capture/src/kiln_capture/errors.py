"""Exceptions of kiln-capture."""

from __future__ import annotations

from kiln_capture.breaks import EXCEPTION, BreakKind, GraphBreak


class Unsupported(Exception):
    """Raised inside the symbolic evaluator when a step cannot be captured (a graph break)."""

    def __init__(self, kind: BreakKind, detail: str) -> None:
        super().__init__(f"{kind.id}: {detail}")
        self.kind = kind
        self.detail = detail
        self.where: tuple[str, int, str] | None = None  # innermost user source location
        self.chain: list[str] = []  # inlined frames, innermost first


class Raised(Unsupported):
    """An exception the captured code raises, its type and arguments known at trace time
    (``exc``, an ExcVar; see variables/exceptions.py). The evaluator's frames hand it to
    their handlers; anywhere else it is a graph break like any ``Unsupported``."""

    def __init__(self, exc, detail: str) -> None:
        super().__init__(EXCEPTION, detail)
        self.exc = exc


class GraphBreakError(RuntimeError):
    """fullgraph=True and the program needs a graph break."""

    def __init__(self, brk: GraphBreak) -> None:
        super().__init__(
            f"kiln_capture: graph break with fullgraph=True\n{brk}\n"
            "  what to do: remove fullgraph=True to let kiln split the graph here"
        )
        self.graph_break = brk


class BackendError(RuntimeError):
    """The backend raised while compiling a captured graph.

    Not a capture bug: it propagates to the caller (as torch.compile's
    ``BackendCompilerFailed`` does), with the backend's exception as its cause. A backend
    that prefers eager execution on failure, like ``kiln.compile``'s, handles it itself.
    """

    def __init__(self, backend: object, cause: BaseException) -> None:
        name = getattr(backend, "__name__", type(backend).__name__)
        super().__init__(f"backend {name!r} failed: {type(cause).__name__}: {cause}")
        self.cause = cause


class DynamicShapeError(RuntimeError):
    """fullgraph=True and an input size falls outside the range ``mark_dynamic`` declared
    for it: the symbolic graph does not cover it, and fullgraph forbids a specialized one."""
