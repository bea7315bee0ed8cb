"""The options `kiln.compile(..., options={...})` accepts.

Each option is declared once, typed, with its help text and whether it changes what
gets compiled (``affects_cache``: a different value must never reuse a kernel built
under another). Unknown keys and wrong types are rejected with the list of valid keys,
as `torch.compile` does.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from kiln.errors import InvalidOption
from kiln_inductor.config import MODES  # the one table of modes


@dataclass(frozen=True)
class Option:
    name: str
    type: type | tuple[type, ...]
    default: Any
    help: str
    affects_cache: bool


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option(
            "raise_on_error",
            bool,
            False,
            "raise compiler errors instead of falling back to eager for the failing graph",
            False,
        ),
        Option(
            "debug_dir",
            (str, type(None)),
            None,
            "write every captured graph, ATen graph, IR dump and kernel source under this folder",
            False,
        ),
        Option(
            "check_indices",
            bool,
            True,
            "check every indirect access (gather, indexing, embedding) in generated kernels and "
            "raise eager's error for a bad index; False skips the checks",
            True,
        ),
        Option(
            "artifact_cache",
            bool,
            True,
            "keep compiled graphs on disk (KILN_ARTIFACT_CACHE) so that another process "
            "running the same graph skips tracing, lowering and code generation; False "
            "compiles afresh and saves nothing",
            False,
        ),
        Option(
            "regional_reuse",
            bool,
            True,
            "compile each repeated block (transformer layers, ResNet blocks, ModuleList "
            "loops) once and reuse it for every instance (KILN_REGIONAL_REUSE); False "
            "compiles each graph whole. On CUDA devices only with regional_reuse_gpu",
            False,
        ),
        Option(
            "regional_reuse_gpu",
            bool,
            False,
            "apply regional reuse to graphs on CUDA devices too (KILN_REGIONAL_REUSE_GPU): "
            "faster compiles, slower steady state (whole graphs fuse across blocks and make "
            "fewer host calls)",
            False,
        ),
        Option(
            "triton.cudagraphs",
            bool,
            False,
            "replay the compiled wrapper as a CUDA graph (set by mode='reduce-overhead')",
            True,
        ),
        Option(
            "fsdp_graph",
            bool,
            True,
            "compile a fully_shard (FSDP2) model whole as one graph with its all-gathers and "
            "reduce-scatters as graph nodes where FSDP's options allow (kiln/fsdp_graph.py); "
            "False runs each unit's forward as a region between FSDP's own eager hooks",
            False,
        ),
        Option(
            "max_autotune",
            bool,
            False,
            "autotune launch configs and matmul templates (set by mode='max-autotune')",
            True,
        ),
    )
}


def resolve_options(mode: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """Defaults, then the mode's settings, then the user's options; all validated."""
    if mode not in MODES:
        valid = ", ".join(repr(m) for m in MODES if m is not None)
        raise RuntimeError(f"Unrecognized mode={mode!r}, should be one of: {valid}")
    if mode is not None and options:
        # torch.compile refuses both together; so do we, with the same wording's intent.
        raise RuntimeError("Either mode or options can be specified, but both can't be specified")
    resolved = {name: o.default for name, o in OPTIONS.items()}
    resolved.update(MODES[mode])
    for key, value in (options or {}).items():
        if key not in OPTIONS:
            near = difflib.get_close_matches(key, OPTIONS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise InvalidOption(
                f"Unexpected optimization option {key}{hint}; known options: "
                + ", ".join(sorted(OPTIONS))
            )
        if not isinstance(value, OPTIONS[key].type):
            raise InvalidOption(
                f"option {key!r} takes {OPTIONS[key].type}, got {type(value).__name__}"
            )
        resolved[key] = value
    return resolved
