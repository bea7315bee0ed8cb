"""Typed settings of kiln-triton, read from the environment in one place.

Each setting names its environment variable, its default, what it does, and whether it
changes generated code (and so the kernel cache key). ``settings_scope`` overrides them
for one compilation (``compile_fx``'s ``mode``/``options``) or one test.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class TritonConfig:
    # KILN_TRITON_PERSISTENT_MAX: rows up to this many elements are reduced by one block
    # (persistent reductions); longer rows loop. Changes generated code.
    persistent_max: int = 8192
    # KILN_TRITON_AUTOTUNE: benchmark launch configurations on first call (GPU only).
    autotune: bool = True
    # KILN_TRITON_MAX_AUTOTUNE: try every candidate configuration, not only the few
    # heuristically best ones (mode="max-autotune" sets it).
    max_autotune: bool = False
    # KILN_TRITON_CUDAGRAPHS: replay compiled graphs as CUDA graphs (mode="reduce-overhead").
    cudagraphs: bool = False
    # KILN_TRITON_COMPILE_WORKERS: threads compiling kernels ahead of the first call (0: off).
    compile_workers: int = 8
    # KILN_TRITON_DIRECT_LAUNCH: after a kernel's first launch, launch it through its
    # compiled launcher directly, skipping Triton's per-call argument binding (0: off).
    direct_launch: bool = True
    # KILN_TRITON_C_LAUNCH: direct launches of kernels taking only tensors go through
    # kiln_triton._launch (cuLaunchKernel from C, ~1 us) rather than Triton's Python
    # launcher (5-10 us); 0: off.
    c_launch: bool = True

    def cache_key_part(self) -> str:
        return f"persistent_max={self.persistent_max}"


_ENV = {
    "persistent_max": "KILN_TRITON_PERSISTENT_MAX",
    "autotune": "KILN_TRITON_AUTOTUNE",
    "max_autotune": "KILN_TRITON_MAX_AUTOTUNE",
    "cudagraphs": "KILN_TRITON_CUDAGRAPHS",
    "compile_workers": "KILN_TRITON_COMPILE_WORKERS",
    "direct_launch": "KILN_TRITON_DIRECT_LAUNCH",
    "c_launch": "KILN_TRITON_C_LAUNCH",
}
_override: contextvars.ContextVar[dict[str, object] | None] = contextvars.ContextVar(
    "kiln_triton_settings", default=None
)


def _parse(default: object, raw: str) -> object:
    if isinstance(default, bool):
        return raw.lower() not in ("0", "false", "no", "off", "")
    if isinstance(default, int):
        return int(raw)
    return raw


def read_triton_config() -> TritonConfig:
    """The configuration: defaults, then the environment, then the innermost scope."""
    base = TritonConfig()
    values: dict[str, object] = {}
    for f in fields(TritonConfig):
        raw = os.environ.get(_ENV[f.name])
        if raw:
            values[f.name] = _parse(getattr(base, f.name), raw)
    values.update(_override.get() or {})
    return replace(base, **values)


@contextmanager
def settings_scope(**values: object) -> Iterator[TritonConfig]:
    unknown = set(values) - set(_ENV)
    if unknown:
        raise TypeError(f"unknown kiln-triton settings: {sorted(unknown)}")
    token = _override.set({**(_override.get() or {}), **values})
    try:
        yield read_triton_config()
    finally:
        _override.reset(token)
