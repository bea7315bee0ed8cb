"""``torch._prims`` ops reached through ``torch._decomp``'s reference decompositions, mapped
back to core ATen ops."""

from __future__ import annotations

import torch

from kiln_aot.decompositions.registry import register

aten = torch.ops.aten
prims = torch.ops.prims


def _tensor(v, like):
    if isinstance(v, torch.Tensor):
        return v
    return aten.scalar_tensor.default(v, dtype=like.dtype, device=like.device)


@register(prims.where.default)
def where(cond, a, b):
    like = a if isinstance(a, torch.Tensor) else b if isinstance(b, torch.Tensor) else cond
    return aten.where.self(cond, _tensor(a, like), _tensor(b, like))


@register(prims.convert_element_type.default)
def convert_element_type(x, dtype):
    return aten._to_copy.default(x, dtype=dtype)


@register(prims.broadcast_in_dim.default)
def broadcast_in_dim(x, shape, broadcast_dimensions):
    view_shape = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        view_shape[dst] = x.shape[src]
    return aten.expand.default(aten.view.default(x, view_shape), list(shape))


@register(prims.squeeze.default)
def squeeze(x, dims):
    return aten.squeeze.dims(x, list(dims))


@register(prims.view_of.default)
def view_of(x):
    return aten.view.default(x, list(x.shape))
