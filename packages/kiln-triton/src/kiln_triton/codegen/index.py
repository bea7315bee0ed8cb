"""print_index: a sympy index expression of the IR as a Triton (Python) expression.

Loop variables print as their names (tensors in the kernel); ``FloorDiv`` and ``ModIndex``
of non-negative integers print as ``//`` and ``%`` (C and Triton agree there); clamps
(``Min``/``Max``, from cat and padding) print as ``tl.minimum``/``tl.maximum``. Size
symbols (``s0``: kiln_shapes') print as their names, the kernel's int arguments.

``host_expr`` prints a size expression as Python for the launcher (``max``/``min``).
"""

from __future__ import annotations

from typing import Any

from kiln_inductor.codegen.index_printer import IndexPrinter


class TritonIndexPrinter(IndexPrinter):
    """Indices in a kernel: ``//``, ``%``, ``tl.minimum``/``tl.maximum``."""

    TARGET = "for Triton"
    MAX, MIN = "tl.maximum", "tl.minimum"


class HostIndexPrinter(TritonIndexPrinter):
    """Sizes in the launcher: Python's ``max``/``min``."""

    MAX, MIN = "max", "min"


_DEVICE, _HOST = TritonIndexPrinter(), HostIndexPrinter()


def host_expr(expr: Any) -> str:
    """``expr`` (a size over size symbols) as Python source evaluated on the host."""
    return _HOST.print(expr)


def print_index(expr: Any, host: bool = False) -> str:
    return (_HOST if host else _DEVICE).print(expr)
