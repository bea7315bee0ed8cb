"""Typed settings of kiln-aot, read from the environment in one place (``read_config``).

Each setting names its environment variable, default, meaning and whether it changes
compiled graphs (and so belongs in any cache key built from them). Tests override settings
with ``override(...)``, a scoped context manager.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    env: str
    default: object
    help: str
    affects_graphs: bool


SETTINGS: dict[str, Setting] = {
    "decompose_dropout": Setting(
        "KILN_AOT_DECOMPOSE_DROPOUT",
        False,
        "decompose aten.native_dropout into rand/gt/mul (kernels fuse it) instead of keeping it "
        "(bit-identical masks with eager under the same seed); the mask is saved for backward either way",
        affects_graphs=True,
    ),
    "fused_attention": Setting(
        "KILN_AOT_FUSED_ATTENTION",
        True,
        "scaled_dot_product_attention keeps the fused kernel the dispatcher picks for the inputs "
        "(flash, memory-efficient, cuDNN) as one extern op, its *_backward op in the backward; "
        "off: attention is decomposed to matmuls, softmax and dropout (the math backend)",
        affects_graphs=True,
    ),
    "efficient_attention": Setting(
        "KILN_AOT_EFFICIENT_ATTENTION",
        True,
        "with fused_attention, also keep CUDA's memory-efficient kernel (the fp32 choice); "
        "off: it is traced as math (matmuls, softmax)",
        affects_graphs=True,
    ),
    "recompute_reduction_numel": Setting(
        "KILN_AOT_RECOMPUTE_REDUCTION_NUMEL",
        4096,
        "min_cut_partition may recompute a reduction in the backward only when its input has at most this many elements",
        affects_graphs=True,
    ),
    "debug_dir": Setting(
        "KILN_DEBUG_DIR",
        "",
        "when set, each compilation writes its graphs here: aot<N>/aot.inference.py, or aot.joint.py, aot.fw.py, aot.bw.py and aot.partition.txt",
        affects_graphs=False,
    ),
    "log": Setting(
        "KILN_LOG",
        "",
        "comma-separated log topics; kiln-aot reads: graphs (ATen graphs), partition (saved tensors), timings",
        affects_graphs=False,
    ),
}


@dataclass(frozen=True)
class AotConfig:
    decompose_dropout: bool = False
    fused_attention: bool = True
    efficient_attention: bool = True
    recompute_reduction_numel: int = 4096
    debug_dir: str = ""
    log: frozenset[str] = frozenset()


def _parse(setting: Setting, raw: str) -> object:
    if isinstance(setting.default, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(setting.default, int):
        return int(raw)
    return raw


def read_config(environ: dict[str, str] | None = None) -> AotConfig:
    """Build the configuration from the environment (the only place it is read)."""
    environ = dict(os.environ) if environ is None else environ
    values: dict[str, object] = {}
    for name, setting in SETTINGS.items():
        raw = environ.get(setting.env)
        if raw is None:
            continue
        values[name] = _parse(setting, raw)
    if "log" in values:
        values["log"] = frozenset(t.strip() for t in str(values["log"]).split(",") if t.strip())
    return AotConfig(**values)  # type: ignore[arg-type]


config: AotConfig = read_config()


@contextlib.contextmanager
def override(**changes: object) -> Iterator[AotConfig]:
    """Temporarily replace settings (tests): ``with override(decompose_dropout=True): ...``."""
    global config
    old = config
    config = dataclasses.replace(old, **changes)  # type: ignore[arg-type]
    try:
        yield config
    finally:
        config = old


def current() -> AotConfig:
    """The settings in force now (honours ``override``)."""
    return config
