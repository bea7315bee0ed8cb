"""The compiled backward, compiled when first called, for the strides its tangents really
arrive with.

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

Kept only where every tangent's shape and strides are static ints (otherwise the backward
is compiled with the forward, and tangents are made contiguous, counted by
``tangent_copies()``). A variant that fails to compile, or one past ``LIMIT``, runs the
backward compiled for the traced strides (or, where there is no graph to compile it
from, any compiled one) on tangents copied to its strides, counted too.

# Lazy compilation

Nothing is compiled for the backward when the forward is: the first backward call
compiles it for the strides that arrive (``.sum().backward()`` never needs the traced
strides, and compiling for them was half of HF GPT-2's training compile time). A
compiler that must have its backward before the first step (kiln-triton's CUDA graph
runners: a backward compiled and autotuned inside a user's capture of the step would
fail there) sets ``kiln_eager_backward = True`` on itself: ``compile_traced()`` then runs
with the forward, as before.

# Persistence

``state()`` is plain data (``graph_data.py``: the uncompiled graph, no pickled code) and
the keys of the compiled variants, whose compiled graphs a cache stores beside it;
``restore()`` rebuilds the variants from them. A process that loads them runs the
stored variants as they are and compiles new tangent strides from the stored graph;
``on_compiled`` (set by ``aot_graph`` for its plan store) is called after each variant
compiled, so the cache entry gains it.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from kiln_shapes.compiling import compiler_running
from torch import fx

from kiln_aot.fake import FakeTensor
from kiln_aot.graph_data import graph_data, graph_from_data
from kiln_aot.log import log

LIMIT = 8  # variants per plan besides the traced strides': past it, tangents are copied

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


Key = tuple[tuple[int, ...], ...]


def _dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Strides that lay out ``shape`` without gaps or overlaps (a permutation of
    contiguous ones; dimensions of size 1 aside)."""
    expect = 1
    dims = sorted((st, n) for n, st in zip(shape, stride) if n != 1)
    for st, n in dims:
        if st != expect:
            return False
        expect *= n
    return True


class BackwardVariants:
    """The backward graph kept uncompiled, and the backward compiled per set of tangent
    strides (module docstring)."""

    def __init__(
        self,
        gm: fx.GraphModule | None,
        compiler: Callable | None,
        shapes: Key,
        expected: Key,
        compiled: dict[Key, Callable] | None = None,
    ):
        self.gm = gm  # never compiled itself: each variant compiles a copy
        self.compiler = compiler
        self.shapes = shapes
        self.expected = expected  # the traced strides
        self.variants: dict[Key, Callable] = dict(compiled or {})
        self.failed: set[Key] = set()
        self.on_compiled: Callable[[], None] | None = None
        # the strides of the saved values the compiled forward really returns (None where
        # not a tensor), noted on its first call: the backward is compiled for them
        self.saved_strides: tuple[tuple[int, ...] | None, ...] | None = None

    def note_saved(self, saved: Sequence[Any]) -> None:
        """Remember the strides of the saved values the forward returned (once): a library
        op may return another layout than traced (kiln-inductor's channels-last depthwise
        convolutions on CPU), and a backward compiled for the traced strides would copy
        such a value on every call."""
        self.saved_strides = tuple(
            tuple(t.stride()) if isinstance(t, torch.Tensor) else None for t in saved
        )

    @staticmethod
    def for_graph(
        bw_gm: fx.GraphModule, compiler: Callable, num_tangents: int
    ) -> BackwardVariants | None:
        """Variants for ``bw_gm``, or None when a tangent has symbolic sizes or strides."""
        placeholders = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
        tangents = placeholders[len(placeholders) - num_tangents :] if num_tangents else []
        vals = [n.meta.get("val") for n in tangents]
        if not tangents or not all(_static(v) for v in vals):
            return None
        shapes = tuple(tuple(v.shape) for v in vals)
        expected = tuple(tuple(v.stride()) for v in vals)
        return BackwardVariants(bw_gm, compiler, shapes, expected)

    def key(self, tangents: Sequence[torch.Tensor]) -> Key:
        """The tangents' strides, with the traced stride for each dimension of size 1."""
        out = []
        for t, want in zip(tangents, self.expected):
            out.append(tuple(w if n == 1 else s for n, s, w in zip(t.shape, t.stride(), want)))
        return tuple(out)

    def backward_for(self, tangents: list[torch.Tensor]) -> tuple[Callable, list[torch.Tensor]]:
        """The backward for these tangents (compiled on first sight of their strides), and
        the tangents it takes: as they are, or copied to the strides of the backward that
        serves them when none could be compiled for theirs."""
        key = self.key(tangents)
        bw = self.variants.get(key)
        if bw is None and self._may_compile(key):
            bw = self.compile_traced() if key == self.expected else self._try_compile(key)
        if bw is not None:
            return bw, tangents
        want, bw = self._fallback()
        return bw, [restride_tangent(t, k, want[k]) for k, t in enumerate(tangents)]

    def compile_traced(self) -> Callable:
        """The backward for the traced strides, compiled now if it is not yet; raises what
        its compiler raises (nothing else can run the backward)."""
        bw = self.variants.get(self.expected)
        if bw is None:
            bw = self._compile(self.expected)
        return bw

    def _may_compile(self, key: Key) -> bool:
        if self.gm is None or self.compiler is None or key in self.failed:
            return False
        others = len(self.variants) - (self.expected in self.variants)
        return key == self.expected or others < LIMIT

    def _try_compile(self, key: Key) -> Callable | None:
        try:
            return self._compile(key)
        except Exception as e:  # the traced strides' backward still serves, with copies
            log("recompiles", f"the backward for tangent strides {key} failed to compile: {e}")
            self.failed.add(key)
            return None

    def _fallback(self) -> tuple[Key, Callable]:
        if self.expected in self.variants or (self.gm is not None and self.compiler is not None):
            return self.expected, self.compile_traced()
        if not self.variants:
            raise RuntimeError("kiln_aot: a backward with no compiled graph and none to compile")
        return next(iter(self.variants.items()))

    def _compile(self, key: Key) -> Callable:
        assert self.gm is not None and self.compiler is not None
        gm = copy.deepcopy(self.gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        first = len(placeholders) - len(key)
        if key != self.expected:
            for node, stride in zip(placeholders[first:], key):
                v = node.meta["val"]
                meta = torch.empty_strided(v.shape, stride, dtype=v.dtype, device="meta")
                node.meta["val"] = FakeTensor(meta, v.device)
            log(
                "recompiles",
                f"backward compiled for tangent strides {key} (traced: {self.expected})",
            )
        self._adopt_saved_strides(placeholders[:first])
        inputs = [n.meta.get("val") for n in placeholders]
        with compiler_running():  # maybe inside a captured frame's backward (kiln_shapes.compiling)
            bw = self.compiler(gm, inputs)
            self.variants[key] = bw
            if self.on_compiled is not None:  # the artifact cache's save (pickling sympy)
                self.on_compiled()
        return bw

    def _adopt_saved_strides(self, placeholders: Sequence[fx.Node]) -> None:
        strides = self.saved_strides
        if strides is None or len(strides) != len(placeholders):
            return
        for node, stride in zip(placeholders, strides):
            v = node.meta.get("val")
            if stride is None or not _static(v) or tuple(v.stride()) == stride:
                continue
            if not _dense(v.shape, stride):
                continue
            meta = torch.empty_strided(v.shape, stride, dtype=v.dtype, device="meta")
            node.meta["val"] = FakeTensor(meta, v.device)
            log("recompiles", f"backward reads saved {node.name} with strides {stride}")

    # -- persistence (module docstring) ------------------------------------------------------

    def state(self) -> tuple[dict[str, Any], list[Callable]]:
        """Plain data, and the compiled variants in the order of its ``keys``."""
        keys = list(self.variants)
        data = {
            "shapes": self.shapes,
            "expected": self.expected,
            "keys": keys,
            "graph": graph_data(self.gm) if self.gm is not None else None,
        }
        return data, [self.variants[k] for k in keys]

    @staticmethod
    def restore(data: dict[str, Any], compiled: Sequence[Callable]) -> BackwardVariants:
        """The variants ``state()`` described; the compiler is the loader's to set."""
        gm = graph_from_data(data["graph"]) if data["graph"] is not None else None
        variants = dict(zip((tuple(map(tuple, k)) for k in data["keys"]), compiled))
        return BackwardVariants(gm, None, data["shapes"], data["expected"], variants)
