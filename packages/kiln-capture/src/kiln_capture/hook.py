"""The Python side of the frame hook: the skip list, the cache lookup, and recompiles.

Skip list (documented, by file): frames whose code lives in the standard library, in
torch (except ``torch/nn/modules/*`` other than ``module.py``, so that a bare
``nn.Linear`` can be optimized), in kiln_capture itself or kiln's other packages, in
pytest/pluggy, or in kiln's own generated code (``<kiln ...>`` file names) and frozen
modules are never captured; they run normally, and the frames they call are still
offered to the hook. Other generated code (``exec``, ``eval``, fx ``GraphModule.forward``)
is captured like any file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sysconfig
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from kiln_shapes.compiling import compiling

from kiln_capture import _C, frame_store
from kiln_capture import stats as counters
from kiln_capture.bytecode.rewrite import make_trampoline
from kiln_capture.capture import _RESUME_ORIGIN as RESUME_ORIGIN
from kiln_capture.capture import EAGER_RESUME_CODES, CacheEntry, SkipFrame, compile_frame
from kiln_capture.config import config
from kiln_capture.dynamic import FrameShapes
from kiln_capture.errors import BackendError, DynamicShapeError, GraphBreakError
from kiln_capture.gc_pause import paused
from kiln_capture.log import log

RUN_DEFAULT = object()
_trampolines: dict[types.CodeType, types.CodeType] = {}
_skip: set[types.CodeType] = set()
# (code, backend id, dynamic) -> entries, newest first
_cache: dict[tuple[types.CodeType, int, bool | None], list[CacheEntry]] = {}
_eager_codes: dict[tuple[types.CodeType, int, bool | None], str] = {}
# what earlier compiles of a frame saw, for automatic dynamic shapes (dynamic.py)
_frame_shapes: dict[tuple[types.CodeType, int, bool | None], FrameShapes] = {}
# frames met in this process: the disk is read for kept captures once per frame, also
# after reset() (a process that captured a frame knows it better than the disk)
_met: set[tuple[types.CodeType, int, bool | None]] = set()


def _dir(p: str) -> str:
    return os.path.realpath(p) + os.sep


_TORCH_DIR = _dir(os.path.dirname(torch.__file__))
_TORCH_NN_MODULES = _TORCH_DIR + os.path.join("nn", "modules") + os.sep
_KILN_DIR = _dir(os.path.dirname(__file__))


def _sibling_dirs() -> tuple[str, ...]:
    """The directories of kiln's other packages, located without importing them: their
    runtime (a compiled graph's call, a training graph's backward run by autograd inside
    a captured frame's ``loss.backward()``) is never captured either."""
    found = []
    for name in ("kiln_aot", "kiln_inductor", "kiln_cpp", "kiln_triton", "kiln_shapes", "kiln"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for loc in (spec.submodule_search_locations or []) if spec else []:
            found.append(_dir(loc))
    return tuple(found)


_KILN_SIBLING_DIRS = _sibling_dirs()
# In a virtual environment the "stdlib" path can contain site-packages: third-party
# code is recognised first, by its site directory.
_SITE_DIRS = tuple({_dir(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")})
_STDLIB_DIRS = tuple({_dir(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")})
_SKIP_PACKAGES = ("_pytest", "pytest", "pluggy", "pybind11", "typing_extensions")
_SKIP_GENERATED = ("<kiln", "<frozen", "<__array_function__")


# code objects the user compiled directly (``optimize(backend)(fn)`` of a function in a
# skipped file, such as ``kiln.compile(optimizer.step)``): captured all the same, as
# anything they call is traced inline
_forced: set[types.CodeType] = set()


def force_capture(code: types.CodeType) -> None:
    """Capture frames of ``code`` although its file is skipped (kiln's own code aside:
    its wrappers, such as ``disable``'s, must stay as they are)."""
    path = os.path.realpath(code.co_filename)
    if not skipped_file(code.co_filename) or path.startswith((_KILN_DIR, *_KILN_SIBLING_DIRS)):
        return
    _forced.add(code)
    _skip.discard(code)


def skipped_file(filename: str) -> bool:
    """True when frames of ``filename`` are never captured (see the module docstring)."""
    if filename.startswith("<"):
        # generated code is captured like any other (exec, eval, fx GraphModule.forward,
        # dataclass and namedtuple methods), except kiln's own (wrappers, guards,
        # trampolines) and frozen standard-library modules
        return filename.startswith(_SKIP_GENERATED)
    path = os.path.realpath(filename)
    if path.startswith(_TORCH_NN_MODULES) and not path.endswith("module.py"):
        return False
    if path.startswith((_TORCH_DIR, _KILN_DIR, *_KILN_SIBLING_DIRS)):
        return True
    parts = path.split(os.sep)
    if path.startswith(_SITE_DIRS) or "site-packages" in parts or "dist-packages" in parts:
        return any(p.removesuffix(".py") in _SKIP_PACKAGES for p in parts)
    return path.startswith(_STDLIB_DIRS)


def _torch_module_constructor(code: types.CodeType) -> bool:
    """A torch.nn module's ``__init__``: it builds parameters and settings once per object,
    with no compute to compile, and capturing it would guard each new ``self`` (a module
    made in user code called from compiled code recompiled on every call)."""
    return code.co_name == "__init__" and os.path.realpath(code.co_filename).startswith(
        _TORCH_NN_MODULES
    )


@dataclass
class Recorder:
    """What explain() collects."""

    graphs: list = field(default_factory=list)
    breaks: list = field(default_factory=list)
    guards: list = field(default_factory=list)
    recompiles: list = field(default_factory=list)
    symbols: list = field(default_factory=list)  # symbols of sizes, with ranges and sources
    shape_guards: list = field(default_factory=list)  # relations between sizes, with lines
    eager_frames: list = field(default_factory=list)  # frames left to run eagerly, and why
    region_boundaries: list = field(default_factory=list)  # calls of separately compiled regions


@dataclass
class Context:
    backend: object
    fullgraph: bool
    recorder: Recorder | None = None
    dynamic: bool | None = None  # dynamic.py, "symbolic inputs"
    graphs: list = field(default_factory=list)
    backend_seconds: float = 0.0  # time spent in the backend (compilers below capture)


_tls = threading.local()


def context_stack() -> list[Context]:
    s = getattr(_tls, "stack", None)
    if s is None:
        s = _tls.stack = []
    return s


def _callback(code: types.CodeType, func, args: tuple):
    stack = context_stack()
    if not stack or func is None or compiling():  # a compiler's own frames (kiln_shapes.compiling)
        return RUN_DEFAULT
    ctx = stack[-1]
    key = (code, id(ctx.backend), ctx.dynamic)
    entries = _cache.get(key)
    if entries:
        for e in entries:
            try:
                ok = e.guard(func, *args)
            except Exception:
                ok = False
            if ok:
                return e.run(func, *args)
    if key in _eager_codes:
        return RUN_DEFAULT
    if (
        code in EAGER_RESUME_CODES
        or (skipped_file(code.co_filename) and code not in _forced)
        or (code.co_name.startswith("<") and code.co_name != "<lambda>")  # <module>, <genexpr>
        or _torch_module_constructor(code)
    ):
        _skip.add(code)
        return RUN_DEFAULT
    # the first meeting in this process: maybe kept (a continuation of a graph break is
    # this process's own code: never kept)
    if not entries and key not in _met and code not in RESUME_ORIGIN:
        _met.add(key)
        loaded = _load_kept(ctx, key, code, func, args)
        if loaded is not None:
            return loaded.run(func, *args)
    why = None
    if entries:
        e = entries[0]
        why = e.guard_set.first_failure(func, e.params, args, e.globals)
    if entries and len(entries) >= config.cache_size_limit:
        _cache_limit(ctx, key, code, why)
        return RUN_DEFAULT
    if entries:
        reason = f"recompiling {code.co_qualname} ({code.co_filename}:{code.co_firstlineno}): guard failed: {why}"
        log("recompiles", reason)
        _record_recompile(ctx, reason)
    frame_shapes = _frame_shapes.setdefault(key, FrameShapes()) if ctx.dynamic is None else None
    start, backend_before = time.perf_counter(), ctx.backend_seconds
    try:
        with saved_tensor_hooks_suspended(), paused(config.gc_pause):
            result = compile_frame(code, func, args, ctx, frame_shapes)
    except (GraphBreakError, BackendError, DynamicShapeError):
        raise
    except Exception as e:  # a bug in kiln: never a wrong answer, run the frame as usual
        if config.raise_internal:
            raise
        _run_eagerly(
            ctx,
            key,
            code,
            "internal error",
            f"internal error capturing {code.co_qualname}: {type(e).__name__}: {e}; it runs "
            "eagerly (a kiln bug: please report it; KILN_CAPTURE_RAISE_INTERNAL=1 raises it)",
        )
        return RUN_DEFAULT
    backend_s = ctx.backend_seconds - backend_before
    log(
        "timings",
        f"capture of {code.co_qualname}: frame_s={time.perf_counter() - start:.4f} "
        f"backend_s={backend_s:.4f} (capture_s = frame_s - backend_s)",
    )
    if isinstance(result, SkipFrame):
        _run_eagerly(
            ctx,
            key,
            code,
            "skipped",
            f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno}) runs eagerly: "
            f"{result.reason}",
        )
        return RUN_DEFAULT
    if ctx.recorder is not None:
        ctx.recorder.guards.extend(g.what for g in result.guard_set.guards)
        if result.guard_set.shapes is not None:
            symbols, shape_guards = result.guard_set.shapes.describe()
            ctx.recorder.symbols.extend(symbols)
            ctx.recorder.shape_guards.extend(shape_guards)
    _cache.setdefault(key, []).insert(0, result)
    if code not in _trampolines:
        _trampolines[code] = make_trampoline(code)
    if code not in RESUME_ORIGIN:
        _keep(ctx, code, func, args, result, frame_shapes)
    return result.run(func, *args)


def _load_kept(ctx: Context, key: tuple, code: types.CodeType, func, args: tuple):
    """The entry a process captured for this frame before (frame_store.py), installed."""
    start, backend_before = time.perf_counter(), ctx.backend_seconds
    try:
        with saved_tensor_hooks_suspended(), paused(config.gc_pause):
            found = frame_store.load(code, func, args, ctx)
    except (GraphBreakError, BackendError, DynamicShapeError):
        raise
    except Exception as e:  # a bug in kiln: capture the frame as if nothing was kept
        if config.raise_internal:
            raise
        frame_store.warn_once(
            "internal", f"loading a kept capture failed ({type(e).__name__}: {e}); capturing"
        )
        return None
    if found is None:
        return None
    entry, shapes = found
    if ctx.dynamic is None:
        frame_store.restore_shapes(_frame_shapes.setdefault(key, FrameShapes()), shapes)
    log(
        "timings",
        f"kept capture of {code.co_qualname}: frame_s={time.perf_counter() - start:.4f} "
        f"backend_s={ctx.backend_seconds - backend_before:.4f}",
    )
    _cache.setdefault(key, []).insert(0, entry)
    if code not in _trampolines:
        _trampolines[code] = make_trampoline(code)
    return entry


def _keep(ctx: Context, code: types.CodeType, func, args: tuple, entry, frame_shapes) -> None:
    """Keep a new capture on disk (frame_store.py); never fails the call."""
    try:
        with paused(config.gc_pause):
            frame_store.save(code, func, args, ctx, entry, frame_shapes)
    except Exception as e:
        if config.raise_internal:
            raise
        frame_store.warn_once(
            "internal-save", f"keeping a capture failed ({type(e).__name__}: {e})"
        )


@contextlib.contextmanager
def saved_tensor_hooks_suspended() -> Iterator[None]:
    """No saved-tensor hooks while a frame is captured and compiled. A frame first called
    inside ``torch.utils.checkpoint`` (a compiled block under a checkpoint written around
    it) would otherwise be captured under checkpoint's hooks: the meta tensors of capture
    and the compiler's tracing would count as tensors the region saved, and the
    recomputation in the backward would disagree. The hooks are back, in their order,
    before the compiled code runs."""
    autograd = torch._C._autograd
    stack = []
    while (top := autograd._top_saved_tensors_default_hooks(True)) is not None:
        stack.append(top)
        autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(stack):
            autograd._push_saved_tensors_default_hooks(pack, unpack)


def _run_eagerly(ctx: Context, key: tuple, code: types.CodeType, kind: str, message: str) -> None:
    """From now on ``code`` runs eagerly: warned once (with its source line), counted in
    ``stats()["eager_frames"]`` by ``kind``, listed by explain(), and logged under
    KILN_LOG=breaks."""
    import warnings

    log("breaks", message)
    _eager_codes[key] = message
    counters.eager_frame(kind)
    if ctx.recorder is not None:
        ctx.recorder.eager_frames.append(message)
    warnings.warn_explicit(
        f"kiln: {message}",
        RuntimeWarning,
        code.co_filename,
        code.co_firstlineno,
        module="kiln_capture",
        registry={},
    )


def _cache_limit(ctx: Context, key: tuple, code: types.CodeType, why: str | None) -> None:
    """The frame has ``config.cache_size_limit`` entries and misses again: from now on it
    runs eagerly, with one warning that names the guard that failed and what to do."""
    counters.bump("cache_limit_hits")
    reason = (
        f"{code.co_qualname} hit the cache size limit ({config.cache_size_limit} compiled "
        f"entries); it now runs eagerly. The last guard that failed: {why}"
    )
    log("recompiles", reason)
    _record_recompile(ctx, reason)
    _run_eagerly(
        ctx,
        key,
        code,
        "cache size limit",
        f"{reason}\n  fix: if input sizes vary, compile with dynamic=True "
        "(kiln.compile(..., dynamic=True)) or mark the varying dimension with "
        "kiln.mark_dynamic(tensor, dim); otherwise raise KILN_CACHE_SIZE_LIMIT",
    )


def _record_recompile(ctx: Context, reason: str) -> None:
    counters.bump("recompiles")
    if ctx.recorder is not None:
        ctx.recorder.recompiles.append(reason)


def reset() -> None:
    """Forget every cache entry, eager decision and skip."""
    _cache.clear()
    _eager_codes.clear()
    _frame_shapes.clear()
    _skip.clear()
    counters.clear()


def cache_entries(code: types.CodeType) -> list[CacheEntry]:
    return [e for (c, *_), es in _cache.items() if c is code for e in es]


_C.set_callback(_callback, RUN_DEFAULT, _trampolines, _skip)
