"""load_triton_kernels and TritonLauncher: from kernel source to a callable the wrapper
launches as ``kernel.fast(*tensors)`` (the launcher, or its C Launcher once it has one).

Sources are written into kiln-inductor's content-addressed cache (Triton needs a real file
to read a kernel's source) and imported from there; Triton keeps its compiled binaries in
its own cache. On the first call a launcher picks its launch configuration: the one
candidate, or the fastest candidate measured on copies of the arguments (so kernels that
write in place are not run twice on live data); winners are cached on disk per kernel,
GPU and Triton version. Under the interpreter the largest block is used and nothing is
measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import triton

from kiln_inductor import log
from kiln_inductor.runtime.cache import KernelCache, digest

from .. import __version__
from ..config import TritonConfig
from ..errors import TritonCompileError
from .configs import LaunchConfig, candidate_configs, interpreter_config
from .direct import DirectLaunch, c_launcher

_modules: dict[str, Any] = {}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def source_key(source: str, cfg: TritonConfig) -> str:
    return digest(source, __version__, triton.__version__, cfg.cache_key_part())


def _import(path: Path, key: str) -> Any:
    if key in _modules:
        return _modules[key]
    spec = importlib.util.spec_from_file_location(f"kiln_triton_kernel_{key[:16]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _modules[key] = module
    return module


def load_module(source: str, key: str) -> Any:
    cache = KernelCache("triton")

    def build(tmp: Path) -> None:
        (tmp / "kernel.py").write_text(source)

    return _import(cache.get_or_build(key, build) / "kernel.py", key)


class TritonLauncher:
    """A kernel's launches: its launch configuration chosen on the first call (one
    candidate, or the fastest measured; winners cached on disk), then direct launches.
    Subclasses change what a choice is (``grid``, ``candidates``, ``launcher_for``,
    ``encode``/``decode``) and keep the rest."""

    def __init__(self, fn: Any, meta: dict[str, Any], key: str, cfg: TritonConfig):
        self.fn, self.meta, self.key, self.cfg = fn, meta, key, cfg
        self.config: Any = None
        self._launch: Any = None
        self._kwargs: dict[str, int] = {}
        self._grid: tuple[int, ...] = ()
        self._direct: DirectLaunch | None = None
        # what the wrapper calls (``kernel_3.fast(...)``, TritonBackend.call_line): this
        # object, until its direct launch can run as a kiln_triton._launch.Launcher, which
        # the wrapper then calls with no Python frame in between (``_install_fast``)
        self.fast: Callable[..., Any] = self
        self._fast_c = False

    def __call__(self, *args: Any) -> None:
        direct = self._direct
        if direct is not None:
            if direct(args):
                return
            if self._fast_c and direct.c_shape is None:  # C launches failed: stop them
                self.fast, self._fast_c = self, False
        if self._launch is None:
            if int(self.meta["xnumel"]) == 0:
                return
            self.select(self.choose(args))
        kernel = self._launch(*args, **self._kwargs)
        if direct is None and self.cfg.direct_launch and not interpreting():
            checked = self.meta.get("checked_args")  # None (unknown): check every argument
            self._direct = DirectLaunch.build(
                self.fn, kernel, args, self._kwargs, self._grid, checked
            )
            self._install_fast()

    def _install_fast(self) -> None:
        """Let the wrapper call a C Launcher for this kernel's direct launches; it calls
        back into ``__call__`` while a launch hook is installed, for a misaligned tensor
        the kernel assumes aligned, or when a launch fails."""
        d = self._direct
        if d is None or d.c_shape is None or type(self).__call__ is not TritonLauncher.__call__:
            return
        fast = c_launcher(d, self)
        if fast is not None:
            self.fast, self._fast_c = fast, True

    # -- what a choice is --------------------------------------------------------------------
    def grid(self, config: Any) -> tuple[int, ...]:
        return (triton.cdiv(int(self.meta["xnumel"]), config.XBLOCK),)

    def candidates(self) -> list[Any]:
        cands = candidate_configs(self.meta, self.cfg.max_autotune)
        return cands if self.cfg.autotune else cands[:1]

    def interpreter_choice(self) -> Any:
        return interpreter_config(self.meta)

    def encode(self, config: Any) -> Any:
        return config.as_dict()

    def decode(self, saved: Any) -> Any:
        return LaunchConfig(**saved)

    def launcher_for(self, config: Any) -> Callable[..., Any]:
        """A callable running the kernel in ``config`` on the kernel's arguments."""
        launch, kw = self.fn[self.grid(config)], config.as_dict()
        return lambda *args: launch(*args, **kw)

    def select(self, config: Any) -> None:
        self.config = config
        self._grid = self.grid(config)
        self._launch = self.fn[self._grid]
        self._kwargs = config.as_dict()

    # -- choosing ----------------------------------------------------------------------------
    def choose(self, args: Sequence[Any]) -> Any:
        if interpreting():
            return self.interpreter_choice()
        cands = self.candidates()
        if len(cands) == 1:
            return cands[0]
        device = torch.cuda.get_device_name(args[0].device) if args else "cuda"
        tkey = digest(self.key, device, str(self.cfg.max_autotune))
        cache = KernelCache("triton-autotune")
        found = cache.lookup(tkey)
        if found is not None:
            winner = self.decode(json.loads((found / "winner.json").read_text()))
            if winner in cands:
                return winner
        timings = self.measure(cands, args)
        winner = min(cands, key=lambda c: timings[c])
        log.log(
            "kernels",
            f"autotuned {self.meta.get('kind')} kernel: {winner} ({timings[winner] * 1e3:.1f} us)",
        )

        def build(tmp: Path) -> None:
            (tmp / "winner.json").write_text(json.dumps(self.encode(winner)))

        cache.get_or_build(tkey, build)
        return winner

    def measure(
        self, candidates: Sequence[Any], args: Sequence[Any], rounds: int = 3
    ) -> dict[Any, float]:
        """Milliseconds per launch of each candidate, on copies of the arguments: the median
        of ``rounds`` medians, the candidates taking turns so that clock drift during
        tuning falls on all of them alike (two configs of a bandwidth-bound kernel are
        often within 1% of each other)."""
        from triton.testing import do_bench

        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        runs: dict[Any, Callable[..., Any]] = {}
        samples: dict[Any, list[float]] = {}
        for c in candidates:
            run = self.launcher_for(c)
            try:
                run(*copies)
                torch.cuda.synchronize()
                runs[c], samples[c] = run, []
            except Exception as e:  # e.g. out of shared memory or registers for this config
                log.log("kernels", f"config {c} failed: {e}")
        for _ in range(rounds):
            for c, run in runs.items():
                t = do_bench(lambda run=run: run(*copies), warmup=1, rep=5, return_mode="median")
                samples[c].append(float(t))
        out = {
            c: statistics.median(samples[c]) if c in samples else float("inf") for c in candidates
        }
        log.log(
            "kernels",
            f"{self.meta.get('kind')} kernel candidates (us): "
            + ", ".join(f"{c}: {t * 1e3:.1f}" for c, t in out.items()),
        )
        return out


def load_triton_kernels(sources: Sequence[Any], cfg: TritonConfig) -> list[TritonLauncher]:
    launchers = []
    for src in sources:
        key = source_key(src.source, cfg)
        module = load_module(src.source, key)
        launchers.append(TritonLauncher(module.kernel, src.meta, key, cfg))
    if cfg.compile_workers > 0 and not interpreting() and torch.cuda.is_available():
        precompile(launchers, cfg.compile_workers)
    return launchers


def precompile(launchers: Sequence[TritonLauncher], workers: int) -> None:
    """Compile every candidate configuration of every kernel in parallel threads, ahead of
    the first call (Triton compiles in C++ without the GIL). Argument types come from the
    kernel's metadata; a failure here only means the kernel compiles at its first call."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(ln, c) for ln in launchers if int(ln.meta["xnumel"]) > 0 for c in ln.candidates()]
    if not jobs:
        return

    from triton.compiler.errors import CompilationError

    def compile_one(job: tuple[TritonLauncher, LaunchConfig]) -> Exception | None:
        ln, c = job
        dtypes = [getattr(torch, d) for d in ln.meta["arg_dtypes"]]
        try:
            ln.fn.warmup(*dtypes, grid=(1,), **c.as_dict())
        except CompilationError as e:
            return e
        except Exception as e:
            log.log("kernels", f"precompile of {c} failed (compiles at first call): {e}")
        return None

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        errors = list(pool.map(compile_one, jobs))
    log.log("timings", f"precompiled {len(jobs)} kernel configs in {time.perf_counter() - t0:.1f}s")
    # a kernel Triton rejects in every configuration fails the compilation now, where the
    # caller (kiln.compile) can still run the graph eagerly, rather than at its first call
    for ln in launchers:
        failed = [e for (owner, _), e in zip(jobs, errors) if owner is ln and e is not None]
        if failed and len(failed) == len(ln.candidates()):
            raise TritonCompileError(f"cache entry {ln.key}", str(failed[0]))
