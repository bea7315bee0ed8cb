"""Helpers every lowering family uses: type promotion, broadcasting, scalar loaders."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..ir.nodes import Loader, Pointwise, TensorValue, View
from ..ir.ops import ops
from ..ir.symbols import Expr, is_int_like, refine, sym

FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """bfloat16/float16 are computed in float32."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def _category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def _scalar_dtype(value: Any) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if is_int_like(value):  # an int, or a symbolic size (``arange(n) + past_length``)
        return torch.int64
    if isinstance(value, complex):
        return torch.complex64
    return torch.get_default_dtype()


def promote(*args: Any, int_to_float: bool = False) -> torch.dtype:
    """The result dtype of a pointwise op over ``args`` (tensors and Python scalars), by
    PyTorch's rules: dimensioned tensors, then 0-d tensors, then scalars, each group
    counting only when it is of a higher category (bool < int < float < complex)."""
    dims, zeros, scalars = [], [], []
    for a in args:
        if a is None:
            continue
        if isinstance(a, TensorValue):
            (dims if a.ndim > 0 else zeros).append(a.dtype)
        elif isinstance(a, torch.Tensor):
            (dims if a.dim() > 0 else zeros).append(a.dtype)
        else:
            scalars.append(_scalar_dtype(a))
    result: torch.dtype | None = None
    for group in (dims, zeros, scalars):
        if not group:
            continue
        d = functools.reduce(torch.promote_types, group)
        if result is None or _category(d) > _category(result):
            result = d
    assert result is not None, "promote() needs an argument"
    if int_to_float and _category(result) < 2:
        result = torch.get_default_dtype()
    return result


def broadcast_sizes(*sizes: Sequence[Expr]) -> tuple[Expr, ...]:
    ndim = max((len(s) for s in sizes), default=0)
    out: list[Expr] = []
    for d in range(ndim):
        dim: Expr = sympy.Integer(1)
        for s in sizes:
            k = d - (ndim - len(s))
            if k < 0:
                continue
            if refine(s[k]) != 1:  # a symbolic size guarded to 1 broadcasts too
                dim = s[k]
        out.append(dim)
    return tuple(out)


def broadcast_loader(value: TensorValue, size: Sequence[Expr]) -> Loader:
    """A loader of ``value`` indexed by the (broadcast) output ``size``."""
    inner = value.make_loader()
    offset = len(size) - value.ndim
    vsize = value.size

    def load(index: Sequence[Expr]) -> Any:
        idx = [
            sympy.Integer(0) if refine(vsize[k]) == 1 else index[k + offset]
            for k in range(len(vsize))
        ]
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
    if ndim == 0:  # a scalar's dim 0 (or -1) is the scalar itself: nothing to loop over
        return []
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({normalize_dim(d, ndim) for d in dims})
