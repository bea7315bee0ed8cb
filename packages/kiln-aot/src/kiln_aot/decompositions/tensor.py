"""Decompositions of view, factory and elementwise helper ops into the core set."""

from __future__ import annotations

import torch

from kiln_aot.decompositions.registry import register

aten = torch.ops.aten


def _dims(ndim: int, dims) -> list[int]:
    if dims is None:
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return [d % max(ndim, 1) for d in dims]


# ---- views -------------------------------------------------------------------------------
@register(aten.t.default)
def t(x):
    return aten.permute.default(x, list(reversed(range(x.dim()))))


@register(aten.transpose.int)
def transpose(x, dim0, dim1):
    perm = list(range(x.dim()))
    if perm:
        dim0, dim1 = dim0 % x.dim(), dim1 % x.dim()
        perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return aten.permute.default(x, perm)


@register(aten._unsafe_view.default, aten._reshape_alias.default)
def unsafe_view(x, size, stride=None):
    return aten.view.default(x, size)


@register(aten.squeeze.default, aten.squeeze.dim)
def squeeze(x, dim=None):
    dims = [d for d in _dims(x.dim(), dim) if x.shape[d] == 1] if x.dim() else []
    return aten.squeeze.dims(x, dims)


@register(aten.split.Tensor)
def split(x, split_size, dim=0):
    dim = dim % x.dim()
    n = x.shape[dim]
    sizes = [min(split_size, n - s) for s in range(0, n, split_size)] if split_size else [n]
    return split_with_sizes(x, sizes or [0], dim)


@register(aten.split_with_sizes.default)
def split_with_sizes(x, split_sizes, dim=0):
    dim = dim % x.dim()
    out, start = [], 0
    for size in split_sizes:
        out.append(aten.slice.Tensor(x, dim, start, start + size, 1))
        start += size
    return out


@register(aten.flip.default, torch.ops.prims.rev.default)
def flip(x, dims):
    """Reversal along ``dims`` as ``index_select`` with a descending ``arange`` (the
    backward of ``cumsum`` flips its gradient)."""
    for d in _dims(x.dim(), dims):
        n = x.shape[d]
        index = aten.arange.start_step(n - 1, -1, -1, dtype=torch.int64, device=x.device)
        x = aten.index_select.default(x, d, index)
    return x


@register(aten.unbind.int)
def unbind(x, dim=0):
    dim = dim % x.dim()
    return [aten.select.int(x, dim, i) for i in range(x.shape[dim])]


# ---- factories ---------------------------------------------------------------------------
def _like(x, dtype, device):
    return (dtype if dtype is not None else x.dtype), (device if device is not None else x.device)


@register(aten.full_like.default)
def full_like(
    x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    dtype, device = _like(x, dtype, device)
    return aten.full.default(list(x.shape), fill_value, dtype=dtype, device=device)


@register(aten.zeros_like.default)
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return full_like(x, 0, dtype=dtype, device=device)


@register(aten.ones_like.default)
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return full_like(x, 1, dtype=dtype, device=device)


@register(aten.empty_like.default)
def empty_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype, device = _like(x, dtype, device)
    return aten.empty.memory_format(list(x.shape), dtype=dtype, device=device)


@register(aten.new_zeros.default)
def new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype, device = _like(x, dtype, device)
    return aten.full.default(list(size), 0, dtype=dtype, device=device)


@register(aten.new_ones.default)
def new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype, device = _like(x, dtype, device)
    return aten.full.default(list(size), 1, dtype=dtype, device=device)


@register(aten.new_full.default)
def new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype, device = _like(x, dtype, device)
    return aten.full.default(list(size), fill_value, dtype=dtype, device=device)


@register(aten.new_empty.default)
def new_empty(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype, device = _like(x, dtype, device)
    return aten.empty.memory_format(list(size), dtype=dtype, device=device)


@register(aten.new_empty_strided.default)
def new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype, device = _like(x, dtype, device)
    return aten.empty_strided.default(list(size), list(stride), dtype=dtype, device=device)


@register(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), 0, dtype=dtype or torch.get_default_dtype(), device=device)


@register(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.full.default(list(size), 1, dtype=dtype or torch.get_default_dtype(), device=device)


@register(aten.fill.Scalar)
def fill(x, value):
    return aten.full.default(list(x.shape), value, dtype=x.dtype, device=x.device)


@register(aten.fill.Tensor)
def fill_tensor(x, value):
    return aten.expand.default(aten._to_copy.default(value, dtype=x.dtype), list(x.shape)).clone()


@register(aten.zero.default)
def zero(x):
    return aten.full.default(list(x.shape), 0, dtype=x.dtype, device=x.device)


@register(aten.arange.default)
def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.arange.start_step(0, end, 1, dtype=dtype, device=device)


@register(aten.arange.start)
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.arange.start_step(start, end, 1, dtype=dtype, device=device)


# ---- elementwise helpers ------------------------------------------------------------------
@register(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(x, other, alpha=1):
    return (
        aten.sub.Tensor(other, x, alpha=alpha)
        if isinstance(other, torch.Tensor)
        else aten.sub.Tensor(aten.full_like.default(x, other), x, alpha=alpha)
    )


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    if not isinstance(value, torch.Tensor):
        value = aten.scalar_tensor.default(value, dtype=x.dtype, device=x.device)
    elif value.dtype != x.dtype:
        value = aten._to_copy.default(value, dtype=x.dtype)
    return aten.where.self(mask, value, x)


def _nan_ignoring(x, other, pick):
    dtype = torch.result_type(x, other)
    x, other = (
        t if t.dtype == dtype else aten._to_copy.default(t, dtype=dtype) for t in (x, other)
    )
    best = pick(x, other)
    if not dtype.is_floating_point:
        return best
    # fmax/fmin return the other operand where one is NaN (NaN only where both are)
    return aten.where.self(
        aten.isnan.default(other), x, aten.where.self(aten.isnan.default(x), other, best)
    )


@register(aten._conj.default)
def conj(x):
    # the lazy conjugate view, materialized: graphs are functional, so the copy holds the
    # same values (a real tensor is its own conjugate)
    if not x.is_complex():
        return x
    return aten.conj_physical.default(x)


@register(aten.fmax.default)
def fmax(x, other):
    return _nan_ignoring(x, other, aten.maximum.default)


@register(aten.fmin.default)
def fmin(x, other):
    return _nan_ignoring(x, other, aten.minimum.default)


@register(aten.clamp_min.default)
def clamp_min(x, min):
    return aten.clamp.default(x, min, None)


@register(aten.clamp_max.default)
def clamp_max(x, max):
    return aten.clamp.default(x, None, max)


@register(aten._unsafe_index_put.default)
def unsafe_index_put(x, indices, values, accumulate=False):
    return aten.index_put.default(x, indices, values, accumulate)


@register(aten.copy.default)
def copy(x, src, non_blocking=False):
    value = src
    if value.dtype != x.dtype or value.device != x.device:
        value = aten._to_copy.default(value, dtype=x.dtype, device=x.device)
    if tuple(value.shape) != tuple(x.shape):
        value = aten.expand.default(value, list(x.shape))
    return aten.clone.default(value)
