"""PyTorch's own dynamo test programs under kiln and torch.compile, against eager.

    python benchmarks/torch_suite.py --file /tmp/torch_tests/test_functions.py
    python benchmarks/torch_suite.py --file ... --only dict,partial     # names containing these
    python benchmarks/torch_suite.py --file ... --backend inductor      # each side's compiler

The file (a ``test/dynamo/test_*.py`` of a PyTorch checkout; kiln does not ship it) is
imported as a module. Modules it imports that are not installed (``expecttest``, which
``torch.testing._internal.common_utils`` needs) are stubbed as far as the import needs.
Two kinds of cases are collected:

- **programs**: functions made into test methods by a ``make_test`` decorator (the
  file's own, or ``torch._dynamo.testing.make_test``, patched before the import to record
  its function). The test method made by the decorator holds the function and its
  argument count in its closure; the harness takes them from there. Each program runs
  eagerly, under ``torch.compile`` and under ``kiln.compile`` (same backend, ``eager`` by
  default: this measures capture), on two sets of ``torch.randn(10, 10)`` arguments (never
  zeros), each compiled function called four times (args 1, 2, 1, 2) as
  ``torch._dynamo.testing.standard_test`` does. Outputs and the arguments after the call
  are compared with eager's (tensors: dtype, shape, values at 1e-5 relative and absolute;
  NaNs equal). torch.compile passes when it matches and built the number of graphs the
  test expects (``expected_frame_count``); kiln passes when it matches, ran no frame
  eagerly, had no backend fallback and broke no more often than torch.compile (a frame
  torch.compile ran eagerly counting as one of its breaks) unless it built no more graphs
  either (dynamo's break counter leaves out a branch on tensor data); a frame captured
  whole without any tensor op builds no graph, and passes.
- **methods**: the other test methods of the file's ``TestCase`` classes, run by
  ``unittest`` twice: as written (torch.compile), then with torch's entry points mapped
  onto kiln. A method passes when ``unittest`` reports success (an expected failure
  counts as success; for kiln an unexpected success too); kiln must also run no frame
  eagerly, and break no more often than torch.compile did (the same rule). Methods that
  call no compile entry point (tests of dynamo's own classes) are listed as
  ``no-compile`` and not counted, as are skipped ones. Files that build their test
  methods with a ``make_test`` of their own calling ``standard_test`` with a module
  (``test_modules.py``) run as methods.

What is mapped onto kiln for methods (``_KilnMapping``):

- ``torch.compile(fn, backend=, fullgraph=, dynamic=, mode=, options=)`` ->
  ``kiln.compile`` with the same arguments;
- ``torch._dynamo.optimize(backend, nopython=, dynamic=)`` -> ``kiln.compile(fn, backend=,
  fullgraph=nopython, dynamic=)``; ``optimize_assert(backend)`` -> ``fullgraph=True``
  (both also as ``torch._dynamo.testing``'s names, which ``standard_test`` calls);
- backends: ``"inductor"`` (the default) becomes ``--backend``; ``"eager"`` and
  ``"aot_eager"`` stay; a callable (``CompileCounter``, ``EagerAndRecordGraphs``) is
  handed kiln's graphs as it is (the backend protocol is torch's);
- ``torch._dynamo.reset`` -> also ``kiln.reset``; ``torch._dynamo.disable`` ->
  ``kiln.disable``; ``torch._dynamo.graph_break()`` -> a call of a ``kiln.disable``d
  function (a break the test asks for: not counted, as dynamo's counter does not count
  it either); kiln's counters are carried across the mapped ``reset()``;
- ``torch._dynamo.exc.Unsupported``/``UserError`` in ``assertRaises`` also accept kiln's
  ``GraphBreakError`` (``fullgraph`` failures); ``TorchRuntimeError`` and
  ``InternalTorchDynamoError`` also accept the exception eager code raises
  (``RuntimeError``, ``ValueError``, ``TypeError``, ``AttributeError``), since kiln does
  not wrap user errors;
- ``torch._dynamo.OptimizedModule`` in ``isinstance`` checks also accepts kiln's compiled
  module (an instance of a subclass of the module's own class);
- ``assertExpectedInline`` is not checked for kiln (it compares torch's printed graphs,
  with dynamo's ``L_x_`` naming).

The ``torch.compile`` side also has ``"inductor"`` replaced by ``--backend``. The table
lists every case; the totals say how many torch.compile passes, how many kiln passes, and
kiln's failures among torch.compile's passes, grouped by reason (kiln's break reasons
come from its ``breaks`` log). JSON goes to benchmarks/results/torch_suite_<name>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import io
import json
import logging
import re
import signal
import sys
import time
import traceback
import types
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from breaks import _BreakLog  # noqa: E402  (kiln's breaks log, as breaks.py reads it)
from provenance import commit  # noqa: E402

CASE_TIMEOUT_S = 120


# ---------------------------------------------------------------- loading the file


def _stub_missing_modules() -> None:
    """``expecttest`` (needed by torch's common_utils): a TestCase with
    ``assertExpectedInline``, which is all the import and the tests need of it."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        mod = types.ModuleType("expecttest")

        class TestCase(unittest.TestCase):
            def assertExpectedInline(self, actual, expect, skip=0):
                self.assertEqual(actual.rstrip(), expect.rstrip())

        mod.TestCase = TestCase
        sys.modules["expecttest"] = mod


class _MissingName:
    """A name the file imports from an installed module that no longer has it (torch's
    testing helpers move between releases): as a decorator it leaves the function as it
    is; any other use raises."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self, fn=None, *a, **k):
        if callable(fn) and not a and not k:
            return fn
        raise NotImplementedError(f"{self.where} is stubbed by torch_suite.py")


def _stub_missing_names(path: Path, seen: set[Path] | None = None) -> list[str]:
    """Names of ``from module import name`` at the file's top level that an installed
    module lacks: each becomes a ``_MissingName``. Test files of the same folder that the
    file imports (``test_modules.py`` imports ``test_functions``) are looked through too,
    once each. Returns them."""
    import ast

    seen = set() if seen is None else seen
    seen.add(path)
    stubbed = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # imports inside try/except too
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names] if node.module is None else [node.module]
        for name in names:
            sibling = path.parent / f"{name}.py"
            if sibling.exists() and sibling not in seen:
                stubbed += _stub_missing_names(sibling, seen)
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
            continue
        try:
            mod = importlib.import_module(node.module)
        except ImportError:
            continue
        for alias in node.names:
            if alias.name != "*" and not hasattr(mod, alias.name):
                with contextlib.suppress(ImportError):
                    importlib.import_module(f"{node.module}.{alias.name}")
                    continue
                setattr(mod, alias.name, _MissingName(f"{node.module}.{alias.name}"))
                stubbed.append(f"{node.module}.{alias.name}")
    return stubbed


STUBBED: list[str] = []


@dataclasses.dataclass
class Program:
    name: str
    fn: object
    nargs: int
    expected_frame_count: int
    skip: str | None = None


def _find_program(method) -> tuple[object, int, int] | None:
    """(fn, nargs, expected_frame_count) held by a make_test-made test method, looked for
    through ``__wrapped__`` and closure cells (decorators over it)."""
    seen = set()
    todo = [method]
    while todo:
        f = todo.pop()
        if id(f) in seen or not isinstance(f, types.FunctionType):
            continue
        seen.add(id(f))
        rec = getattr(f, "_torch_suite_program", None)
        if rec is not None:
            return rec
        code = f.__code__
        cells = dict(zip(code.co_freevars, f.__closure__ or ()))
        if "fn" in cells and "nargs" in cells:
            try:
                fn, nargs = cells["fn"].cell_contents, cells["nargs"].cell_contents
                efc = (
                    cells["expected_frame_count"].cell_contents
                    if "expected_frame_count" in cells
                    else 1
                )
            except ValueError:
                continue
            if callable(fn) and isinstance(nargs, int):
                return fn, nargs, efc
        if hasattr(f, "__wrapped__"):
            todo.append(f.__wrapped__)
        for c in f.__closure__ or ():
            with contextlib.suppress(ValueError):
                todo.append(c.cell_contents)
    return None


def load(path: Path, suffix: str = ""):
    """Import the file (as ``suite_<stem><suffix>``); returns (module, programs, methods).
    Each compiler gets an import of its own: the file's module state (default tensors
    that tests mutate, counters in globals) starts fresh for each."""
    import torch._dynamo.testing as dyn_testing

    _stub_missing_modules()
    STUBBED[:] = _stub_missing_names(path) or STUBBED
    original = getattr(dyn_testing, "make_test", None)
    if original is not None:
        # files that take make_test from torch._dynamo.testing: record each function
        def make_test(fn=None, expected_frame_count=1, **kw):
            if fn is None:
                return lambda f: make_test(f, expected_frame_count=expected_frame_count, **kw)
            test = original(fn, expected_frame_count=expected_frame_count, **kw)
            nargs = len(inspect.signature(fn).parameters)
            test._torch_suite_program = (fn, nargs, expected_frame_count)
            return test

        dyn_testing.make_test = make_test
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"suite_{path.stem}{suffix}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if original is not None:
            dyn_testing.make_test = original
    programs: list[Program] = []
    methods: list[tuple[type, str]] = []
    for cls in vars(module).values():
        if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
            continue
        if cls.__module__ != module.__name__:
            continue
        for name in sorted(n for n in dir(cls) if n.startswith("test")):
            meth = getattr(cls, name)
            found = _find_program(meth)
            if found is None:
                methods.append((cls, name))
                continue
            fn, nargs, efc = found
            skip = (
                getattr(meth, "__unittest_skip_why__", None)
                if getattr(meth, "__unittest_skip__", False)
                else None
            )
            programs.append(Program(f"{cls.__name__}.{name}", fn, nargs, efc, skip))
    return module, programs, methods


# ---------------------------------------------------------------- comparing


def same(a, b, tol: float = 1e-5) -> bool:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        if a.is_floating_point() or a.is_complex():
            return torch.allclose(a, b, rtol=tol, atol=tol, equal_nan=True)
        return torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            type(a) is type(b)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(np.allclose(a, b, rtol=tol, atol=tol, equal_nan=True))
        )
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and same(vars(a), vars(b), tol)
    if isinstance(a, dict):
        return (
            type(a) is type(b)
            and list(a.keys()) == list(b.keys())
            and all(same(a[k], b[k], tol) for k in a)
        )
    if _namedtuple(a) and _namedtuple(b):  # a class made inside the program: one per call
        return (
            type(a).__name__ == type(b).__name__
            and a._fields == b._fields
            and same(tuple(a), tuple(b), tol)
        )
    if isinstance(a, list | tuple):
        return (
            type(a) is type(b) and len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b))
        )
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b) or abs(a - b) <= tol * max(1.0, abs(a))
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _namedtuple(x: object) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


# ---------------------------------------------------------------- running programs


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: int):
    def fire(signum, frame):
        raise _Timeout(f"timed out after {seconds}s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


BREAK_LOG = _BreakLog()


def _kiln_counts() -> dict:
    import kiln

    s = kiln.stats()
    return {k: s[k] for k in ("graphs", "breaks", "eager_frames", "fallbacks")}


def _torch_counts() -> dict:
    from torch._dynamo.utils import counters

    frames = counters["frames"]
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "breaks": int(sum(counters["graph_break"].values())),
        # frames dynamo started and gave up on entirely (run as they are)
        "eager_frames": max(0, int(frames["total"]) - int(frames["ok"])),
        "fallbacks": 0,
    }


def _diff(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


def _reset_all() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    import kiln

    torch._dynamo.reset()
    counters.clear()
    kiln.reset()
    BREAK_LOG.lines.clear()


def _clone(args):
    return [a.clone() for a in args]


def _kiln_reasons() -> list[str]:
    """Break and eager-frame reasons from kiln's log: the first line, numbers and
    addresses dropped so that equal reasons group."""
    out = []
    for line in BREAK_LOG.lines:
        head = line.split("\n")[0]
        head = re.sub(r"0x[0-9a-f]+", "0x..", head)
        out.append(head[:200])
    return out


def run_program(p: Program, compiler: str, backend: str) -> dict:
    import torch

    import kiln

    torch.manual_seed(0)
    args = [[torch.randn(10, 10) for _ in range(p.nargs)] for _ in range(2)]
    rec: dict = {"status": "pass", "reason": ""}
    try:
        expected = []
        for a in args:
            a2 = _clone(a)
            expected.append((p.fn(*a2), a2))
    except Exception as e:
        return {"status": "eager-error", "reason": f"{type(e).__name__}: {e}"[:200]}
    _reset_all()
    before = _torch_counts() if compiler == "torch.compile" else _kiln_counts()
    cnt = None
    try:
        with _time_limit(CASE_TIMEOUT_S):
            if compiler == "torch.compile":
                from torch._dynamo.testing import CompileCounterWithBackend

                cnt = CompileCounterWithBackend(backend)
                opt = torch.compile(p.fn, backend=cnt)
            else:
                opt = kiln.compile(p.fn, backend=backend)
            for k in (0, 1, 0, 1):
                a2 = _clone(args[k])
                out = opt(*a2)
                if not same(out, expected[k][0]):
                    rec.update(status="fail", reason="wrong result")
                elif not same(a2, expected[k][1]):
                    rec.update(status="fail", reason="wrong argument mutation")
    except Exception as e:
        msg = str(e).split("\n")[0]
        rec.update(status="fail", reason=f"error: {type(e).__name__}: {msg}"[:240])
    counts = _diff(_torch_counts() if compiler == "torch.compile" else _kiln_counts(), before)
    if cnt is not None:
        counts["graphs"] = cnt.frame_count
    rec.update(counts)
    if compiler == "kiln":
        rec["break_reasons"] = _kiln_reasons()
    else:
        from torch._dynamo.utils import counters

        rec["break_reasons"] = [k[:200] for k in counters["graph_break"]]
        if rec["status"] == "pass" and counts["graphs"] != p.expected_frame_count:
            rec.update(
                status="fail",
                reason=f"{counts['graphs']} graphs, the test expects {p.expected_frame_count}",
            )
    return rec


def judge_kiln(rec: dict, ref: dict | None) -> None:
    """kiln's pass: right answer, no eager frame or fallback, no more breaks than
    torch.compile unless it built no more graphs either (dynamo's break counter leaves out
    a branch on tensor data, which splits its graph too); a frame torch.compile gave up on
    (ran eagerly) counts as one of its breaks. A frame captured whole with no
    tensor op builds no graph (``a.size`` of an array): that is a pass, as the OpInfo
    sweep's "no-op"."""
    if rec["status"] != "pass":
        return
    if rec["eager_frames"]:
        reasons = [r for r in rec.get("break_reasons", []) if "eager" in r.lower()]
        rec.update(status="fail", reason="eager frame: " + (reasons[0] if reasons else "?"))
    elif rec["fallbacks"]:
        rec.update(status="fail", reason="backend fallback")
    elif (
        ref is not None
        and rec["breaks"] > ref.get("breaks", 0) + ref.get("eager_frames", 0)
        and rec["graphs"] > ref.get("graphs", 0)
    ):
        reasons = rec.get("break_reasons", [])
        rec.update(status="fail", reason="break: " + (reasons[0] if reasons else "?"))


# ---------------------------------------------------------------- running methods


class _Mapping:
    """Patches torch's compile entry points for the length of one test method (see the
    module docstring): onto kiln, or (torch.compile) only the default backend."""

    def __init__(self, target: str, backend: str) -> None:
        self.target = target
        self.backend = backend
        self.calls = 0
        self.test_module = ""
        self.carried: dict[str, int] = {}  # kiln's counts at each mapped reset()
        self._saved: list[tuple[object, str, object]] = []

    def _set(self, obj, name, value) -> None:
        if hasattr(obj, name):
            self._saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

    def _map_backend(self, b):
        if b is None or b == "inductor":
            return self.backend
        return b

    def __enter__(self):
        import torch
        import torch._dynamo
        import torch._dynamo.exc as exc
        import torch._dynamo.testing as dyn_testing

        import kiln

        orig_compile = torch.compile
        orig_optimize = torch._dynamo.optimize
        orig_assert = torch._dynamo.optimize_assert
        orig_reset = torch._dynamo.reset
        mapping = self

        if self.target == "kiln":

            def compile_(model=None, *, backend="inductor", **kw):
                mapping.calls += 1
                return kiln.compile(model, backend=mapping._map_backend(backend), **kw)

            def optimize(*a, **kw):
                mapping.calls += 1
                backend = a[0] if a else kw.pop("backend", "inductor")
                fullgraph = bool(kw.pop("nopython", False))
                dynamic = kw.pop("dynamic", None)
                return kiln.compile(
                    backend=mapping._map_backend(backend), fullgraph=fullgraph, dynamic=dynamic
                )

            def optimize_assert(*a, **kw):
                mapping.calls += 1
                backend = a[0] if a else kw.pop("backend", "inductor")
                return kiln.compile(
                    backend=mapping._map_backend(backend),
                    fullgraph=True,
                    dynamic=kw.get("dynamic"),
                )

            def reset():
                # kiln.reset() also clears kiln's counters: keep what they held
                for k, v in _kiln_counts().items():
                    mapping.carried[k] = mapping.carried.get(k, 0) + v
                orig_reset()
                kiln.reset()

            @kiln.disable
            def _break_here():
                return None

            def graph_break(msg=""):
                _break_here()

            from kiln_capture import GraphBreakError

            eager_errors = (RuntimeError, ValueError, TypeError, AttributeError)
            self._set(torch, "compile", compile_)
            for mod in (torch._dynamo, dyn_testing):
                self._set(mod, "optimize", optimize)
                self._set(mod, "optimize_assert", optimize_assert)
                self._set(mod, "reset", reset)
            self._set(torch._dynamo, "graph_break", graph_break)
            orig_disable = torch._dynamo.disable
            test_module = mapping.test_module

            def disable(fn=None, recursive=True, **kw):
                # the test file's own uses only: torch calls it inside its functions too
                if sys._getframe(1).f_globals.get("__name__") == test_module:
                    return kiln.disable(fn, recursive=recursive)
                return orig_disable(fn, recursive, **kw)

            self._set(torch._dynamo, "disable", disable)
            self._set(exc, "Unsupported", (exc.Unsupported, GraphBreakError))
            self._set(exc, "UserError", (exc.UserError, GraphBreakError))
            self._set(exc, "TorchRuntimeError", (exc.TorchRuntimeError, *eager_errors))
            self._set(
                exc, "InternalTorchDynamoError", (exc.InternalTorchDynamoError, *eager_errors)
            )
            compiled = (torch._dynamo.OptimizedModule, _KilnCompiledModule)
            self._set(torch._dynamo, "OptimizedModule", compiled)
            self._set(torch._dynamo.eval_frame, "OptimizedModule", compiled)
            self._set(unittest.TestCase, "assertExpectedInline", lambda self, *a, **k: None)
            for cls in _expecttest_classes():
                self._set(cls, "assertExpectedInline", lambda self, *a, **k: None)
        else:

            def compile_(model=None, *, backend="inductor", **kw):
                mapping.calls += 1
                return orig_compile(model, backend=mapping._map_backend(backend), **kw)

            def optimize(*a, **kw):
                mapping.calls += 1
                if a:
                    a = (mapping._map_backend(a[0]), *a[1:])
                else:
                    kw["backend"] = mapping._map_backend(kw.get("backend"))
                return orig_optimize(*a, **kw)

            def optimize_assert(*a, **kw):
                mapping.calls += 1
                if a:
                    a = (mapping._map_backend(a[0]), *a[1:])
                return orig_assert(*a, **kw)

            self._set(torch, "compile", compile_)
            for mod in (torch._dynamo, dyn_testing):
                self._set(mod, "optimize", optimize)
                self._set(mod, "optimize_assert", optimize_assert)
        return self

    def __exit__(self, *exc_info):
        for obj, name, value in reversed(self._saved):
            setattr(obj, name, value)
        self._saved.clear()
        return False


class _KilnCompiledMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        # kiln.compile(module) returns an instance of a subclass of the module's own class
        # (kiln/api.py, "Compiled modules"), where torch returns an OptimizedModule
        t = type(obj)
        return t.__module__ == "kiln.api" and "_orig_mod" in vars(t)


class _KilnCompiledModule(metaclass=_KilnCompiledMeta):
    """What ``isinstance(m, torch._dynamo.OptimizedModule)`` also accepts, mapped."""


def _expecttest_classes() -> list[type]:
    mod = sys.modules.get("expecttest")
    return [mod.TestCase] if mod is not None and hasattr(mod, "TestCase") else []


def run_method(cls: type, name: str, compiler: str, backend: str) -> dict:
    import torch

    _reset_all()
    torch.manual_seed(0)
    target = "kiln" if compiler == "kiln" else "torch"
    mapping = _Mapping(target, backend)
    mapping.test_module = cls.__module__

    def counts_now() -> dict:
        if target != "kiln":
            return _torch_counts()
        now = _kiln_counts()
        return {k: v + mapping.carried.get(k, 0) for k, v in now.items()}

    seen: dict = {}
    test = cls(name)
    set_up, tear_down = test.setUp, test.tearDown

    # dynamo's TestCase resets its counters (and, mapped, kiln's) in setUp and tearDown:
    # count between the two
    def counted_set_up():
        set_up()
        BREAK_LOG.lines.clear()
        seen["before"] = counts_now()

    def counted_tear_down():
        seen["after"] = counts_now()
        seen["reasons"] = _reasons(target)
        tear_down()

    test.setUp, test.tearDown = counted_set_up, counted_tear_down
    result = unittest.TestResult()
    try:
        with _time_limit(CASE_TIMEOUT_S), mapping:
            test.run(result)
    except _Timeout as e:
        result.errors.append((None, f"_Timeout: {e}"))
    if "before" in seen and "after" in seen:
        counts = _diff(seen["after"], seen["before"])
    else:
        counts = {"graphs": 0, "breaks": 0, "eager_frames": 0, "fallbacks": 0}
    rec: dict = {"status": "pass", "reason": "", **counts}
    if result.skipped:
        rec.update(status="skipped", reason=result.skipped[0][1][:200])
    elif result.failures or result.errors:
        rec.update(status="fail", reason=_exception_line((result.failures or result.errors)[0][1]))
    elif result.unexpectedSuccesses:
        rec.update(status="pass", reason="unexpected success")
    elif mapping.calls == 0:
        rec.update(status="no-compile", reason="calls no compile entry point")
    rec["break_reasons"] = seen.get("reasons", [])
    if target == "kiln":  # breaks the test asks for (torch._dynamo.graph_break()): not counted
        asked = sum("_break_here" in r for r in rec["break_reasons"])
        rec["breaks"] = max(0, rec["breaks"] - asked)
    return rec


def _reasons(target: str) -> list[str]:
    if target == "kiln":
        return _kiln_reasons()
    from torch._dynamo.utils import counters

    return [k[:200] for k in counters["graph_break"]]


def _exception_line(tb: str) -> str:
    """The exception's own line of a formatted traceback (its last unindented line)."""
    lines = [ln for ln in tb.rstrip().split("\n") if ln.strip()]
    heads = [ln for ln in lines if not ln.startswith(" ") and not ln.startswith("Traceback")]
    return (heads[-1] if heads else lines[-1]).strip()[:240]


# ---------------------------------------------------------------- main


def _group(reason: str) -> str:
    r = re.sub(r"0x[0-9a-f]+", "0x..", reason)
    # "[B009] partial.__name__", "[B009] partial.keywords": one family
    r = re.sub(r"^((?:break: )?\[B\d+\] \w+)\.\w+$", r"\1.<attr>", r)
    r = re.sub(r"Tensor\(\w+: [^)]*\)", "Tensor(...)", r)
    r = re.sub(r"__kiln_resume_at_\d+_\w+", "<continuation>", r)
    r = re.sub(r"^eager frame: [\w.<>]+ \([^)]*\)", "eager frame: <fn>", r)
    r = re.sub(r"line \d+", "line N", r)
    r = re.sub(r":\d+\b", ":N", r)
    return r[:160]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", required=True, type=Path)
    ap.add_argument("--only", default="", help="comma-separated parts of case names")
    ap.add_argument("--backend", default="eager", help="backend for both compilers")
    ap.add_argument("--no-methods", action="store_true", help="programs only")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import os

    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    import torch  # noqa: F401

    logging.getLogger("kiln_capture").addHandler(BREAK_LOG)
    logging.getLogger("kiln_capture").setLevel(logging.DEBUG)
    logging.getLogger("kiln_capture").propagate = False

    _, programs, methods = load(args.file.resolve(), "_torch")
    _, kiln_programs, kiln_methods = load(args.file.resolve(), "_kiln")
    # the same cases, from the kiln side's own import of the file
    kiln_program = {p.name: p for p in kiln_programs}
    kiln_class = {c.__name__: c for c, _ in kiln_methods}
    only = [s for s in args.only.split(",") if s]
    if only:
        programs = [p for p in programs if any(s in p.name for s in only)]
        methods = [(c, n) for c, n in methods if any(s in f"{c.__name__}.{n}" for s in only)]
    if args.no_methods:
        methods = []

    rows = []
    t0 = time.time()
    for p in programs:
        row = {"name": p.name, "kind": "program", "nargs": p.nargs}
        if p.skip:
            row.update(status="skipped", reason=p.skip)
            rows.append(row)
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            row["torch.compile"] = ref = run_program(p, "torch.compile", args.backend)
            row["kiln"] = rec = run_program(kiln_program[p.name], "kiln", args.backend)
        judge_kiln(rec, ref)
        rows.append(row)
        print(_line(row), flush=True)
    for cls, name in methods:
        row = {"name": f"{cls.__name__}.{name}", "kind": "method"}
        with contextlib.redirect_stdout(io.StringIO()):
            row["torch.compile"] = ref = run_method(cls, name, "torch.compile", args.backend)
            row["kiln"] = rec = run_method(kiln_class[cls.__name__], name, "kiln", args.backend)
        if ref["status"] in ("skipped", "no-compile"):
            row.update(status=ref["status"], reason=ref["reason"])
        else:
            judge_kiln(rec, ref)
        rows.append(row)
        print(_line(row), flush=True)

    counted = [
        r
        for r in rows
        if "status" not in r and r["torch.compile"]["status"] not in ("eager-error",)
    ]
    tc_pass = [r for r in counted if r["torch.compile"]["status"] == "pass"]
    kiln_pass = [r for r in counted if r["kiln"]["status"] == "pass"]
    kiln_fail = [r for r in tc_pass if r["kiln"]["status"] != "pass"]
    groups: dict[str, list[str]] = {}
    for r in kiln_fail:
        groups.setdefault(_group(r["kiln"]["reason"]), []).append(r["name"])
    totals = {
        "cases": len(rows),
        "not_counted": len(rows) - len(counted),
        "counted": len(counted),
        "torch.compile_pass": len(tc_pass),
        "kiln_pass": len(kiln_pass),
        "kiln_pass_among_torch_passes": len(tc_pass) - len(kiln_fail),
        "kiln_fail_among_torch_passes": len(kiln_fail),
        "kiln_pass_where_torch_fails": len([r for r in kiln_pass if r not in tc_pass]),
    }
    print()
    print(
        f"{args.file.name}: {len(programs)} programs, {len(methods)} methods, "
        f"{time.time() - t0:.0f}s, backend {args.backend}"
    )
    if STUBBED:
        print(f"  stubbed (not in the installed torch): {', '.join(STUBBED)}")
    for k, v in totals.items():
        print(f"  {k:32} {v}")
    print("kiln failures among torch.compile's passes, by reason:")
    for reason, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(names):3}  {reason}")
        print(f"       {', '.join(n.split('.', 1)[1] for n in names)[:400]}")
    out = args.out or HERE / "results" / f"torch_suite_{args.file.stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "file": str(args.file),
                "commit": commit(),
                "backend": args.backend,
                "stubbed_names": STUBBED,
                "totals": totals,
                "kiln_failures_by_reason": groups,
                "rows": rows,
            },
            indent=1,
            default=str,
        )
    )
    print(f"wrote {out}")


def _line(row: dict) -> str:
    def cell(rec: dict | None) -> str:
        if rec is None:
            return ""
        return (
            f"{rec['status']:>10} g{rec.get('graphs', '-')} b{rec.get('breaks', '-')} "
            f"e{rec.get('eager_frames', '-')}"
        )

    if "status" in row:
        return f"{row['name'][:70]:70} {row['status']:>10}  {row.get('reason', '')[:80]}"
    k = row["kiln"]
    why = k["reason"] if k["status"] != "pass" else ""
    return f"{row['name'][:70]:70} {cell(row['torch.compile'])} | {cell(k)}  {why[:100]}"


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
