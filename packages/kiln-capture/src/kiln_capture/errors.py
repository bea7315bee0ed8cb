"""Exceptions of kiln-capture."""

from __future__ import annotations

from kiln_capture.breaks import BreakKind, GraphBreak


class Unsupported(Exception):
    """Raised inside the symbolic evaluator when a step cannot be captured (a graph break)."""

    def __init__(self, kind: BreakKind, detail: str) -> None:
        super().__init__(f"{kind.id}: {detail}")
        self.kind = kind
        self.detail = detail
        self.where: tuple[str, int, str] | None = None  # innermost user source location
        self.chain: list[str] = []  # inlined frames, innermost first


class GraphBreakError(RuntimeError):
    """fullgraph=True and the program needs a graph break."""

    def __init__(self, brk: GraphBreak) -> None:
        super().__init__(
            f"kiln_capture: graph break with fullgraph=True\n{brk}\n"
            "  what to do: remove fullgraph=True to let kiln split the graph here"
        )
        self.graph_break = brk


class CaptureInternalError(RuntimeError):
    """A bug in kiln-capture itself; the frame is run eagerly and this is logged."""
