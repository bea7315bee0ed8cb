"""Frame capture and guard engine: PEP 523 frame hook, symbolic bytecode evaluation, guards, graph breaks."""

import sys
from importlib.metadata import version as _version

from kiln_capture import _C

__version__: str = _version("kiln-capture")

if tuple(_C.built_for_python()) != sys.version_info[:2]:
    raise ImportError(
        f"kiln_capture._C was built for Python {_C.built_for_python()} but runs on "
        f"{sys.version_info[:2]}; reinstall kiln-capture with this interpreter"
    )

from kiln_capture.api import ExplainOutput, OptimizedModule, disable, explain, optimize, reset
from kiln_capture.breaks import GraphBreak
from kiln_capture.dynamic import mark_dynamic, mark_static
from kiln_capture.errors import BackendError, DynamicShapeError, GraphBreakError
from kiln_capture.stats import break_reasons, eager_reasons, stats

__all__ = [
    "BackendError",
    "DynamicShapeError",
    "ExplainOutput",
    "GraphBreak",
    "GraphBreakError",
    "OptimizedModule",
    "__version__",
    "disable",
    "explain",
    "mark_dynamic",
    "mark_static",
    "optimize",
    "reset",
    "stats",
    "break_reasons",
    "eager_reasons",
]
