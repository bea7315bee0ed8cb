"""Triton kernels for CUDA tensors, generated from kiln-inductor's fused IR; autotuning and CUDA graphs."""

from importlib.metadata import version as _version

__version__: str = _version("kiln-triton")

__all__ = ["__version__"]
