"""Helpers every lowering family uses: type promotion, broadcasting, scalar loaders."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..ir.nodes import Loader, Pointwise, TensorValue, View
from ..ir.ops import ops
from ..ir.symbols import Expr, sym

FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """bfloat16/float16 are computed in float32."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def _meta(a: Any) -> Any:
    if isinstance(a, TensorValue):
        return torch.empty((1,) * a.ndim, dtype=a.dtype, device="meta")
    if isinstance(a, torch.Tensor):
        return a.to("meta")
    return a


def promote(*args: Any, int_to_float: bool = False) -> torch.dtype:
    """The result dtype of a pointwise op over ``args`` (tensors and Python scalars)."""
    metas = [_meta(a) for a in args if a is not None]
    tensors = [m for m in metas if isinstance(m, torch.Tensor)]
    if not tensors:
        dtype = torch.result_type(torch.tensor(metas[0]), metas[0])
    else:
        dtype = (
            functools.reduce(lambda acc, m: torch.result_type(acc, m), metas[1:], metas[0])
            if len(metas) > 1
            else tensors[0].dtype
        )
        if isinstance(dtype, torch.Tensor):  # pragma: no cover - defensive
            dtype = dtype.dtype
    if int_to_float and not dtype.is_floating_point and not dtype.is_complex:
        dtype = torch.get_default_dtype()
    return dtype


def broadcast_sizes(*sizes: Sequence[Expr]) -> tuple[Expr, ...]:
    ndim = max((len(s) for s in sizes), default=0)
    out: list[Expr] = []
    for d in range(ndim):
        dim: Expr = sympy.Integer(1)
        for s in sizes:
            k = d - (ndim - len(s))
            if k < 0:
                continue
            if s[k] != 1:
                dim = s[k]
        out.append(dim)
    return tuple(out)


def broadcast_loader(value: TensorValue, size: Sequence[Expr]) -> Loader:
    """A loader of ``value`` indexed by the (broadcast) output ``size``."""
    inner = value.make_loader()
    offset = len(size) - value.ndim
    vsize = value.size

    def load(index: Sequence[Expr]) -> Any:
        idx = [sympy.Integer(0) if vsize[k] == 1 else index[k + offset] for k in range(len(vsize))]
        return inner(idx)

    return load


def cast_loader(loader: Loader, from_dtype: torch.dtype, to_dtype: torch.dtype) -> Loader:
    if from_dtype == to_dtype:
        return loader
    return lambda index: ops.to_dtype(loader(index), to_dtype)


def operand_loader(a: Any, size: Sequence[Expr], dtype: torch.dtype) -> Loader:
    """A loader of a tensor or Python scalar operand, converted to ``dtype``."""
    if isinstance(a, TensorValue):
        return cast_loader(broadcast_loader(a, size), a.dtype, dtype)
    value = a.item() if isinstance(a, torch.Tensor) else a
    return lambda index: ops.constant(value, dtype)


def device_of(*args: Any) -> torch.device:
    for a in args:
        if isinstance(a, TensorValue):
            return a.device
    from .context import current_graph

    return current_graph().device


def pointwise(
    fn: Any, args: Sequence[Any], out_dtype: torch.dtype, in_dtype: torch.dtype | None = None
) -> Pointwise:
    """out[i] = fn(*args[i]) with args converted to ``in_dtype`` (computed in float32 for
    low precision) and the result converted to ``out_dtype``."""
    in_dtype = compute_dtype(in_dtype or out_dtype)
    size = broadcast_sizes(*[a.size for a in args if isinstance(a, TensorValue)])
    loaders = [operand_loader(a, size, in_dtype) for a in args]
    device = device_of(*args)

    def inner(index: Sequence[Expr]) -> Any:
        out = fn(*[ld(index) for ld in loaders])
        return ops.to_dtype(out, out_dtype) if out_dtype in LOW_PRECISION else out

    return Pointwise(device, out_dtype, size, inner)


def to_dtype(value: TensorValue, dtype: torch.dtype) -> TensorValue:
    if value.dtype == dtype:
        return value
    loader = value.make_loader()
    return Pointwise(value.device, dtype, value.size, lambda i: ops.to_dtype(loader(i), dtype))


def expand_to(value: TensorValue, size: Sequence[Expr]) -> TensorValue:
    size = tuple(sym(s) for s in size)
    if tuple(value.size) == size:
        return value
    loader_size = size
    base = value
    offset = len(size) - value.ndim

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        return [
            sympy.Integer(0) if base.size[k] == 1 else index[k + offset] for k in range(base.ndim)
        ]

    return View(base, loader_size, reindex)


def normalize_dim(dim: int, ndim: int) -> int:
    return dim + max(ndim, 1) if dim < 0 else dim


def normalize_dims(dims: Any, ndim: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({normalize_dim(d, ndim) for d in dims})
