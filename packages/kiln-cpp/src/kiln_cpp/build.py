"""build_kernels: compile kernel sources to shared objects (cached) and load them.

Each kernel is its own translation unit, compiled by the system C++ compiler in a separate
process; up to one process per core runs at a time, with a progress line when there are
many. Binaries live in kiln-inductor's content-addressed cache, keyed by source, flags,
compiler identity and package versions, so a second process finds them all built.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kiln_inductor
from kiln_inductor.runtime.cache import KernelCache, digest

from . import __version__
from .config import CppConfig, read_cpp_config
from .errors import CppCompileError


@functools.cache
def compiler_identity(cxx: str) -> str:
    """The first line of ``cxx --version``. Running it took ~2 ms of a warm process's
    first call, so it is kept in the kernel cache per compiler binary (its resolved path,
    size, modification time and inode, as ccache's default compiler check): a replaced
    compiler is asked again."""
    found = shutil.which(cxx)
    known = None
    if found is not None:
        real = os.path.realpath(found)
        st = os.stat(real)
        known = (
            KernelCache("cpp").root
            / "compilers"
            / digest(real, str(st.st_size), str(st.st_mtime_ns), str(st.st_ino))
        )
        try:
            return known.read_text()
        except (OSError, UnicodeDecodeError):
            pass
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise CppCompileError([cxx, "--version"], str(e), "-") from e
    identity = out.splitlines()[0] if out else cxx
    if known is not None:
        try:  # written whole, then moved into place: a reader sees all of it or nothing
            known.parent.mkdir(parents=True, exist_ok=True)
            tmp = known.with_name(f".tmp-{os.getpid()}-{known.name}")
            tmp.write_text(identity)
            os.replace(tmp, known)
        except OSError:  # a read-only cache: asked again next time
            pass
    return identity


def cache_key(source: str, cfg: CppConfig) -> str:
    return digest(
        source,
        cfg.cxx,
        cfg.flags,
        cfg.libs,
        compiler_identity(cfg.cxx),
        __version__,
        kiln_inductor.__version__,
    )


def _compile(source: str, key: str, cfg: CppConfig, cache: KernelCache) -> Path:
    def build(tmp: Path) -> None:
        src = tmp / "kernel.cpp"
        src.write_text(source)
        cmd = [
            cfg.cxx,
            *cfg.flags.split(),
            str(src),
            "-o",
            str(tmp / "kernel.so"),
            *cfg.libs.split(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            keep = cache.root / "failed" / f"{key}.cpp"
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_text(source)
            raise CppCompileError(cmd, proc.stderr, str(keep))

    return cache.get_or_build(key, build) / "kernel.so"


_loaded: dict[str, Any] = {}


def _load(path: Path, nargs: int, nsizes: int = 0) -> Callable[..., Any]:
    lib = _loaded.get(str(path))
    if lib is None:
        lib = ctypes.CDLL(str(path))
        _loaded[str(path)] = lib
    fn = lib.kernel
    # The int64 sizes go through ctypes as pointer-sized words: on 64-bit targets an
    # int64_t and a pointer argument travel alike (a general register or an 8-byte stack
    # slot), and ctypes converts a Python int to c_void_p in about a third of the time it
    # takes for c_int64 (0.05 against 0.13 us an argument, a kernel call per launch).
    size_type = ctypes.c_void_p if ctypes.sizeof(ctypes.c_void_p) == 8 else ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p] * nargs + [size_type] * nsizes
    # 0, or the number of the index check that failed; its bad index from error_index()
    fn.restype = ctypes.c_int64
    fn.error_index = lib.kiln_error_index
    fn.error_index.restype = ctypes.c_int64
    return fn


def build_kernels(sources: Sequence[tuple[str, int, int]]) -> list[Callable[..., Any]]:
    """Compile (in parallel, through the cache) and load ``(source, pointers, sizes)``
    kernels: ``pointers`` data pointers then ``sizes`` int64 sizes."""
    cfg = read_cpp_config()
    cache = KernelCache("cpp")
    keys = [cache_key(src, cfg) for src, *_ in sources]
    paths: dict[str, Path] = {}
    todo = []
    for (src, *_), key in zip(sources, keys):
        if key in paths:
            continue
        found = cache.lookup(key)
        if found is not None:
            paths[key] = found / "kernel.so"
        else:
            paths[key] = None  # type: ignore[assignment]
            todo.append((src, key))
    if todo:
        workers = cfg.workers or os.cpu_count() or 1
        show = len(todo) >= cfg.progress_after and sys.stderr is not None
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(workers, len(todo))) as pool:
            futures = [(key, pool.submit(_compile, src, key, cfg, cache)) for src, key in todo]
            for done, (key, fut) in enumerate(futures, 1):
                paths[key] = fut.result()
                if show:
                    print(
                        f"\r[kiln-cpp] compiled {done}/{len(todo)} kernels ({time.perf_counter() - t0:.1f}s)",
                        end="",
                        file=sys.stderr,
                    )
        if show:
            print(file=sys.stderr)
    return [_load(paths[key], n, sizes) for (_, n, sizes), key in zip(sources, keys)]
