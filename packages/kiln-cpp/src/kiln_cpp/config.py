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


def read_cpp_config() -> CppConfig:
    env = os.environ
    return CppConfig(
        cxx=env.get("KILN_CPP_CXX") or os.environ.get("CXX") or "g++",
        flags=env.get("KILN_CPP_FLAGS") or DEFAULT_FLAGS,
        libs=env.get("KILN_CPP_LIBS") or "-lmvec -lm",
        workers=int(env.get("KILN_CPP_WORKERS") or 0),
        progress_after=int(env.get("KILN_CPP_PROGRESS") or 8),
    )
