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


def _scalar_dtype(*values):
    """The dtype of Python scalars together, as eager types them (float: the default
    dtype, int: int64, bool: bool)."""
    if any(isinstance(v, complex) for v in values):
        return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
    if any(isinstance(v, float) for v in values):
        return torch.get_default_dtype()
    if any(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return torch.int64
    return torch.bool


@register(prims.where.default)
def where(cond, a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        # two scalars (entr's where(x == 0, 0, -inf)): typed as eager types them, not as
        # the bool condition (-inf as bool was True, 1.0 once converted back)
        dtype = _scalar_dtype(a, b)
        a = aten.scalar_tensor.default(a, dtype=dtype, device=cond.device)
        b = aten.scalar_tensor.default(b, dtype=dtype, device=cond.device)
        return aten.where.self(cond, a, b)
    like = a if isinstance(a, torch.Tensor) else b
    return aten.where.self(cond, _tensor(a, like), _tensor(b, like))


# elementwise prims whose ATen namesake computes the same on the (already promoted)
# operands the reference decompositions pass them
_SAME_AS_ATEN = {
    "abs": aten.abs.default, "neg": aten.neg.default, "signbit": aten.signbit.default,
    "exp": aten.exp.default, "log": aten.log.default, "sin": aten.sin.default,
    "cos": aten.cos.default, "tanh": aten.tanh.default, "sqrt": aten.sqrt.default,
    "floor": aten.floor.default, "ceil": aten.ceil.default, "trunc": aten.trunc.default,
    "erf": aten.erf.default, "log1p": aten.log1p.default, "expm1": aten.expm1.default,
    "reciprocal": aten.reciprocal.default, "maximum": aten.maximum.default,
    "minimum": aten.minimum.default, "atan2": aten.atan2.default, "sign": aten.sign.default,
    "sigmoid": aten.sigmoid.default, "log2": aten.log2.default, "exp2": aten.exp2.default,
}  # fmt: skip


for _name, _target in _SAME_AS_ATEN.items():
    _prim = getattr(prims, _name, None)
    if _prim is not None:
        register(_prim.default)(_target)


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
