"""Exceptions of kiln-aot. Each names the op, the user's source line when known, why, and what to do."""

from __future__ import annotations


class KilnAotError(Exception):
    """Base class of kiln-aot's errors."""


def _format(headline: str, where: str | None, why: str, fix: str) -> str:
    lines = [headline]
    if where:
        lines.append(f"  at {where}")
    lines.append(f"  why: {why}")
    lines.append(f"  fix: {fix}")
    return "\n".join(lines)


class Unsupported(KilnAotError):
    """An operator kiln-aot cannot trace into an ATen graph (data-dependent shapes, ``.item()``,
    metadata mutation, an op with no decomposition and outside the core set).

    ``op`` is the operator (an OpOverload, or a string for non-ATen causes); ``where`` the
    user's source line when known. The capture layer breaks the graph here and runs the op
    eagerly.
    """

    def __init__(self, op: object, why: str, *, where: str | None = None, fix: str | None = None):
        self.op = op
        self.why = why
        self.where = where
        self.fix = (
            fix
            or "the capture layer runs this op eagerly (graph break); move it out of the compiled region to silence this"
        )
        super().__init__(_format(f"kiln_aot.Unsupported: {op}", where, why, self.fix))


class DoubleBackwardError(KilnAotError, RuntimeError):
    """Raised when a compiled graph's backward is itself differentiated."""

    MESSAGE = _format(
        "kiln_aot.DoubleBackwardError: double backward through a kiln-compiled graph",
        None,
        "the compiled backward graph is not itself traced for autograd (create_graph=True)",
        "run the region eagerly for higher-order gradients (torch.func / plain autograd), "
        "or do not pass create_graph=True",
    )

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)


class PartitionError(KilnAotError):
    """The joint graph could not be split into forward and backward graphs."""
