"""The loop-level IR: layouts, buffers, pointwise and reduction bodies, views, extern calls.

Lowering produces *values* (``TensorValue``): a ``Pointwise`` is an unrealized function of
an index; a ``View`` remaps the index of another value (no copy); a ``StorageView`` reads a
realized ``Buffer`` through a strided ``Layout``. A value becomes a buffer (realized) when a
reduction, an extern kernel, a graph output or a costly multi-use needs it in memory.

The scheduler sees *nodes*: ``ComputedBuffer`` (a buffer computed by a ``Pointwise`` or
``Reduction`` body) and ``ExternKernel`` (an ATen call the wrapper makes: an extern kernel
we chose, such as mm, or a fallback for an op without a lowering).

Sizes, strides and offsets are sympy expressions everywhere; nothing assumes ``int``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from .ops import ops
from .symbols import Expr, contiguous_strides, flat_index, product, sym

Loader = Callable[[Sequence[Expr]], Any]

REDUCTION_TYPES = frozenset(
    {"sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "welford_mean", "welford_m2"}
)


@dataclass(frozen=True)
class Layout:
    device: torch.device
    dtype: torch.dtype
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]
    offset: Expr = sympy.Integer(0)

    @staticmethod
    def contiguous(device: torch.device, dtype: torch.dtype, size: Sequence[Expr]) -> Layout:
        size = tuple(sym(s) for s in size)
        return Layout(device, dtype, size, contiguous_strides(size))

    def index(self, idx: Sequence[Expr]) -> Expr:
        return flat_index(idx, self.stride, self.offset)

    @property
    def numel(self) -> Expr:
        return product(self.size)

    def storage_span(self) -> Expr:
        """Elements of storage this layout reaches (offset + furthest element + 1)."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return (
            self.offset
            + sum(((s - 1) * st for s, st in zip(self.size, self.stride)), sympy.Integer(0))
            + 1
        )

    def is_contiguous(self) -> bool:
        return self.offset == 0 and all(
            s == 1 or st == c
            for s, st, c in zip(self.size, self.stride, contiguous_strides(self.size))
        )


@dataclass(frozen=True, eq=False)
class Buffer:
    """A named piece of memory. Subclasses say who fills it."""

    name: str
    layout: Layout

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.dtype

    @property
    def device(self) -> torch.device:
        return self.layout.device


@dataclass(frozen=True, eq=False)
class InputBuffer(Buffer):
    """A graph input (placeholder), in the strides it arrives with."""


@dataclass(frozen=True, eq=False)
class ConstantBuffer(Buffer):
    """A tensor constant of the graph (get_attr), passed to the wrapper as a global."""

    value: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class ComputedBuffer(Buffer):
    """A buffer computed by a generated kernel from a pointwise or reduction body."""

    body: Pointwise | Reduction | Scan | Scatter | None = None
    origin: str = ""  # the ATen op(s) it came from, for logs and dumps


@dataclass(frozen=True, eq=False)
class ExternOutput(Buffer):
    """One tensor returned by an ExternKernel: ``result`` indexed by ``path``."""

    kernel: str = ""
    path: tuple[int, ...] = ()
    # the op may return other strides than ``layout`` (a convolution asked for channels-last
    # whose backend returns contiguous): the wrapper checks and copies if they differ
    check_strides: bool = False


@dataclass(frozen=True, eq=False)
class ExternKernel:
    """A call of an ATen op from the wrapper. ``kind`` is 'extern' (chosen, e.g. mm) or
    'fallback' (an op with no lowering, run eagerly). Tensor arguments are StorageViews."""

    name: str
    op: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    kind: str
    outputs: tuple[ExternOutput, ...] = ()
    # unbacked size symbols this call's results give (``nonzero``'s row count, ``.item()``):
    # (symbol, Python source over the call's result names) that the wrapper binds after it
    binds: tuple[tuple[str, str], ...] = ()

    def input_buffers(self) -> list[str]:
        names: list[str] = []

        def visit(a: Any) -> None:
            if isinstance(a, StorageView):
                names.append(a.buffer.name)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)

        for a in self.args:
            visit(a)
        for a in self.kwargs.values():
            visit(a)
        return names


class TensorValue:
    """A lowering-time value: something with a dtype, a size and a loader."""

    device: torch.device
    dtype: torch.dtype
    size: tuple[Expr, ...]

    def make_loader(self) -> Loader:
        raise NotImplementedError

    @property
    def ndim(self) -> int:
        return len(self.size)


@dataclass(frozen=True, eq=False)
class Pointwise(TensorValue):
    device: torch.device
    dtype: torch.dtype
    size: tuple[Expr, ...]
    inner_fn: Loader

    def make_loader(self) -> Loader:
        return self.inner_fn


@dataclass(frozen=True, eq=False)
class Reduction:
    """Reduce ``inner_fn(index, rindex)`` over ``reduction_ranges`` for each output index.

    ``reduction_type`` is one of REDUCTION_TYPES; ``welford_mean``/``welford_m2`` are the
    mean and the sum of squared deviations of one Welford pass (a backend computes both
    from one accumulator when they share a value)."""

    device: torch.device
    dtype: torch.dtype
    size: tuple[Expr, ...]
    reduction_ranges: tuple[Expr, ...]
    reduction_type: str
    inner_fn: Callable[[Sequence[Expr], Sequence[Expr]], Any]
    src_dtype: torch.dtype

    def __post_init__(self) -> None:
        assert self.reduction_type in REDUCTION_TYPES, self.reduction_type


SCAN_TYPES = frozenset({"sum", "prod"})


@dataclass(frozen=True, eq=False)
class Scan:
    """An inclusive scan along ``axis``: out[i] = combine of ``inner_fn(j)`` over every j
    equal to i except ``j[axis] <= i[axis]`` (cumsum, cumprod). ``inner_fn`` takes the full
    index; ``dtype`` is the accumulator's and the output's type."""

    device: torch.device
    dtype: torch.dtype
    size: tuple[Expr, ...]
    axis: int
    scan_type: str
    inner_fn: Loader

    def __post_init__(self) -> None:
        assert self.scan_type in SCAN_TYPES, self.scan_type


SCATTER_MODES = frozenset({"add", "store"})


@dataclass(frozen=True, eq=False)
class Scatter:
    """An in-place update of the buffer ``base`` (which the scatter's own buffer then
    is): for every index ``i`` of ``ranges``, ``inner_fn(i)`` returns ``(target, value)``
    and the element ``target`` (an index of ``size``, the updated buffer's) becomes
    ``value`` (``store``) or grows by it (``add``). index_put, scatter, scatter_add,
    index_add and embedding_dense_backward lower to one.

    ``serial``: the dimensions of ``ranges`` along which two updates may reach one element
    (their target coordinate is loaded data). Every other dimension of ``ranges`` is one
    dimension of ``size`` itself, so updates that differ in it never collide: a backend
    runs those in parallel and the ``serial`` ones in order inside each (no atomics, and
    sums in eager's order), or uses atomic adds. ``dtype`` is the buffer's."""

    device: torch.device
    dtype: torch.dtype
    size: tuple[Expr, ...]
    ranges: tuple[Expr, ...]
    inner_fn: Callable[[Sequence[Expr]], tuple[Sequence[Expr], Any]]
    mode: str
    base: str
    serial: tuple[int, ...]

    def __post_init__(self) -> None:
        assert self.mode in SCATTER_MODES, self.mode


@dataclass(frozen=True, eq=False)
class StorageView(TensorValue):
    """A realized buffer read through a strided layout (views of buffers stay this)."""

    buffer: Buffer
    layout: Layout

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.layout.device

    @property
    def dtype(self) -> torch.dtype:  # type: ignore[override]
        return self.layout.dtype

    @property
    def size(self) -> tuple[Expr, ...]:  # type: ignore[override]
        return self.layout.size

    def make_loader(self) -> Loader:
        name, layout = self.buffer.name, self.layout

        def load(index: Sequence[Expr]) -> Any:
            return ops.load(name, layout.index(index))

        return load


@dataclass(frozen=True, eq=False)
class View(TensorValue):
    """``base`` read through an index remapping: out[index] = base[reindex(index)]."""

    base: TensorValue
    size: tuple[Expr, ...]
    reindex: Callable[[Sequence[Expr]], Sequence[Expr]]

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.base.device

    @property
    def dtype(self) -> torch.dtype:  # type: ignore[override]
        return self.base.dtype

    def make_loader(self) -> Loader:
        inner = self.base.make_loader()
        reindex = self.reindex
        return lambda index: inner(reindex(index))


@dataclass(frozen=True)
class Constant:
    """A Python scalar argument kept as is (for extern calls and scalar ops)."""

    value: Any


Node = ComputedBuffer | ExternKernel


@dataclass
class GraphIR:
    """The lowered graph: inputs, scheduler nodes in program order, outputs."""

    inputs: list[InputBuffer] = field(default_factory=list)
    constants: list[ConstantBuffer] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)  # StorageView | Constant | None
    buffers: dict[str, Buffer] = field(default_factory=dict)
    # int inputs that are size symbols (kiln-capture's symbolic ints): position -> symbol
    symbol_inputs: dict[int, Any] = field(default_factory=dict)
