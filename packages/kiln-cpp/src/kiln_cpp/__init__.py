"""C++/OpenMP kernels for CPU tensors, generated from kiln-inductor's fused IR.

Importing kiln_cpp registers its backend for device type "cpu" with kiln-inductor.

    kiln_cpp.compile_fx(gm, example_inputs)   torch-level or ATen-level FX graph → callable
    torch.compile(fn, backend=kiln_cpp.compile_fx)
"""

from importlib.metadata import version as _version

__version__: str = _version("kiln-cpp")

from kiln_inductor import register_backend as _register_backend

from .backend import CppBackend
from .compile import compile_fx

_register_backend("cpu", CppBackend())

__all__ = ["CppBackend", "__version__", "compile_fx"]
