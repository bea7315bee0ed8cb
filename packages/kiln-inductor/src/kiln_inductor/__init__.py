"""Compiler core: lowering of ATen graphs to a loop-level IR, fusing scheduler, memory
planning, wrapper code generation, kernel cache.

Public API:
    compile_fx(gm, example_inputs)          torch-level or ATen-level graph → callable
    compile_aten_graph(gm, example_inputs)  ATen-level graph → CompiledGraph
    register_backend / get_backend          the kernel backend registry (see backend.py)
"""

from importlib.metadata import version as _version

from . import lowering  # noqa: F401  (registers the lowerings)
from .backend import (
    KernelBackend,
    KernelSource,
    get_backend,
    register_backend,
    registered_backends,
    unregister_backend,
)
from .compile import CompiledGraph, compile_aten_graph, compile_fx
from .errors import AotUnavailableError, KilnInductorError, LoweringError, NoBackendError
from .runtime.cache import KernelCache

__version__: str = _version("kiln-inductor")

__all__ = [
    "AotUnavailableError",
    "CompiledGraph",
    "KernelBackend",
    "KernelCache",
    "KernelSource",
    "KilnInductorError",
    "LoweringError",
    "NoBackendError",
    "__version__",
    "compile_aten_graph",
    "compile_fx",
    "get_backend",
    "register_backend",
    "registered_backends",
    "unregister_backend",
]
