"""The compiled backward, specialized for the strides its tangents really arrive with.

# Tangent layouts

The joint trace gives each tangent (the gradient of a forward output) the strides of that
output, usually contiguous. What autograd really hands the backward depends on the code
after the compiled graph: ``out.sum().backward()`` sends an expanded ``ones`` (every stride
0), a matmul on ``out.t()`` a transposed gradient. Making each such tangent contiguous (or
restriding it to the traced strides) is a full copy on every step. ``BackwardVariants``
compiles the backward once more for the strides that arrive (the first call with a new
set of tangent strides; at most ``LIMIT`` sets per plan), then reuses it: the bw graph's
kernels read each tangent with its real strides (an expanded ``ones`` is read with stride
0), no copy. Strides of size-1 dimensions are never read, so they never make a variant.

Kept only where every tangent's shape and strides are static ints; a plan loaded from an
artifact cache (no graph to compile again) or a variant that fails to compile falls back
to the old path (``contiguous()``), counted by ``tangent_copies()``.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from kiln_aot.fake import FakeTensor
from kiln_aot.log import log

LIMIT = 8  # variants per plan: past it, tangents are copied to the traced strides

_copies: Counter[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = Counter()


def tangent_copies() -> dict[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]], int]:
    """``(site, shape, strides given, strides expected) -> count`` of the tangents copied
    (made contiguous) before a compiled backward since ``reset_tangent_copies()``."""
    return dict(_copies)


def reset_tangent_copies() -> None:
    _copies.clear()


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def contiguous_tangent(t: torch.Tensor, k: int) -> torch.Tensor:
    """``t.contiguous()``, counted when it copies."""
    if t.is_contiguous():
        return t
    _copies[(f"tangent {k}", tuple(t.shape), tuple(t.stride()), _contiguous_strides(t.shape))] += 1
    return t.contiguous()


def restride_tangent(t: torch.Tensor, k: int, want: tuple[int, ...]) -> torch.Tensor:
    """``t`` with strides ``want`` (those of size-1 dimensions aside), counted when copied."""
    if all(n <= 1 or a == b for n, a, b in zip(t.shape, t.stride(), want)):
        return t
    _copies[(f"tangent {k}", tuple(t.shape), tuple(t.stride()), want)] += 1
    return torch.empty_strided(t.shape, want, dtype=t.dtype, device=t.device).copy_(t)


def _static(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and all(type(s) is int for s in (*v.shape, *v.stride()))


class BackwardVariants:
    """The backward graph kept uncompiled (a copy taken before its compiler changes it),
    and the backward compiled per set of tangent strides."""

    def __init__(self, bw_gm: fx.GraphModule, compiler: Callable, num_tangents: int):
        self.gm = copy.deepcopy(bw_gm)
        self.compiler = compiler
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.tangent_nodes = placeholders[len(placeholders) - num_tangents :]
        vals = [n.meta.get("val") for n in self.tangent_nodes]
        self.shapes = tuple(tuple(v.shape) for v in vals)
        self.expected = tuple(tuple(v.stride()) for v in vals)  # what the first bw reads
        self.variants: dict[tuple[tuple[int, ...], ...], Callable | None] = {}

    @staticmethod
    def for_graph(
        bw_gm: fx.GraphModule, compiler: Callable, num_tangents: int
    ) -> BackwardVariants | None:
        """Variants for ``bw_gm``, or None when a tangent has symbolic sizes or strides."""
        placeholders = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
        tangents = placeholders[len(placeholders) - num_tangents :] if num_tangents else []
        if not tangents or not all(_static(n.meta.get("val")) for n in tangents):
            return None
        return BackwardVariants(bw_gm, compiler, num_tangents)

    def key(self, tangents: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
        """The tangents' strides, with the traced stride for each dimension of size 1."""
        out = []
        for t, want in zip(tangents, self.expected):
            out.append(tuple(w if n == 1 else s for n, s, w in zip(t.shape, t.stride(), want)))
        return tuple(out)

    def select(self, tangents: Sequence[torch.Tensor]) -> Callable | None:
        """The backward compiled for these tangents' strides (compiled on first sight);
        None when there is none (over ``LIMIT``, or it failed to compile)."""
        key = self.key(tangents)
        if key in self.variants:
            return self.variants[key]
        if len(self.variants) >= LIMIT:
            return None
        self.variants[key] = self._compile(key, tangents)
        return self.variants[key]

    def _compile(self, key: tuple, tangents: Sequence[torch.Tensor]) -> Callable | None:
        gm = copy.deepcopy(self.gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        first = len(placeholders) - len(key)
        for node, t, stride in zip(placeholders[first:], tangents, key):
            meta = torch.empty_strided(t.shape, stride, dtype=t.dtype, device="meta")
            node.meta["val"] = FakeTensor(meta, t.device)
        log(
            "recompiles",
            f"backward compiled again for tangent strides {key} (traced: {self.expected})",
        )
        inputs = [n.meta.get("val") for n in placeholders]
        try:
            return self.compiler(gm, inputs)
        except Exception as e:  # the traced backward still serves, with copies
            log("recompiles", f"the backward for tangent strides {key} failed to compile: {e}")
            return None
