"""kiln: `kiln.compile`, a drop-in for `torch.compile` built on the kiln packages.

    import kiln
    model = kiln.compile(model)                      # or @kiln.compile on a function
    model = kiln.compile(model, mode="reduce-overhead", fullgraph=True)

`kiln.explain(fn)(*args)` lists graphs, graph breaks and guards; `kiln.reset()` forgets
what was compiled; `kiln.disable` keeps a function out of capture; `kiln.mark_dynamic(x,
dim)` compiles a dimension for every size (`kiln.compile(..., dynamic=True)`: all of them).
"""

from importlib.metadata import version as _version

from kiln.api import compile, disable, explain, mark_dynamic, mark_static, reset, stats
from kiln.backends import import_cpu_compiler as _import_cpu_compiler
from kiln.backends import list_backends
from kiln.errors import (
    BackendCompilerFailed,
    GraphBreakError,
    InvalidOption,
    KilnError,
    UnknownBackend,
)

__version__: str = _version("kiln")
_import_cpu_compiler()

__all__ = [
    "BackendCompilerFailed",
    "GraphBreakError",
    "InvalidOption",
    "KilnError",
    "UnknownBackend",
    "__version__",
    "compile",
    "disable",
    "explain",
    "list_backends",
    "mark_dynamic",
    "mark_static",
    "reset",
    "stats",
]
