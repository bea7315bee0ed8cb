"""Layout copies: every copy a compiled graph makes because a tensor came with other strides
than its kernels index it by, counted by where and why.

Two places copy: ``CompiledGraph.__call__`` (a graph input whose static strides differ from
the compiled ones) and the wrapper's ``restride`` (an input with symbolic strides, or a
library op that returned other strides than its meta kernel said). Each copy is a full read
and write of the tensor on every call, so tests and benchmarks count them:
``layout_copies()`` maps each distinct ``LayoutCopy`` (site, shape, strides given and
expected, bytes) to how often it happened since ``reset_layout_copies()``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayoutCopy:
    site: str  # "graph3 input 5", "aten.mm.default -> buf7"
    shape: tuple[int, ...]
    given: tuple[int, ...]  # the strides the tensor came with
    expected: tuple[int, ...]  # the strides the kernels index it by
    nbytes: int


_counts: Counter[LayoutCopy] = Counter()


def record_layout_copy(site: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    """Count one copy of ``t`` into ``expected`` strides at ``site``."""
    nbytes = t.numel() * t.element_size()
    _counts[LayoutCopy(site, tuple(t.shape), tuple(t.stride()), tuple(expected), nbytes)] += 1


def layout_copies() -> dict[LayoutCopy, int]:
    """Each distinct layout copy since the last reset, with how many times it was made."""
    return dict(_counts)


def reset_layout_copies() -> None:
    _counts.clear()
