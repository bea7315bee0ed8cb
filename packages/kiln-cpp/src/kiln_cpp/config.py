"""Typed settings of kiln-cpp, declared once in ``CppConfig`` with kiln-shapes' settings
helper; ``read_cpp_config()`` reads them when called (never a snapshot taken at import).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kiln_shapes.settings import Settings, setting

DEFAULT_FLAGS = (
    "-O3 -march=native -fopenmp -fno-math-errno -fno-trapping-math -std=c++17 -shared -fPIC"
)


@dataclass(frozen=True)
class CppConfig:
    cxx: str = setting(
        "KILN_CPP_CXX",
        "g++",
        "the C++ compiler (unset: $CXX, else g++)",
        affects_cache=True,
        also=("CXX",),
    )
    flags: str = setting("KILN_CPP_FLAGS", DEFAULT_FLAGS, "compiler flags", affects_cache=True)
    libs: str = setting("KILN_CPP_LIBS", "-lmvec -lm", "libraries to link", affects_cache=True)
    workers: int = setting("KILN_CPP_WORKERS", 0, "parallel compiler processes (0: one per core)")
    progress_after: int = setting(
        "KILN_CPP_PROGRESS", 8, "show progress when compiling more kernels than this"
    )
    stream_bytes: int = setting(
        "KILN_CPP_STREAM_BYTES",
        -1,
        "a row-wise kernel writing more bytes than this writes its rows with non-temporal "
        "stores (-1: glibc memcpy's rule, 3/4 of each thread's share of the last-level cache; "
        "0: never). Changes the source, hence the cache key",
        affects_cache=True,
    )


settings: Settings[CppConfig] = Settings("kiln-cpp", CppConfig)


def read_cpp_config() -> CppConfig:
    """The settings in force now: scopes, then the environment, then defaults."""
    return settings.current()


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
