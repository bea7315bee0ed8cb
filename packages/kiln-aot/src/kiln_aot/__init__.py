"""Ahead-of-time autograd: ATen tracing, decompositions, functionalization, joint forward/backward graphs and a min-cut partitioner."""

from importlib.metadata import version as _version

__version__: str = _version("kiln-aot")

__all__ = ["__version__"]
