"""Typed settings of kiln-inductor, read from the environment in one place.

Each setting names its environment variable, its default, what it does, and whether it
changes the kernel cache key (settings that change generated code must).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kiln")


@dataclass(frozen=True)
class Setting:
    env: str
    default: object
    help: str
    affects_cache: bool


SETTINGS: dict[str, Setting] = {
    "cache_dir": Setting(
        "KILN_CACHE_DIR",
        None,
        "directory of the on-disk kernel cache (default ~/.cache/kiln)",
        False,
    ),
    "log": Setting(
        "KILN_LOG",
        "",
        "comma-separated log topics: graphs,kernels,timings,fallbacks,layouts",
        False,
    ),
    "debug_dir": Setting(
        "KILN_DEBUG_DIR",
        "",
        "when set, every graph, IR dump and kernel source is written here",
        False,
    ),
    "realize_ops_threshold": Setting(
        "KILN_REALIZE_OPS",
        12,
        "a pointwise value read by several consumers is computed once into a buffer when its "
        "body holds at least this many ops (below it, it is recomputed in each consumer)",
        True,
    ),
    "realize_expensive": Setting(
        "KILN_REALIZE_EXPENSIVE",
        2,
        "a pointwise value read by several consumers is computed once when its body holds at "
        "least this many transcendental ops (exp, log, tanh, erf, pow...)",
        True,
    ),
    "max_inline_ops": Setting(
        "KILN_MAX_INLINE_OPS", 120, "a pointwise body past this many ops is always realized", True
    ),
    "channels_last_devices": Setting(
        "KILN_CHANNELS_LAST",
        "",
        "comma-separated device types (cuda, cpu) on which graphs with 2-D convolutions run "
        "them, and the kernels between them, in channels-last layout (layout.py); 'none': "
        "off. Off by default until measured a win (kernels loop in their output's memory "
        "order, so NHWC kernels are contiguous)",
        True,
    ),
    "check_indices": Setting(
        "KILN_CHECK_INDICES",
        True,
        "check every indirect access (gather, index, embedding) against its dimension and "
        "raise eager's error for a bad index (index_check.py); off: a little faster, but a "
        "bad index then reads or writes outside the tensor, as unchecked C++ would",
        True,
    ),
    "verify": Setting(
        "KILN_VERIFY",
        False,
        "check the IR after lowering and the schedule after fusion (verify.py); the test "
        "suites turn it on",
        False,
    ),
    "fallback_unlowered": Setting(
        "KILN_FALLBACK", True, "run ATen ops without a lowering eagerly (else raise)", False
    ),
}


# torch.compile's modes and the options each sets: one table, read by kiln.compile and
# kiln_triton.compile_fx alike
MODES: dict[str | None, dict[str, bool]] = {
    None: {},
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune": {"max_autotune": True, "triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
}


def _parse(setting: Setting, raw: str) -> object:
    if isinstance(setting.default, bool):
        return raw.lower() not in ("0", "false", "no", "off", "")
    if isinstance(setting.default, int):
        return int(raw)
    return raw


@dataclass(frozen=True)
class Config:
    cache_dir: str = field(default_factory=_default_cache_dir)
    log: str = ""
    debug_dir: str = ""
    realize_ops_threshold: int = 12
    realize_expensive: int = 2
    max_inline_ops: int = 120
    channels_last_devices: str = ""
    check_indices: bool = True
    verify: bool = False
    fallback_unlowered: bool = True

    @property
    def log_topics(self) -> frozenset[str]:
        return frozenset(t.strip() for t in self.log.split(",") if t.strip())

    def cache_key_part(self) -> str:
        """The settings that change generated code, as a stable string."""
        return ";".join(
            f"{f.name}={getattr(self, f.name)}"
            for f in fields(self)
            if SETTINGS[f.name].affects_cache
        )


def read_config() -> Config:
    """The configuration from the environment (the one place that reads it)."""
    values: dict[str, object] = {}
    for name, setting in SETTINGS.items():
        raw = os.environ.get(setting.env)
        if raw is not None and raw != "":
            values[name] = _parse(setting, raw)
    return Config(**values)


def cache_dir() -> Path:
    return Path(read_config().cache_dir)
