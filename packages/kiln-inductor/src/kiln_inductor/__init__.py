"""Compiler core: lowering of ATen graphs to a loop-level IR, fusing scheduler, memory planning, wrapper code generation, kernel cache."""

from importlib.metadata import version as _version

__version__: str = _version("kiln-inductor")

__all__ = ["__version__"]
