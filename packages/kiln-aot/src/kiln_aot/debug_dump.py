"""The debug directory (``KILN_DEBUG_DIR``): one folder per compilation, one file per stage,
named like the stages: ``aot.inference.py``, ``aot.joint.py``, ``aot.fw.py``, ``aot.bw.py``,
``aot.partition.txt`` (the saved tensors and their bytes)."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torch import fx

from kiln_aot import config

_counter = itertools.count()


class DebugDump:
    """Writes one compilation's stages; does nothing when no debug directory is set."""

    def __init__(self) -> None:
        root = config.current().debug_dir
        self.folder = Path(root) / f"aot{next(_counter)}" if root else None

    def graph(self, stage: str, gm: fx.GraphModule) -> None:
        self.text(f"{stage}.py", f"# kiln_aot stage: {stage}\n{gm.code}")

    def text(self, name: str, text: str) -> None:
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / name).write_text(text)


def partition_report(fw: fx.GraphModule, num_fwd_outputs: int) -> str:
    saved = list(fw.graph.output_node().args[0])[num_fwd_outputs:]
    lines, total = [], 0
    for n in saved:
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):  # an int (a size symbol the backward binds)
            lines.append(f"{n.name:<32} {type(val).__name__} {val}")
            continue
        size = val.numel() * val.element_size()
        total += size
        lines.append(f"{n.name:<32} {tuple(val.shape)!s:<24} {val.dtype!s:<16} {size} bytes")
    return "\n".join([f"saved {len(saved)} tensors, {total} bytes", *lines]) + "\n"
