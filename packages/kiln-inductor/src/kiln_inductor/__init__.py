"""Compiler core: lowering of ATen graphs to a loop-level IR, fusing scheduler, memory
planning, wrapper code generation, kernel cache.

Public API:
    compile_fx(gm, example_inputs)          torch-level or ATen-level graph → callable
    compile_aten_graph(gm, example_inputs)  ATen-level graph → CompiledGraph
    register_backend / get_backend          the kernel backend registry (see backend.py)
    layout_copies / reset_layout_copies     per-call copies of mis-strided tensors, counted
    reload_fx(recipe, example_inputs, make_graph)
                                            compile_fx's callable again from the reload recipe
                                            it carried (runtime/reload.py), or None
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
from .runtime.layout_copies import LayoutCopy, layout_copies, reset_layout_copies
from .runtime.reload import reload as reload_fx

__version__: str = _version("kiln-inductor")

__all__ = [
    "AotUnavailableError",
    "CompiledGraph",
    "KernelBackend",
    "KernelCache",
    "KernelSource",
    "KilnInductorError",
    "LayoutCopy",
    "LoweringError",
    "NoBackendError",
    "__version__",
    "compile_aten_graph",
    "compile_fx",
    "get_backend",
    "layout_copies",
    "register_backend",
    "registered_backends",
    "reload_fx",
    "reset_layout_copies",
    "unregister_backend",
]
