"""load_triton_kernels and TritonLauncher: from kernel source to a callable the wrapper
launches as ``kernel.fast(*tensors)`` (the launcher, or its C Launcher once it has one).

Sources are written into kiln-inductor's content-addressed cache (Triton needs a real file
to read a kernel's source) and imported from there; Triton keeps its compiled binaries in
its own cache. On the first call a launcher picks its launch configuration: the one
candidate, or the fastest candidate measured on copies of the arguments (so kernels that
write in place are not run twice on live data); winners are cached on disk per kernel,
GPU and Triton version. Under the interpreter the largest block is used and nothing is
measured.

Kernels with symbolic sizes take them as ints after their tensors (``meta["size_args"]``):
the launch configuration is chosen once per size bucket (``runtime/buckets.py``; autotuned
and cached per bucket), direct launches are kept per bucket and Triton specialization of
the sizes, and a kernel over rows of symbolic length runs its module's
``kernel_persistent`` in buckets whose rows fit it. What a call decides from its exact
sizes (kernel, grid, direct launch) is remembered for those sizes (``decide_sizes``, up to
``SIZE_CACHE_LIMIT`` size tuples per kernel); the wrapper then calls a C SizedLauncher,
which finds it in a dict and launches, with no Python frame for sizes seen before.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
import triton

from kiln_inductor import log
from kiln_inductor.runtime.cache import KernelCache, digest

from .. import __version__
from ..config import TritonConfig
from ..errors import TritonCompileError
from .buckets import SizedMeta, bucket_of, int_specialization
from .configs import LaunchConfig, candidate_configs, interpreter_config
from .direct import DirectLaunch, c_entry, c_launcher, c_sized_launcher

_modules: dict[str, Any] = {}

# size tuples a kernel with symbolic sizes remembers its decisions for; past it the oldest
# is forgotten (generate() calls its kernels with a new length every token)
SIZE_CACHE_LIMIT = 256


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


def _device_name(args: Sequence[Any]) -> str:
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    if device is None or device.type != "cuda":
        return "cuda" if device is None else device.type
    return torch.cuda.get_device_name(device)


@dataclass
class _Bucket:
    """What a kernel with size arguments chose for one size bucket."""

    fn: Any  # the module's ``kernel`` or ``kernel_persistent``
    config: LaunchConfig
    kwargs: dict[str, int]
    # direct launches per Triton specialization of the sizes (None: none could be built)
    directs: dict[tuple[Any, ...], DirectLaunch | None] = field(default_factory=dict)


class _AtSizes(NamedTuple):
    """What a kernel with size arguments decided for one exact tuple of sizes."""

    entry: _Bucket | None  # the bucket's choice; None: nothing to launch (no elements)
    grid: tuple[int, ...]
    spec: tuple[Any, ...]  # Triton's specialization of the sizes: the direct launch's key


class TritonLauncher:
    """A kernel's launches: its launch configuration chosen on the first call (one
    candidate, or the fastest measured; winners cached on disk), then direct launches.
    Subclasses change what a choice is (``grid``, ``candidates``, ``launcher_for``,
    ``encode``/``decode``) and keep the rest."""

    def __init__(
        self,
        fn: Any,
        meta: dict[str, Any],
        key: str,
        cfg: TritonConfig,
        persistent: Any = None,
    ):
        """``persistent``: the module's ``kernel_persistent``, for rows of symbolic length
        (``meta["persistent_limit"]``)."""
        self.fn, self.meta, self.key, self.cfg = fn, meta, key, cfg
        self.persistent = persistent
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
        # kernels with symbolic sizes: their sizes' meta and one choice per size bucket
        self.sized = SizedMeta(meta) if meta.get("size_args") else None
        self._buckets: dict[tuple[int, ...], _Bucket] = {}
        self._nsizes = len(meta.get("size_args") or ())
        # decisions per exact size tuple (oldest first), and the C launches among them
        # that the SizedLauncher in ``fast`` (once installed, for ``_c_device``) reads
        self._at_sizes: dict[tuple[int, ...], _AtSizes] = {}
        self._c_table: dict[tuple[int, ...], tuple[Any, ...] | None] = {}
        self._c_device: Any = None

    def __call__(self, *args: Any) -> None:
        if self.sized is not None:
            self._call_sized(args)
            return
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

    def _call_sized(self, args: Sequence[Any]) -> None:
        """A launch of a kernel with size arguments (the last ``len(size_args)`` ints), as
        decided for these sizes on their first call (``decide_sizes``)."""
        sizes = tuple(args[len(args) - self._nsizes :])
        at = self._at_sizes.get(sizes)
        if at is None:
            at = self.decide_sizes(sizes, args)
        entry, grid, spec = at
        if entry is None:
            return
        direct = entry.directs.get(spec)
        if direct is not None and direct(args, grid):
            self._publish(sizes, grid, direct)
            return
        kernel = entry.fn[grid](*args, **entry.kwargs)
        if spec not in entry.directs and self.cfg.direct_launch and not interpreting():
            checked = self.meta.get("checked_args")
            direct = entry.directs[spec] = DirectLaunch.build(
                entry.fn, kernel, args, entry.kwargs, grid, checked, nsizes=len(sizes)
            )
            self._publish(sizes, grid, direct)

    def decide_sizes(self, sizes: tuple[int, ...], args: Sequence[Any]) -> _AtSizes:
        """What a call at ``sizes`` launches: nothing (no elements), or its size bucket's
        kernel and launch configuration (chosen on the bucket's first call:
        ``choose_sized``), with its grid and the Triton specialization of the sizes.
        Remembered for ``sizes``, the oldest decision forgotten past SIZE_CACHE_LIMIT."""
        sized = self.sized
        assert sized is not None
        xnumel, extent = sized.numels(sizes)
        if xnumel <= 0:
            at = _AtSizes(None, (), ())
        else:
            bucket = bucket_of(sizes)
            entry = self._buckets.get(bucket)
            if entry is None:
                entry = self._buckets[bucket] = self.choose_sized(bucket, args)
            if entry.fn is not self.fn and extent > entry.config.RBLOCK:
                # a row longer than the bucket's (a size that shrinks as a symbol grows):
                # the looped kernel takes any length
                looped = (-1, *bucket)
                entry = self._buckets.get(looped) or self.choose_sized(bucket, args, looped=True)
                self._buckets[looped] = entry
            grid = (triton.cdiv(xnumel, entry.config.XBLOCK),)
            at = _AtSizes(entry, grid, int_specialization(sizes))
        cache = self._at_sizes
        if len(cache) >= SIZE_CACHE_LIMIT:
            oldest = next(iter(cache))
            del cache[oldest]
            self._c_table.pop(oldest, None)
        cache[sizes] = at
        if at.entry is None:
            self._c_table[sizes] = None  # the SizedLauncher returns at once
        return at

    def _publish(
        self, sizes: tuple[int, ...], grid: tuple[int, ...], direct: DirectLaunch | None
    ) -> None:
        """Keep the SizedLauncher's entry for ``sizes`` (just decided, so remembered) in
        step with their direct launch: its C launch (the first one installs the
        SizedLauncher as ``fast``), or none (no direct launch, or its C launches failed)."""
        entry = None if direct is None else c_entry(direct, grid)
        if entry is None:
            self._c_table.pop(sizes, None)
            return
        if self.fast is self and type(self).__call__ is TritonLauncher.__call__:
            fast = c_sized_launcher(direct, self._nsizes, self._c_table, self)
            if fast is not None:
                self.fast, self._c_device = fast, direct.device
        if self.fast is not self and direct.device == self._c_device:
            self._c_table[sizes] = entry

    def sized_meta(self, sizes: Sequence[int], looped: bool = False) -> tuple[Any, dict]:
        """The kernel (``kernel`` or ``kernel_persistent``) and its meta at ``sizes``."""
        assert self.sized is not None
        meta = self.sized.at(sizes, looped or self.persistent is None)
        return (self.persistent if meta["variant"] == "kernel_persistent" else self.fn), meta

    def choose_sized(
        self, bucket: tuple[int, ...], args: Sequence[Any], looped: bool = False
    ) -> _Bucket:
        """The kernel and launch configuration of a size bucket: candidates for the
        bucket's sizes (the next power of two of each), the fastest measured on this
        call's arguments, cached on disk per bucket."""
        fn, meta = self.sized_meta(bucket, looped)

        def chosen(config: LaunchConfig) -> _Bucket:
            return _Bucket(fn, config, config.as_dict())

        if interpreting():
            return chosen(interpreter_config(meta))
        cands = candidate_configs(meta, self.cfg.max_autotune)
        cands = cands if self.cfg.autotune else cands[:1]
        if len(cands) == 1:
            return chosen(cands[0])
        assert self.sized is not None
        sizes = tuple(args[len(args) - len(self.sized.names) :])
        xnumel, _ = self.sized.numels(sizes)
        if torch.cuda.is_available() and self.cfg.compile_workers > 0:
            compile_configs([(fn, self.meta, c, sizes) for c in cands], self.cfg.compile_workers)

        def launcher_for(config: LaunchConfig) -> Callable[..., Any]:
            launch, kw = fn[(triton.cdiv(xnumel, config.XBLOCK),)], config.as_dict()
            return lambda *a: launch(*a, **kw)

        key = f"bucket={bucket},{meta['kind']}"
        return chosen(self.tuned(cands, args, key, launcher_for))

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
        return self.tuned(cands, args)

    def tuned(
        self,
        cands: Sequence[Any],
        args: Sequence[Any],
        bucket: str | None = None,
        launcher_for: Callable[[Any], Callable[..., Any]] | None = None,
    ) -> Any:
        """The fastest of ``cands``: cached on disk per kernel, GPU, mode (and size bucket,
        for kernels with symbolic sizes), else measured on copies of ``args``."""
        parts = [self.key, _device_name(args), str(self.cfg.max_autotune)]
        tkey = digest(*parts, bucket) if bucket is not None else digest(*parts)
        cache = KernelCache("triton-autotune")
        found = cache.lookup(tkey)
        if found is not None:
            winner = self.decode(json.loads((found / "winner.json").read_text()))
            if winner in cands:
                return winner
        timings = self.measure(cands, args, launcher_for=launcher_for)
        winner = min(cands, key=lambda c: timings[c])
        log.log(
            "kernels",
            f"autotuned {self.meta.get('kind')} kernel{f' ({bucket})' if bucket else ''}: "
            f"{winner} ({timings[winner] * 1e3:.1f} us)",
        )

        def build(tmp: Path) -> None:
            (tmp / "winner.json").write_text(json.dumps(self.encode(winner)))

        cache.get_or_build(tkey, build)
        return winner

    def measure(
        self,
        candidates: Sequence[Any],
        args: Sequence[Any],
        rounds: int = 3,
        launcher_for: Callable[[Any], Callable[..., Any]] | None = None,
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
            run = (launcher_for or self.launcher_for)(c)
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
        persistent = getattr(module, "kernel_persistent", None)
        launchers.append(TritonLauncher(module.kernel, src.meta, key, cfg, persistent))
    if cfg.compile_workers > 0 and not interpreting() and torch.cuda.is_available():
        precompile(launchers, cfg.compile_workers)
    return launchers


# sizes a kernel with symbolic sizes is precompiled for, before its first call tells the
# real ones: large (the candidates of every bucket past a few thousand agree) and not a
# multiple of 16 (the specialization most sizes get)
NOMINAL_SIZE = 4095

# (the jit function, its kernel's meta, a launch configuration, the size arguments)
_Job = tuple[Any, dict[str, Any], LaunchConfig, tuple[int, ...]]


def precompile(launchers: Sequence[TritonLauncher], workers: int) -> None:
    """Compile every candidate configuration of every kernel in parallel threads, ahead of
    the first call (Triton compiles in C++ without the GIL). Argument types come from the
    kernel's metadata; a failure here only means the kernel compiles at its first call.
    A kernel with symbolic sizes compiles its first candidate at ``NOMINAL_SIZE`` (its
    buckets' candidates compile when a call first reaches them: ``choose_sized``)."""
    jobs: list[_Job] = []
    owners: list[TritonLauncher] = []
    for ln in launchers:
        if ln.sized is not None:
            sizes = (NOMINAL_SIZE,) * len(ln.sized.names)
            fn, meta = ln.sized_meta(bucket_of(sizes))
            jobs.append((fn, ln.meta, candidate_configs(meta, ln.cfg.max_autotune)[0], sizes))
            owners.append(ln)
        elif int(ln.meta["xnumel"]) > 0:
            cands = ln.candidates()
            jobs.extend((ln.fn, ln.meta, c, ()) for c in cands)
            owners.extend([ln] * len(cands))
    if not jobs:
        return
    t0 = time.perf_counter()
    errors = compile_configs(jobs, workers)
    log.log("timings", f"precompiled {len(jobs)} kernel configs in {time.perf_counter() - t0:.1f}s")
    # a kernel Triton rejects in every configuration fails the compilation now, where the
    # caller (kiln.compile) can still run the graph eagerly, rather than at its first call
    for ln in launchers:
        mine = [e for owner, e in zip(owners, errors) if owner is ln]
        if mine and all(e is not None for e in mine):
            raise TritonCompileError(f"cache entry {ln.key}", str(mine[0]))


def compile_configs(jobs: Sequence[_Job], workers: int) -> list[Exception | None]:
    """Compile ``(fn, meta, config, sizes)`` jobs in parallel threads; for each, the
    error Triton raised compiling it (None: compiled, or failed in a way that only means
    it compiles at its first launch)."""
    from concurrent.futures import ThreadPoolExecutor

    from triton.compiler.errors import CompilationError

    def compile_one(job: _Job) -> Exception | None:
        fn, meta, c, sizes = job
        dtypes = [getattr(torch, d) for d in meta["arg_dtypes"]]
        try:
            fn.warmup(*dtypes, *sizes, grid=(1,), **c.as_dict())
        except CompilationError as e:
            return e
        except Exception as e:
            log.log("kernels", f"precompile of {c} failed (compiles at first call): {e}")
        return None

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        return list(pool.map(compile_one, jobs))
