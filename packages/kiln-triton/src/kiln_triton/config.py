"""Typed settings of kiln-triton, declared once in ``TritonConfig`` with kiln-shapes'
settings helper.

Each setting names its environment variable, its default, what it does, and whether it
changes generated code (and so the kernel cache key). ``read_triton_config()`` reads them
when called (never a snapshot taken at import; the runtime reads them when it builds a
kernel's launcher, not per launch); ``settings_scope`` overrides them for one compilation
(``compile_fx``'s ``mode``/``options``) or one test.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

from kiln_shapes.settings import Settings, cache_key, setting


@dataclass(frozen=True)
class TritonConfig:
    persistent_max: int = setting(
        "KILN_TRITON_PERSISTENT_MAX",
        8192,
        "rows up to this many elements are reduced by one block (persistent reductions); "
        "longer rows loop",
        affects_cache=True,
    )
    autotune: bool = setting(
        "KILN_TRITON_AUTOTUNE", True, "benchmark launch configurations on first call (GPU only)"
    )
    max_autotune: bool = setting(
        "KILN_TRITON_MAX_AUTOTUNE",
        False,
        "try every candidate configuration, not only the few heuristically best ones "
        '(mode="max-autotune" sets it)',
    )
    cudagraphs: bool = setting(
        "KILN_TRITON_CUDAGRAPHS",
        False,
        'replay compiled graphs as CUDA graphs (mode="reduce-overhead")',
    )
    compile_workers: int = setting(
        "KILN_TRITON_COMPILE_WORKERS",
        8,
        "threads compiling kernels ahead of the first call (0: off)",
    )
    direct_launch: bool = setting(
        "KILN_TRITON_DIRECT_LAUNCH",
        True,
        "after a kernel's first launch, launch it through its compiled launcher directly, "
        "skipping Triton's per-call argument binding",
    )
    c_launch: bool = setting(
        "KILN_TRITON_C_LAUNCH",
        True,
        "direct launches of kernels taking only tensors go through kiln_triton._launch "
        "(cuLaunchKernel from C, ~1 us) rather than Triton's Python launcher (5-10 us)",
    )

    def cache_key_part(self) -> str:
        return cache_key(self)


settings: Settings[TritonConfig] = Settings("kiln-triton", TritonConfig)


def read_triton_config() -> TritonConfig:
    """The configuration: the innermost scope, then the environment, then defaults."""
    return settings.current()


def settings_scope(**values: object) -> AbstractContextManager[TritonConfig]:
    """Override settings inside a ``with`` block (nestable); yields the settings there."""
    return settings.scope(**values)
