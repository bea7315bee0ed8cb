"""Lowerings of views: index remappings, never copies.

A view of a realized buffer stays a ``StorageView`` with new strides when strides can say
it (permute, expand, slice, select, squeeze, unsqueeze, reshape of contiguous data,
as_strided); otherwise it is a ``View`` whose loader remaps the index (reshape of
non-contiguous data, views of unrealized values).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..ir.nodes import Layout, StorageView, TensorValue, View
from ..ir.symbols import (
    Expr,
    FloorDiv,
    contiguous_strides,
    flat_index,
    product,
    sym,
    unflatten_index,
)
from .context import refine
from .registry import register_lowering
from .values import expand_to, normalize_dim

aten = torch.ops.aten


def _strided(
    value: TensorValue, size: Sequence[Expr], stride: Sequence[Expr], offset: Expr
) -> StorageView:
    assert isinstance(value, StorageView)
    lay = value.layout
    return StorageView(
        value.buffer, Layout(lay.device, lay.dtype, tuple(size), tuple(stride), offset)
    )


def permute(x: TensorValue, dims: Sequence[int]) -> TensorValue:
    dims = [normalize_dim(d, x.ndim) for d in dims]
    size = tuple(x.size[d] for d in dims)
    if isinstance(x, StorageView):
        return _strided(x, size, [x.layout.stride[d] for d in dims], x.layout.offset)
    inv = [dims.index(k) for k in range(len(dims))]
    return View(x, size, lambda index: [index[inv[k]] for k in range(len(inv))])


@register_lowering(aten.permute)
def _permute(x: TensorValue, dims: Sequence[int]) -> TensorValue:
    return permute(x, dims)


@register_lowering(aten.transpose)
def transpose(x: TensorValue, d0: int, d1: int) -> TensorValue:
    dims = list(range(x.ndim))
    d0, d1 = normalize_dim(d0, x.ndim), normalize_dim(d1, x.ndim)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(x, dims)


@register_lowering(aten.t)
def _t(x: TensorValue) -> TensorValue:
    return x if x.ndim < 2 else transpose(x, 0, 1)


@register_lowering(aten.expand)
def expand(x: TensorValue, size: Sequence[Any], implicit: bool = False) -> TensorValue:
    size = list(size)
    offset = len(size) - x.ndim
    out = [sym(x.size[k - offset]) if (s == -1) else sym(s) for k, s in enumerate(size)]
    if isinstance(x, StorageView):
        stride = [sympy.Integer(0)] * offset + [
            sympy.Integer(0) if (x.size[k] == 1 and out[k + offset] != 1) else x.layout.stride[k]
            for k in range(x.ndim)
        ]
        return _strided(x, out, stride, x.layout.offset)
    from .context import current_graph

    # broadcasting an expensive unrealized value would recompute it for every copy
    x = current_graph().maybe_realize_shared(x, 2) if product(out) != product(x.size) else x
    return expand_to(x, out)


register_lowering(aten.expand_copy)(expand)


def unsqueeze(x: TensorValue, dim: int) -> TensorValue:
    dim = normalize_dim(dim, x.ndim + 1)
    size = list(x.size)
    size.insert(dim, sympy.Integer(1))
    if isinstance(x, StorageView):
        stride = list(x.layout.stride)
        stride.insert(dim, stride[dim] * size[dim + 1] if dim < len(stride) else sympy.Integer(1))
        return _strided(x, size, stride, x.layout.offset)
    return View(x, tuple(size), lambda index: [*index[:dim], *index[dim + 1 :]])


register_lowering(aten.unsqueeze)(unsqueeze)


@register_lowering(aten.squeeze)
def squeeze(x: TensorValue, dim: Any = None) -> TensorValue:
    if dim is None:
        dims = [k for k, s in enumerate(x.size) if s == 1]
    else:
        dims = [normalize_dim(d, x.ndim) for d in ([dim] if isinstance(dim, int) else dim)]
        dims = [d for d in dims if x.ndim > 0 and x.size[d] == 1]
    keep = [k for k in range(x.ndim) if k not in dims]
    size = tuple(x.size[k] for k in keep)
    if isinstance(x, StorageView):
        return _strided(x, size, [x.layout.stride[k] for k in keep], x.layout.offset)

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        out = [sympy.Integer(0)] * x.ndim
        for pos, k in enumerate(keep):
            out[k] = index[pos]
        return out

    return View(x, size, reindex)


@register_lowering(aten.slice)
def slice_(
    x: TensorValue, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    n = x.size[dim]
    start = 0 if start is None else start
    end = n if end is None else end
    start, end = sym(start), sym(end)
    if start.is_Integer and start < 0:
        start = sympy.Max(start + n, 0)
    if end.is_Integer and end < 0:
        end = sympy.Max(end + n, 0)
    start, end = refine(sympy.Min(start, n)), refine(sympy.Min(end, n))
    length = refine(sympy.Max(FloorDiv(refine(sympy.Max(end - start, 0)) + step - 1, step), 0))
    size = list(x.size)
    size[dim] = length
    if isinstance(x, StorageView):
        stride = list(x.layout.stride)
        offset = x.layout.offset + start * stride[dim]
        stride[dim] = stride[dim] * step
        return _strided(x, size, stride, offset)
    return View(
        x, tuple(size), lambda index: [*index[:dim], start + index[dim] * step, *index[dim + 1 :]]
    )


@register_lowering(aten.flip)
def flip(x: TensorValue, dims: Sequence[int]) -> TensorValue:
    """A view reading index ``n - 1 - i`` along each flipped dimension (no copy)."""
    flipped = {normalize_dim(d, x.ndim) for d in dims}
    size = tuple(x.size)
    return View(
        x,
        size,
        lambda index: [size[d] - 1 - i if d in flipped else i for d, i in enumerate(index)],
    )


@register_lowering(aten.select)
def select(x: TensorValue, dim: int, index: Any) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    idx = sym(index)
    if idx.is_Integer and idx < 0:
        idx = idx + x.size[dim]
    size = [s for k, s in enumerate(x.size) if k != dim]
    if isinstance(x, StorageView):
        stride = [s for k, s in enumerate(x.layout.stride) if k != dim]
        return _strided(x, size, stride, x.layout.offset + idx * x.layout.stride[dim])
    return View(x, tuple(size), lambda i: [*i[:dim], idx, *i[dim:]])


def _infer_size(x: TensorValue, size: Sequence[Any]) -> list[Expr]:
    size = [sym(s) for s in size]
    if any(s == -1 for s in size):
        known = product(s for s in size if s != -1)
        size = [product(x.size) / known if s == -1 else s for s in size]
    return [sympy.Integer(int(s)) if s.is_number else s for s in size]


@register_lowering(aten.view, aten._unsafe_view, aten.reshape, aten.view_copy)
def view(x: TensorValue, size: Sequence[Any]) -> TensorValue:
    new = _infer_size(x, size)
    if tuple(new) == tuple(x.size):
        return x
    if isinstance(x, StorageView) and x.layout.is_contiguous():
        return _strided(x, new, contiguous_strides(new), x.layout.offset)
    if isinstance(x, StorageView):
        strided = _view_strides(x, new)
        if strided is not None:
            return strided
    old = x.size

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        flat = flat_index(index, contiguous_strides(new))
        return unflatten_index(flat, old)

    return View(x, tuple(new), reindex)


def _view_strides(x: StorageView, new: Sequence[Expr]) -> StorageView | None:
    """Strides for a reshape of strided data when it only merges/splits compatible dims."""
    old_size = [int(s) for s in x.size] if all(s.is_Integer for s in x.size) else None
    if old_size is None or not all(sym(s).is_Integer for s in new):
        return None
    t = torch.empty_strided(old_size, [int(s) for s in x.layout.stride], device="meta")
    try:
        v = t.view([int(s) for s in new])
    except RuntimeError:
        return None
    return _strided(x, new, [sym(s) for s in v.stride()], x.layout.offset)


@register_lowering(aten.as_strided)
def as_strided(
    x: TensorValue, size: Sequence[Any], stride: Sequence[Any], storage_offset: Any = None
) -> TensorValue:
    from .context import current_graph

    base = current_graph().realize(x)
    if not base.layout.is_contiguous():
        base = current_graph().realize(Pointwise_copy(base))
    offset = base.layout.offset + sym(storage_offset or 0)
    return _strided(base, [sym(s) for s in size], [sym(s) for s in stride], offset)


def Pointwise_copy(x: TensorValue) -> TensorValue:
    from ..ir.nodes import Pointwise

    return Pointwise(x.device, x.dtype, x.size, x.make_loader())


@register_lowering(aten.split, aten.split_with_sizes)
def split(x: TensorValue, sizes: Any, dim: int = 0) -> tuple[TensorValue, ...]:
    dim = normalize_dim(dim, x.ndim)
    n = int(x.size[dim])
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)] or [0]
    out, start = [], 0
    for s in sizes:
        out.append(slice_(x, dim, start, start + s))
        start += s
    return tuple(out)


@register_lowering(aten.chunk)
def chunk(x: TensorValue, chunks: int, dim: int = 0) -> tuple[TensorValue, ...]:
    n = int(x.size[normalize_dim(dim, x.ndim)])
    each = -(-n // chunks)
    return split(x, each, dim)


@register_lowering(aten.unbind)
def unbind(x: TensorValue, dim: int = 0) -> tuple[TensorValue, ...]:
    dim = normalize_dim(dim, x.ndim)
    return tuple(select(x, dim, i) for i in range(int(x.size[dim])))


@register_lowering(aten.narrow)
def narrow(x: TensorValue, dim: int, start: int, length: int) -> TensorValue:
    return slice_(x, dim, start, sym(start) + length)
