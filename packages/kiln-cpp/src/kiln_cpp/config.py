"""Typed settings of kiln-cpp, read from the environment in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_FLAGS = (
    "-O3 -march=native -fopenmp -fno-math-errno -fno-trapping-math -std=c++17 -shared -fPIC"
)


@dataclass(frozen=True)
class CppConfig:
    cxx: str = "g++"  # KILN_CPP_CXX: the C++ compiler (affects the cache key)
    flags: str = DEFAULT_FLAGS  # KILN_CPP_FLAGS: compiler flags (affects the cache key)
    libs: str = "-lmvec -lm"  # KILN_CPP_LIBS: libraries to link (affects the cache key)
    workers: int = 0  # KILN_CPP_WORKERS: parallel compiler processes (0: one per core)
    progress_after: int = 8  # KILN_CPP_PROGRESS: show progress when compiling more kernels
    # KILN_CPP_STREAM_BYTES: a row-wise kernel writing more bytes than this writes its rows
    # with non-temporal stores (-1: glibc memcpy's rule, 3/4 of each thread's share of the
    # last-level cache; 0: never). Changes the source, hence the cache key.
    stream_bytes: int = -1


def stream_threshold(cfg: CppConfig) -> int | None:
    """Bytes written above which kernels stream their rows, or None (never)."""
    if cfg.stream_bytes >= 0:
        return cfg.stream_bytes or None
    llc = last_level_cache_bytes()
    if not llc:
        return None
    return llc * 3 // 4 // (os.cpu_count() or 1)


def last_level_cache_bytes() -> int:
    """Size of CPU 0's largest cache level, from sysfs (0 when unknown)."""
    best_level, size = 0, 0
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(root)
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(f"{root}/{entry}/level") as f:
                level = int(f.read())
            with open(f"{root}/{entry}/size") as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
        value = int(text.rstrip("KM")) * scale
        if level > best_level:
            best_level, size = level, value
    return size


def read_cpp_config() -> CppConfig:
    env = os.environ
    return CppConfig(
        cxx=env.get("KILN_CPP_CXX") or os.environ.get("CXX") or "g++",
        flags=env.get("KILN_CPP_FLAGS") or DEFAULT_FLAGS,
        libs=env.get("KILN_CPP_LIBS") or "-lmvec -lm",
        workers=int(env.get("KILN_CPP_WORKERS") or 0),
        progress_after=int(env.get("KILN_CPP_PROGRESS") or 8),
        stream_bytes=int(env.get("KILN_CPP_STREAM_BYTES") or -1),
    )
