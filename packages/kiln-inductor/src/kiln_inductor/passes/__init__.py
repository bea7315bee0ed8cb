"""The FX graph passes that run on an ATen graph before lowering, in one ordered registry.

Each pass is a named function ``(gm, device) -> result`` that rewrites ``gm`` in place (and
leaves every node's ``meta['val']`` right); ``run_passes`` runs them in order, logs each
under ``KILN_LOG=passes`` and, with a debug directory, writes the graph after each pass
(``passes/<k>_<name>.py``). ``GraphLowering`` runs the registry, then only lowers.

| pass | module | what holds after it |
|---|---|---|
| ``fill_meta`` | ``meta.py`` | every node has ``meta['val']`` |
| ``cse`` | ``cse.py`` | common subexpressions merged |
| ``broadcast_bmm`` | ``broadcast_bmm.py`` | ``bmm`` with a batch-broadcast weight is one ``mm`` |
| ``patch_conv`` | ``patch_conv.py`` | patch convolutions (kernel == stride) and their backward are matmuls (CPU) |
| ``depthwise_layout`` | ``depthwise_layout.py`` | depthwise convolutions read channels-last operands (CPU) |
| ``matmul_bias`` | ``matmul_bias.py`` | bias adds only library kernels read, or kept in memory anyway, are back in ``addmm`` |
| ``layout`` | ``layout.py`` | channels-last where configured (result: whether it applied) |
| ``collectives`` | ``collectives.py`` | collectives start after their inputs (grouped ones at most ``KILN_PREFETCH_GROUPS`` groups ahead of their use), their waits come before their first reader |

``readers.py`` (not a pass) says which kernels read a node's value, through views: library
kernels only (``matmul_bias``) or at least one (``GraphLowering.lower_node`` realizes such
a value once for every reader).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx

from .. import log
from ..backend import registered_backends
from .broadcast_bmm import fold_broadcast_bmm
from .collectives import schedule_collectives
from .cse import eliminate_common_subexpressions
from .depthwise_layout import depthwise_channels_last
from .layout import is_channels_last, to_channels_last
from .matmul_bias import fold_matmul_bias
from .meta import fill_meta
from .node_builder import NodeBuilder, finish_pass, traced_tensor
from .patch_conv import rewrite_patch_convolutions


def matmul_templates(device: torch.device) -> bool:
    """Whether the device's backend now fuses matmuls with their epilogues (its
    ``matmul_templates()``, kiln-triton's max-autotune)."""
    backend = registered_backends().get(device.type)
    probe = getattr(backend, "matmul_templates", None)
    return bool(probe()) if probe is not None else False


@dataclass(frozen=True)
class GraphPass:
    name: str
    run: Callable[[torch.fx.GraphModule, torch.device], Any]


PASSES: list[GraphPass] = [
    GraphPass("fill_meta", lambda gm, device: fill_meta(gm)),
    GraphPass("cse", lambda gm, device: eliminate_common_subexpressions(gm)),
    GraphPass("broadcast_bmm", lambda gm, device: fold_broadcast_bmm(gm)),
    GraphPass("patch_conv", rewrite_patch_convolutions),
    GraphPass("depthwise_layout", depthwise_channels_last),
    GraphPass("matmul_bias", lambda gm, device: fold_matmul_bias(gm, matmul_templates(device))),
    GraphPass("layout", to_channels_last),
    GraphPass("collectives", lambda gm, device: schedule_collectives(gm)),
]


def run_passes(
    gm: torch.fx.GraphModule, device: torch.device, debug_dir: Path | None = None
) -> dict[str, Any]:
    """Run every registered pass on ``gm`` in order; returns each pass's result by name."""
    results: dict[str, Any] = {}
    for k, p in enumerate(PASSES):
        t0 = time.perf_counter()
        results[p.name] = p.run(gm, device)
        log.log("passes", f"{p.name}: {results[p.name]!r} ({time.perf_counter() - t0:.4f}s)")
        if debug_dir is not None:
            folder = debug_dir / "passes"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{k}_{p.name}.py").write_text(gm.code)
    return results


__all__ = [
    "PASSES",
    "GraphPass",
    "NodeBuilder",
    "fill_meta",
    "finish_pass",
    "is_channels_last",
    "run_passes",
    "traced_tensor",
]
