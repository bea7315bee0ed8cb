"""Typed settings of kiln-aot, declared once in ``AotConfig`` with kiln-shapes' settings helper.

Each setting names its environment variable, default, meaning and whether it changes
compiled graphs (``affects_cache``: it belongs in any cache key built from them). They are
read when asked for, never at import: ``current()`` gives them all, ``settings.<name>`` one
(so ``KILN_DEBUG_DIR`` set around one compilation, as ``kiln.compile(options=...)`` does,
is honoured). Tests override them with ``override(...)``, a scoped context manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

from kiln_shapes.settings import Setting, Settings, setting


@dataclass(frozen=True)
class AotConfig:
    decompose_dropout: bool = setting(
        "KILN_AOT_DECOMPOSE_DROPOUT",
        False,
        "decompose aten.native_dropout into rand/gt/mul (kernels fuse it) instead of keeping it "
        "(bit-identical masks with eager under the same seed); the mask is saved for backward either way",
        affects_cache=True,
    )
    fused_attention: bool = setting(
        "KILN_AOT_FUSED_ATTENTION",
        True,
        "scaled_dot_product_attention keeps the fused kernel the dispatcher picks for the inputs "
        "(flash, memory-efficient, cuDNN) as one extern op, its *_backward op in the backward; "
        "off: attention is decomposed to matmuls, softmax and dropout (the math backend)",
        affects_cache=True,
    )
    efficient_attention: bool = setting(
        "KILN_AOT_EFFICIENT_ATTENTION",
        True,
        "with fused_attention, also keep CUDA's memory-efficient kernel (the fp32 choice); "
        "off: it is traced as math (matmuls, softmax)",
        affects_cache=True,
    )
    recompute_reduction_numel: int = setting(
        "KILN_AOT_RECOMPUTE_REDUCTION_NUMEL",
        4096,
        "min_cut_partition may recompute a reduction in the backward only when its input has at most this many elements",
        affects_cache=True,
    )
    debug_dir: str = setting(
        "KILN_DEBUG_DIR",
        "",
        "when set, each compilation writes its graphs here: aot<N>/aot.inference.py, or aot.joint.py, aot.fw.py, aot.bw.py and aot.partition.txt",
    )
    log: frozenset[str] = setting(
        "KILN_LOG",
        frozenset(),
        "comma-separated log topics; kiln-aot reads: graphs (ATen graphs), partition (saved tensors), timings",
    )


settings: Settings[AotConfig] = Settings("kiln-aot", AotConfig)
SETTINGS: dict[str, Setting] = settings.declared


def read_config(environ: Mapping[str, str] | None = None) -> AotConfig:
    """The settings ``environ`` (default: the process environment, now) gives; no overrides."""
    return settings.read(environ)


def current() -> AotConfig:
    """The settings in force now: ``override`` scopes, then the environment, then defaults."""
    return settings.current()


def override(**changes: object) -> AbstractContextManager[AotConfig]:
    """Temporarily replace settings (tests): ``with override(decompose_dropout=True): ...``;
    nestable, restored on exit."""
    return settings.scope(**changes)


def __getattr__(name: str) -> AotConfig:
    if name == "config":  # once a snapshot taken at import; now the settings in force
        return current()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
