"""Which dimensions of a tensor input are symbolic.

Design note: "symbolic inputs"
------------------------------
A trace makes the size of an input dimension a symbol of its ShapeEnv (kiln-shapes) when

- the user marked it: ``mark_dynamic(t, dim, min=, max=)`` (any tensor the frame reads,
  with any ``dynamic`` setting, from the first compile on); ``mark_static(t, dim)``
  keeps a dimension specialized whatever else applies;
- ``dynamic=True``: every dimension of every tensor read from the frame's arguments
  (parameters, buffers and other tensors held by modules stay static);
- ``dynamic=None`` (automatic): the dimensions of such an argument whose size changed
  between two compiles of the same frame (``FrameShapes`` remembers, per frame and per
  source, the sizes seen and the dimensions that varied), from the recompile on.

Sizes 0 and 1 stay specialized (kiln-shapes), and so do the sizes of inputs that are not
dense (slices, expanded views): their strides are not products of their sizes.

Design note: "symbolic ints"
----------------------------
An int read from the frame's arguments (an argument itself, or an attribute or item of an
object passed in: the length a KV cache layer keeps as a Python int) becomes a symbol too:
with ``dynamic=True`` from the first compile, with ``dynamic=None`` once its value differed
between two compiles (``FrameShapes.int_varied``). The shape guard binds the symbol from
the int (``ShapeGuards.add_int``); the graph reads it as the size of a tensor input that
has it as a dimension, else as an int input of its own (a placeholder whose
``meta["val"]`` is the SymInt, which backends receive as a Python int). Python that needs
its value (``range(n)``, an index) specializes it with a guard, as for sizes. Ints held by
modules (configuration: head counts, strides) and by globals stay constants, as do 0 and 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from kiln_capture.sources import DictEntrySource, LocalSource, Source

DYNAMIC_ATTR = "_kiln_dynamic_dims"  # {dim: (min or None, max or None)}
STATIC_ATTR = "_kiln_static_dims"  # {dim, ...}


def _dims(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kiln: expected a tensor, got {type(t).__name__}")
    out = []
    for d in dim if isinstance(dim, list | tuple) else [dim]:
        if not isinstance(d, int) or not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"kiln: dimension {d!r} out of range for a {t.dim()}-d tensor")
        out.append(d % t.dim())
    return out


def mark_dynamic(
    t: torch.Tensor,
    dim: int | list[int] | tuple[int, ...],
    min: int | None = None,
    max: int | None = None,
) -> None:
    """Compile ``t``'s dimension(s) ``dim`` for every size in ``[min, max]`` (default
    ``[2, inf)``), from the first compile on. A call whose size falls outside the range
    misses the cache and compiles again (under ``fullgraph=True`` it raises)."""
    if min is not None and max is not None and min > max:
        raise ValueError(f"kiln.mark_dynamic: min ({min}) must be <= max ({max})")
    if min is not None and min < 0:
        raise ValueError(f"kiln.mark_dynamic: min ({min}) must be >= 0")
    marks = dict(getattr(t, DYNAMIC_ATTR, {}))
    for d in _dims(t, dim):
        marks[d] = (min, max)
    setattr(t, DYNAMIC_ATTR, marks)
    static = getattr(t, STATIC_ATTR, None)
    if static:
        setattr(t, STATIC_ATTR, static - marks.keys())


def mark_static(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Keep ``t``'s dimension(s) ``dim`` specialized, even with ``dynamic=True``."""
    dims = set(_dims(t, dim))
    setattr(t, STATIC_ATTR, set(getattr(t, STATIC_ATTR, set())) | dims)
    marks = getattr(t, DYNAMIC_ATTR, None)
    if marks:
        setattr(t, DYNAMIC_ATTR, {d: r for d, r in marks.items() if d not in dims})


@dataclass
class FrameShapes:
    """What earlier compiles of one frame saw: per source, the sizes (None where a size
    already varied). Automatic dynamic shapes read it and update it."""

    seen: dict[str, list[int | None]] = field(default_factory=dict)
    ints: dict[str, int | None] = field(default_factory=dict)  # None: it varied

    def changed_dims(self, source: str, t: torch.Tensor) -> list[int]:
        """The dimensions of ``t`` whose size differs from an earlier compile's; records
        the sizes for the next one."""
        shape = list(t.shape)
        before = self.seen.get(source)
        if before is None or len(before) != len(shape):
            self.seen[source] = list(shape)
            return []
        now: list[int | None] = [
            None if b is None or b != s else b for b, s in zip(before, shape, strict=True)
        ]
        self.seen[source] = now
        return [d for d, v in enumerate(now) if v is None]

    def int_varied(self, source: str, value: int) -> bool:
        """Whether the int read from ``source`` differed between earlier compiles and this
        one; records ``value`` for the next one."""
        if source not in self.ints:
            self.ints[source] = value
            return False
        before = self.ints[source]
        if before is not None and before != value:
            self.ints[source] = before = None
        return before is None


def from_frame_arguments(source: Source, module_sources: set[Source]) -> bool:
    """Whether ``source`` reads a value passed in the frame's arguments rather than one a
    module holds (parameters, buffers, attributes) or a global."""
    s: Source | None = source
    while s is not None:
        if s in module_sources:
            return False
        if isinstance(s, DictEntrySource) and s.table in ("_parameters", "_buffers"):
            return False
        if isinstance(s, LocalSource):
            return True
        s = getattr(s, "base", None)
    return False


def symbolic_dims(
    t: torch.Tensor,
    source: Source,
    mode: bool | None,
    frame_shapes: FrameShapes | None,
    module_sources: set[Source],
) -> tuple[list[int], dict[int, tuple[int | None, int | None]]]:
    """The dimensions of input ``t`` (read from ``source``) a trace makes symbolic, and
    the declared ranges among them (see the design note)."""
    declared: dict[int, tuple[int | None, int | None]] = dict(getattr(t, DYNAMIC_ATTR, {}) or {})
    static = set(getattr(t, STATIC_ATTR, ()) or ())
    dims = set(declared)
    if mode is not False and not isinstance(t, nn.Parameter):
        if from_frame_arguments(source, module_sources):
            if mode is True:
                dims |= set(range(t.dim()))
            elif frame_shapes is not None:
                dims |= set(frame_shapes.changed_dims(source.expr(), t))
    dims -= static
    return sorted(d for d in dims if d < t.dim()), {d: r for d, r in declared.items() if d in dims}


__all__ = ["FrameShapes", "mark_dynamic", "mark_static", "symbolic_dims"]
