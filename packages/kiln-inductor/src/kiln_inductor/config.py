"""Typed settings of kiln-inductor, declared once in ``Config`` with kiln-shapes' settings
helper.

Each setting names its environment variable, its default, what it does, and whether it
changes the kernel cache key (``affects_cache``: settings that change generated code must).
``read_config()`` reads them when called (never a snapshot taken at import);
``settings.scope(name=value)`` overrides them for a block.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kiln_shapes.settings import Setting, Settings, cache_key, parse_set, setting


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kiln")


# torch.compile's modes and the options each sets: one table, read by kiln.compile and
# kiln_triton.compile_fx alike
MODES: dict[str | None, dict[str, bool]] = {
    None: {},
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune": {"max_autotune": True, "triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
}


@dataclass(frozen=True)
class Config:
    cache_dir: str = setting(
        "KILN_CACHE_DIR",
        "",
        "directory of the on-disk kernel cache (unset: $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)",
    )
    artifact_cache: bool = setting(
        "KILN_ARTIFACT_CACHE",
        True,
        "keep every compiled graph (wrapper, kernels, runtime plan) on disk under the cache "
        "directory, so that another process running the same graph skips tracing, lowering "
        "and code generation (runtime/artifacts.py); 0: compile every graph afresh",
    )
    regional_reuse: bool = setting(
        "KILN_REGIONAL_REUSE",
        True,
        "compile each repeated block of a graph (transformer layers, ResNet blocks, "
        "ModuleList loops: module calls that are the same computation over parameters of "
        "the same shapes) once and call it for every instance (regions.py); 0: compile "
        "each graph whole",
    )
    regional_reuse_gpu: bool = setting(
        "KILN_REGIONAL_REUSE_GPU",
        False,
        "apply regional reuse to graphs on CUDA devices too; off by default: on the H200 the "
        "stitched blocks ran HF GPT-2/LLaMA (bf16, large configs, batch 2 x 128) at 1.83x "
        "eager against 2.90x for whole graphs (per-block calls and lost fusion across block "
        "boundaries cost more than on the CPU, where reuse is on)",
    )
    log: str = setting(
        "KILN_LOG",
        "",
        "comma-separated log topics: graphs,kernels,timings,fallbacks,layouts,cache",
    )
    debug_dir: str = setting(
        "KILN_DEBUG_DIR", "", "when set, every graph, IR dump and kernel source is written here"
    )
    realize_ops_threshold: int = setting(
        "KILN_REALIZE_OPS",
        12,
        "a pointwise value read by several consumers is computed once into a buffer when its "
        "body holds at least this many ops (below it, it is recomputed in each consumer)",
        affects_cache=True,
    )
    realize_expensive: int = setting(
        "KILN_REALIZE_EXPENSIVE",
        2,
        "a pointwise value read by several consumers is computed once when its body holds at "
        "least this many transcendental ops (exp, log, tanh, erf, pow...)",
        affects_cache=True,
    )
    max_inline_ops: int = setting(
        "KILN_MAX_INLINE_OPS",
        120,
        "a pointwise body past this many ops is always realized",
        affects_cache=True,
    )
    channels_last_devices: str = setting(
        "KILN_CHANNELS_LAST",
        "",
        "comma-separated device types (cuda, cpu) on which graphs with 2-D convolutions run "
        "them, and the kernels between them, in channels-last layout (layout.py); 'auto': "
        "CUDA training graphs whose convolutions are 16-bit (bf16 autocast); off by default "
        "(H200 bf16 training A/B at b4b5c52: ConvNeXt-T 5% faster, ResNet-50 5% slower)",
        affects_cache=True,
    )
    prefetch_groups: int = setting(
        "KILN_PREFETCH_GROUPS",
        1,
        "collectives tagged with a collective group (kiln's FSDP graph: one group per "
        "sharded unit) start at most this many groups ahead of their first use, just "
        "before the wait of the group that many uses earlier (passes/collectives.py): 1 "
        "gathers the next unit while the current one computes; a negative value starts "
        "each as soon as its input exists",
        affects_cache=True,
    )
    cpu_collectives_in_flight: int = setting(
        "KILN_CPU_COLLECTIVES_IN_FLIGHT",
        1,
        "collectives over CPU tensors (gloo) in flight at once: with 1 each is waited on "
        "before the next starts, as torch 2.13's gloo corrupts its heap with several of "
        "different sizes in flight (passes/collectives.py; tools/gloo_inflight_repro.py "
        "checks a torch release); 0 leaves them where the schedule puts them",
        affects_cache=True,
    )
    check_indices: bool = setting(
        "KILN_CHECK_INDICES",
        True,
        "check every indirect access (gather, index, embedding) against its dimension and "
        "raise eager's error for a bad index (index_check.py); off: a little faster, but a "
        "bad index then reads or writes outside the tensor, as unchecked C++ would",
        affects_cache=True,
    )
    verify: bool = setting(
        "KILN_VERIFY",
        False,
        "check the IR after lowering and the schedule after fusion (verify.py); the test "
        "suites turn it on",
    )
    fallback_unlowered: bool = setting(
        "KILN_FALLBACK", True, "run ATen ops without a lowering eagerly (else raise)"
    )

    @property
    def log_topics(self) -> frozenset[str]:
        return parse_set(self.log)

    def cache_key_part(self) -> str:
        """The settings that change generated code, as a stable string."""
        return cache_key(self)


settings: Settings[Config] = Settings("kiln-inductor", Config)
SETTINGS: dict[str, Setting] = settings.declared


def read_config() -> Config:
    """The settings in force now: scopes, then the environment, then defaults."""
    return settings.current()


def cache_dir() -> Path:
    return Path(settings.cache_dir or _default_cache_dir())
