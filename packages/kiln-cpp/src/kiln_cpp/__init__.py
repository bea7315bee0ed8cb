"""C++/OpenMP kernels for CPU tensors, generated from kiln-inductor's fused IR."""

from importlib.metadata import version as _version

__version__: str = _version("kiln-cpp")

__all__ = ["__version__"]
