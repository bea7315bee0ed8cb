"""kiln-shapes: the symbolic-shape engine shared by kiln-capture and kiln-aot.

``ShapeEnv`` creates symbols for input sizes (with ranges and hints), ``SymNode`` backs
``torch.SymInt``/``SymFloat``/``SymBool`` so meta tensors carry symbolic sizes, and every
question that needs a concrete answer is decided over the ranges or recorded as a guard.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .engine import (
    AssumptionFailed,
    DataDependentError,
    Guard,
    ShapeEnv,
    ShapeGuardError,
    SymbolInfo,
    SymNode,
    env_of,
    expr_of,
    hint_of,
    is_symbolic,
    python_expr,
)
from .functions import FloorDiv, ModIndex

try:
    __version__ = version("kiln-shapes")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "AssumptionFailed",
    "DataDependentError",
    "FloorDiv",
    "Guard",
    "ModIndex",
    "ShapeEnv",
    "ShapeGuardError",
    "SymNode",
    "SymbolInfo",
    "__version__",
    "env_of",
    "expr_of",
    "hint_of",
    "is_symbolic",
    "python_expr",
]
