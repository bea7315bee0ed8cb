"""Lowerings that build or rearrange tensors: factories (full, arange, empty...), cat/stack,
constant_pad_nd, gather/index/index_select/embedding, slice_scatter/select_scatter, copy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import sympy
import torch

from ..index_check import OUT_OF_BOUNDS, IndexCheck, index_check
from ..ir.nodes import Pointwise, TensorValue
from ..ir.ops import ops
from ..ir.symbols import Expr, FloorDiv, clamp_expr, is_int_like, refine, sym
from .context import current_graph, current_node
from .graph_unsupported import unsupported
from .registry import register_lowering
from .values import broadcast_loader, broadcast_sizes, compute_dtype, normalize_dim, to_dtype
from .views import unsqueeze

aten = torch.ops.aten


def _device(device: Any) -> torch.device:
    if device is None:
        return current_graph().device
    d = torch.device(device)
    return current_graph().device if d.type == "meta" else d


def _scalar_dtype(value: Any) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    return torch.get_default_dtype()


def full(
    size: Sequence[Any], value: Any, dtype: torch.dtype | None, device: Any = None
) -> Pointwise:
    dtype = dtype or _scalar_dtype(value)
    cdt = compute_dtype(dtype)

    def inner(index: Sequence[Expr]) -> Any:
        v = ops.constant(value, cdt)
        return ops.to_dtype(v, dtype) if cdt != dtype else v

    return Pointwise(_device(device), dtype, tuple(sym(s) for s in size), inner)


@register_lowering(aten.full)
def _full(
    size: Sequence[Any],
    fill_value: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> Pointwise:
    return full(size, fill_value, dtype, device)


@register_lowering(aten.scalar_tensor)
def _scalar_tensor(
    value: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> Pointwise:
    return full((), value, dtype or torch.get_default_dtype(), device)


@register_lowering(aten.full_like)
def _full_like(
    x: TensorValue,
    value: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> Pointwise:
    return full(x.size, value, dtype or x.dtype, device or x.device)


@register_lowering(aten.zeros_like, aten.ones_like, aten.empty_like)
def _zeros_like(
    x: TensorValue,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> Pointwise:
    from .context import current_node

    one = current_node().target.overloadpacket is aten.ones_like
    return full(x.size, 1 if one else 0, dtype or x.dtype, device or x.device)


@register_lowering(aten.zeros, aten.ones, aten.empty)
def _zeros(
    size: Sequence[Any],
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> Pointwise:
    from .context import current_node

    one = current_node().target.overloadpacket is aten.ones
    return full(size, 1 if one else 0, dtype or torch.get_default_dtype(), device)


@register_lowering(aten.empty_strided)
def _empty_strided(
    size: Sequence[Any],
    stride: Sequence[Any],
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> Pointwise:
    # contents are unspecified: zeros are as good as any, and deterministic
    return full(size, 0, dtype or torch.get_default_dtype(), device)


@register_lowering(aten.fill)
def _fill(x: TensorValue, value: Any) -> Pointwise:
    if isinstance(value, TensorValue):
        return Pointwise(
            x.device, x.dtype, x.size, lambda i: to_dtype(value, x.dtype).make_loader()([])
        )
    return full(x.size, value, x.dtype, x.device)


@register_lowering(aten.arange)
def arange(
    start: Any,
    end: Any = None,
    step: Any = 1,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> Pointwise:
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = (
            torch.int64
            if all(is_int_like(v) for v in (start, end, step))
            else torch.get_default_dtype()
        )
    import math

    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        n = max(math.ceil((end - start) / step), 0)
    else:  # a symbolic bound: the length the meta function computed
        node = current_node()
        assert node is not None
        n = sym(node.meta["val"].shape[0])

    def inner(index: Sequence[Expr]) -> Any:
        if not dtype.is_floating_point:
            return ops.index_expr(start + index[0] * step, dtype)
        i = ops.index_expr(index[0], torch.float64)
        v = ops.add(
            ops.constant(start, torch.float64), ops.mul(i, ops.constant(step, torch.float64))
        )
        return ops.to_dtype(v, dtype)

    return Pointwise(_device(device), dtype, (sym(n),), inner)


def _clamp_index(i: Expr, lo: Expr, hi: Expr) -> Expr:
    """``min(max(i, lo), hi)``, built without sympy's evaluation of Min/Max, which compares
    every pair of arguments through the assumptions system (~10 ms a clamp with symbols:
    9 of the 14 s HF LLaMA's graphs spent in kiln-inductor went there, rotary embeddings'
    ``cat``s). Numbers are clamped here; a bound the index cannot cross by the symbols'
    signs alone (a non-negative index above 0) is dropped."""
    return clamp_expr(i, lo, hi)


@register_lowering(aten.cat)
def cat(tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    # eager skips 1-D empty tensors (legacy); when all are, the result is one of them
    tensors = [t for t in tensors if not (t.ndim == 1 and t.size[0] == 0)] or list(tensors[:1])
    if len(tensors) == 1:
        t = tensors[0]
        return Pointwise(t.device, t.dtype, t.size, t.make_loader())
    ref = tensors[0]
    dim = normalize_dim(dim, ref.ndim)
    from .values import promote

    dtype = promote(*tensors)
    parts = [(to_dtype(t, dtype), t.size[dim]) for t in tensors if t.size[dim] != 0]
    total = sum((n for _, n in parts), sympy.Integer(0))
    size = list(ref.size)
    size[dim] = total
    loaders = [(t.make_loader(), n) for t, n in parts]

    def inner(index: Sequence[Expr]) -> Any:
        if not loaders:  # every piece is empty: so is the result, never read
            return ops.constant(0, dtype)
        i = index[dim]
        offset: Expr = sympy.Integer(0)
        pieces = []
        for loader, n in loaders:
            idx = list(index)
            idx[dim] = _clamp_index(i - offset, 0, n - 1)
            pieces.append((offset + n, loader(idx)))
            offset = offset + n
        out = pieces[-1][1]
        pos = ops.index_expr(i, torch.int64)
        for end, value in reversed(pieces[:-1]):
            out = ops.where(ops.lt(pos, ops.index_expr(end, torch.int64)), value, out)
        return out

    return Pointwise(ref.device, dtype, tuple(size), inner)


@register_lowering(aten.stack)
def stack(tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    dim = normalize_dim(dim, tensors[0].ndim + 1)
    return cat([unsqueeze(t, dim) for t in tensors], dim)


@register_lowering(aten.constant_pad_nd)
def constant_pad_nd(x: TensorValue, pad: Sequence[int], value: Any = 0) -> TensorValue:
    n = len(pad) // 2
    size = list(x.size)
    lows: dict[int, int] = {}
    for k in range(n):
        d = x.ndim - 1 - k
        lo, hi = pad[2 * k], pad[2 * k + 1]
        lows[d] = lo
        size[d] = size[d] + lo + hi
    loader = x.make_loader()
    cdt = compute_dtype(x.dtype)

    def inner(index: Sequence[Expr]) -> Any:
        idx = list(index)
        mask = None
        for d, lo in lows.items():
            src = index[d] - lo
            idx[d] = _clamp_index(src, 0, x.size[d] - 1)
            i = ops.index_expr(src, torch.int64)
            ok = ops.logical_and(
                ops.ge(i, ops.constant(0, torch.int64)),
                ops.lt(i, ops.index_expr(sym(x.size[d]), torch.int64)),  # a symbolic size too
            )
            mask = ok if mask is None else ops.logical_and(mask, ok)
        v = loader(idx)
        if mask is None:
            return v
        fill = ops.constant(value, cdt)
        if cdt != x.dtype:
            fill = ops.to_dtype(fill, x.dtype)
        return ops.where(mask, v, fill)

    return Pointwise(x.device, x.dtype, tuple(size), inner)


def _indirect(value: Any, size: Expr, check: IndexCheck | None) -> Expr:
    return ops.indirect_indexing(value, size, check)


def _static_empty(size: Expr, out_size: Sequence[Expr]) -> bool:
    """An indirect access into a dimension of size 0 with a non-empty result: every index
    is out of bounds, and no element 0 exists to read instead. The library op raises."""
    return size == 0 and all(s != 0 for s in out_size)


@register_lowering(aten.gather)
def gather(x: TensorValue, dim: int, index: TensorValue, sparse_grad: bool = False) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    xl, il = x.make_loader(), index.make_loader()
    if x.ndim and _static_empty(x.size[dim], index.size):
        raise unsupported("gather from an empty dimension (every index is out of bounds)")
    check = (
        index_check(dim, x.size[dim], wrap=False, error=RuntimeError, index=index)
        if x.ndim
        else None
    )

    def inner(idx: Sequence[Expr]) -> Any:
        src = list(idx)
        if x.ndim:
            src[dim] = _indirect(il(idx), x.size[dim], check)
        return xl(src)

    return Pointwise(x.device, x.dtype, tuple(index.size), inner)


@register_lowering(aten.index_select)
def index_select(x: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    xl, il = x.make_loader(), index.make_loader()
    size = list(x.size)
    if x.ndim:
        size[dim] = index.size[0] if index.ndim else sympy.Integer(1)
        if _static_empty(x.size[dim], size):
            raise unsupported("index_select from an empty dimension")
    # eager's CPU kernel has a path of its own for dim 1, with its own exception and message
    dim1 = x.ndim > 1 and dim == 1
    check = (
        index_check(
            dim,
            x.size[dim],
            wrap=False,
            error=RuntimeError if dim1 else IndexError,
            message="INDICES element is out of DATA bounds, id={index} axis_dim={size}"
            if dim1
            else "index out of range in self",
            index=index,
        )
        if x.ndim
        else None
    )

    def inner(idx: Sequence[Expr]) -> Any:
        src = list(idx)
        if x.ndim:
            src[dim] = _indirect(il([idx[dim]] if index.ndim else []), x.size[dim], check)
        return xl(src)

    return Pointwise(x.device, x.dtype, tuple(size), inner)


@register_lowering(aten.embedding)
def embedding(
    weight: TensorValue,
    indices: TensorValue,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> TensorValue:
    # embedding does not wrap negative ids: -1 is out of range, as eager says
    return _index(weight, [indices], wrap=False, message="index out of range in self")


@register_lowering(aten.index)
def index(x: TensorValue, indices: Sequence[TensorValue | None]) -> TensorValue:
    return _index(x, indices, wrap=True, message=OUT_OF_BOUNDS)


class AdvancedIndex(NamedTuple):
    """``x[indices]`` (advanced indexing) as index arithmetic: the result's ``size``, the
    dimensions of it that the index tensors give (``indexed``, adjacent), and ``source``,
    which maps an index of the result to the index of ``x`` it reads (index_put: writes),
    each index tensor's value checked (``index_check``)."""

    size: tuple[Expr, ...]
    indexed: tuple[int, ...]
    source: Callable[[Sequence[Expr]], list[Expr]]


def advanced_index(
    x: TensorValue, indices: Sequence[TensorValue | None], *, wrap: bool, message: str
) -> AdvancedIndex:
    given = [(d, t) for d, t in enumerate(indices) if t is not None]
    for _, t in given:
        if t.dtype in (torch.bool, torch.uint8):
            raise unsupported("indexing with a boolean mask has a data-dependent shape")
    dims = [d for d, _ in given]
    bshape = broadcast_sizes(*[t.size for _, t in given])
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    rest = [d for d in range(x.ndim) if d not in dims]
    if adjacent:
        before = [d for d in rest if d < dims[0]]
        after = [d for d in rest if d > dims[-1]]
    else:
        before, after = [], rest
    size = [x.size[d] for d in before] + list(bshape) + [x.size[d] for d in after]
    if any(_static_empty(x.size[d], size) for d in dims):
        raise unsupported("indexing into an empty dimension (every index is out of bounds)")
    loaders = [
        (
            d,
            broadcast_loader(t, bshape),
            index_check(d, x.size[d], wrap=wrap, message=message, index=t),
        )
        for d, t in given
    ]
    nb, nbs = len(before), len(bshape)

    def source(idx: Sequence[Expr]) -> list[Expr]:
        src: list[Expr] = [sympy.Integer(0)] * x.ndim
        for k, d in enumerate(before):
            src[d] = idx[k]
        bidx = list(idx[nb : nb + nbs])
        for d, ld, check in loaders:
            src[d] = _indirect(ld(bidx), x.size[d], check)
        for k, d in enumerate(after):
            src[d] = idx[nb + nbs + k]
        return src

    return AdvancedIndex(tuple(size), tuple(range(nb, nb + nbs)), source)


def _index(
    x: TensorValue, indices: Sequence[TensorValue | None], *, wrap: bool, message: str
) -> TensorValue:
    adv = advanced_index(x, indices, wrap=wrap, message=message)
    xl = x.make_loader()
    return Pointwise(x.device, x.dtype, adv.size, lambda idx: xl(adv.source(idx)))


@register_lowering(aten.slice_scatter)
def slice_scatter(
    x: TensorValue,
    src: TensorValue,
    dim: int = 0,
    start: Any = None,
    end: Any = None,
    step: int = 1,
) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    n = sym(x.size[dim])  # a symbolic size too
    start = sym(0 if start is None else start)
    end = n if end is None else sym(end)
    if start.is_Integer and start < 0:
        start = start + n
    if end.is_Integer and end < 0:
        end = end + n
    start = refine(sympy.Max(sympy.Min(start, n), 0))
    end = refine(sympy.Max(sympy.Min(end, n), 0))
    xl, sl = x.make_loader(), to_dtype(src, x.dtype).make_loader()
    m = sym(src.size[dim]) if src.ndim else sympy.Integer(1)

    def inner(idx: Sequence[Expr]) -> Any:
        i = idx[dim]
        j = list(idx)
        j[dim] = _clamp_index(FloorDiv(i - start, step), 0, refine(sympy.Max(m - 1, 0)))
        ii = ops.index_expr(i, torch.int64)
        inside = ops.logical_and(
            ops.ge(ii, ops.constant(start, torch.int64)), ops.lt(ii, ops.constant(end, torch.int64))
        )
        if step != 1:
            on_step = ops.eq(
                ops.remainder(
                    ops.sub(ii, ops.constant(start, torch.int64)), ops.constant(step, torch.int64)
                ),
                ops.constant(0, torch.int64),
            )
            inside = ops.logical_and(inside, on_step)
        return ops.where(inside, sl(j), xl(idx))

    return Pointwise(x.device, x.dtype, x.size, inner)


@register_lowering(aten.select_scatter)
def select_scatter(x: TensorValue, src: TensorValue, dim: int, index: int) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    index = index + int(x.size[dim]) if index < 0 else index
    xl, sl = x.make_loader(), to_dtype(src, x.dtype).make_loader()

    def inner(idx: Sequence[Expr]) -> Any:
        at = ops.eq(ops.index_expr(idx[dim], torch.int64), ops.constant(index, torch.int64))
        return ops.where(at, sl([*idx[:dim], *idx[dim + 1 :]]), xl(idx))

    return Pointwise(x.device, x.dtype, x.size, inner)


@register_lowering(aten.copy)
def copy(x: TensorValue, src: TensorValue, non_blocking: bool = False) -> TensorValue:
    value = to_dtype(src, x.dtype) if isinstance(src, TensorValue) else src
    loader = broadcast_loader(value, x.size)
    return Pointwise(x.device, x.dtype, x.size, loader)
