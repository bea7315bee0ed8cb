"""Backends `kiln.compile(backend=...)` accepts, and the fallback that guards them.

A backend follows DESIGN.md's contract 1: ``backend(gm, example_inputs) -> callable``.
Named ones:

- ``"inductor"``: kiln's compiler (kiln-inductor), with kiln-cpp for CPU tensors and
  kiln-triton for CUDA tensors; ``mode``/``options`` configure it.
- ``"eager"``: runs the captured torch-level graph as it is (tests capture alone).
- ``"aot_eager"``: kiln-aot's ATen graphs (forward and, when training, the partitioned
  backward) run eagerly (tests capture + AOT without code generation).

`with_fallback` wraps any of them: an error while compiling a graph warns once, naming
the stage and op, and that graph runs eagerly, unless fallback is off.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from kiln.errors import BackendCompilerFailed, UnknownBackend

log = logging.getLogger("kiln")

Backend = Callable[[torch.fx.GraphModule, list], Callable]

# Graphs that fell back to eager since the last reset (capture counts the graphs).
FALLBACKS = [0]


def eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    return gm.forward


def aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    import kiln_aot

    def run_as_is(aten_gm: torch.fx.GraphModule, _inputs: list) -> Callable:
        return aten_gm.forward

    return kiln_aot.aot_graph(gm, example_inputs, fw_compiler=run_as_is, bw_compiler=run_as_is)


def inductor(
    gm: torch.fx.GraphModule, example_inputs: list, *, options: dict[str, Any]
) -> Callable:
    """kiln's compiler: kiln-triton for graphs on CUDA tensors, kiln-cpp otherwise."""
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    if "cuda" in devices:
        import kiln_triton

        return kiln_triton.compile_fx(gm, example_inputs, options=triton_options(options))
    import kiln_cpp

    return kiln_cpp.compile_fx(gm, example_inputs)


def inductor_reload(
    recipe: Any,
    example_inputs: list,
    make_graph: Callable[[], torch.fx.GraphModule],
    *,
    options: dict[str, Any],
) -> Callable | None:
    """``inductor``'s callable for a graph a process compiled before, from the reload
    recipe that callable carried (kiln-inductor's runtime/reload.py; kiln-capture keeps it
    with the kept capture), without the graph: or None, and the graph is compiled."""
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    if "cuda" in devices:  # kiln-triton's graphs have no recipe
        return None
    import kiln_cpp  # noqa: F401  (registers the C++ kernel backend)
    import kiln_inductor

    return kiln_inductor.reload_fx(recipe, example_inputs, make_graph)


def import_cpu_compiler() -> None:
    """Import the modules a first compiled call on CPU tensors needs (kiln-cpp, kiln-aot,
    kiln-inductor's regions and artifact cache), when kiln is imported: they are imported
    once per process anyway, and inside the first call they were a quarter of a warm
    process's first call (issue #19; ``import kiln`` pays it instead, where a program's
    import time is counted)."""
    import kiln_aot  # noqa: F401
    import kiln_cpp  # noqa: F401
    import kiln_inductor.regions
    import kiln_inductor.runtime.artifacts  # noqa: F401


def triton_options(options: dict[str, Any]) -> dict[str, Any]:
    """The subset of kiln.compile options that kiln-triton reads."""
    keep = ("triton.cudagraphs", "max_autotune")
    return {k: options[k] for k in keep if k in options}


NAMED: dict[str, Callable[..., Callable]] = {
    "inductor": inductor,
    "eager": eager,
    "aot_eager": aot_eager,
}


def list_backends() -> list[str]:
    return sorted(NAMED)


def lookup(backend: str | Backend, options: dict[str, Any]) -> tuple[str, Backend]:
    """(name for messages, callable) for a backend name or callable."""
    if callable(backend):
        return getattr(backend, "__name__", type(backend).__name__), backend
    if not isinstance(backend, str) or backend not in NAMED:
        raise UnknownBackend(
            f"unknown backend {backend!r}; kiln.compile accepts {list_backends()} "
            "or a callable backend(gm, example_inputs) -> callable"
        )
    fn = NAMED[backend]
    if backend == "inductor":
        fn = functools.partial(fn, options=options)
        # a kept capture's compiled graph found again without the graph (inductor_reload)
        fn.kiln_reload = functools.partial(inductor_reload, options=options)
    env = {}
    if options.get("debug_dir"):
        env["KILN_DEBUG_DIR"] = options["debug_dir"]
    if not options.get("check_indices", True):
        env["KILN_CHECK_INDICES"] = "0"
    if not options.get("artifact_cache", True):
        env["KILN_ARTIFACT_CACHE"] = "0"
    if not options.get("regional_reuse", True):
        env["KILN_REGIONAL_REUSE"] = "0"
    if options.get("regional_reuse_gpu", False):
        env["KILN_REGIONAL_REUSE_GPU"] = "1"
    if env:
        fn = _with_env(fn, env)
    return backend, fn


def _with_env(backend: Backend, env: dict[str, str]) -> Backend:
    """Set the packages' environment settings (``KILN_DEBUG_DIR``, ``KILN_CHECK_INDICES``,
    ``KILN_ARTIFACT_CACHE``, ``KILN_REGIONAL_REUSE``, ``KILN_REGIONAL_REUSE_GPU``) while compiling: the options that kiln.compile passes down
    this way (the artifact cache is chosen when a graph reaches the backend)."""

    def scoped(call: Callable) -> Callable:
        def run(*args: Any) -> Any:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                return call(*args)
            finally:
                for k, v in saved.items():
                    if v is None:
                        del os.environ[k]
                    else:
                        os.environ[k] = v

        return run

    compiling = functools.wraps(backend)(scoped(backend))
    reload = getattr(backend, "kiln_reload", None)
    compiling.kiln_reload = scoped(reload) if reload is not None else None
    return compiling


def with_fallback(name: str, backend: Backend, *, allow_fallback: bool) -> Backend:
    """Wrap ``backend`` so that a compile error runs the graph eagerly (or re-raises)."""

    @functools.wraps(backend)
    def guarded(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        try:
            return backend(gm, example_inputs)
        except Exception as e:
            FALLBACKS[0] += 1
            stage = getattr(e, "stage", None)
            op = getattr(e, "op", None)
            error = BackendCompilerFailed(name, stage, str(op) if op is not None else None, e)
            if not allow_fallback:
                raise error from e
            warnings.warn(
                f"{error}\n  this graph runs eagerly instead", RuntimeWarning, stacklevel=2
            )
            log.warning("kiln: falling back to eager: %s", error)
            return gm.forward

    reload = getattr(backend, "kiln_reload", None)

    def reloading(recipe: Any, example_inputs: list, make_graph: Callable) -> Callable | None:
        try:
            return reload(recipe, example_inputs, make_graph)
        except Exception as e:  # the graph is compiled instead (with this fallback)
            log.warning("kiln: a reload recipe failed (%s: %s): compiling", type(e).__name__, e)
            return None

    guarded.kiln_reload = reloading if reload is not None else None
    return guarded


def torch_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """kiln's compiler as a backend of torch's own capture: ``torch.compile(m, backend="kiln")``.

    Registered under the ``torch_dynamo_backends`` entry point group as ``kiln``.
    """
    return inductor(gm, example_inputs, options={})
