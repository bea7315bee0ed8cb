"""Lowerings of scatters: index_put, scatter, scatter_add, scatter_reduce (sum),
index_add and embedding_dense_backward, each as one ``Scatter`` buffer.

How a scatter is built
----------------------
``scatter_into`` computes a copy of ``self`` (the *base*: a pointwise buffer, fused like
any other), then a ``Scatter`` node that updates the base in place (memory planning gives
the scatter's buffer the base's storage): for every element of the update space, one
target element of the base is set (``store``) or grows (``add``). The update space and
the target are the op's: ``x[i] += v`` loops over ``v``'s (broadcast) shape, the target
takes its indexed coordinates from the index tensors; scatter_add over ``index``'s shape,
``dim`` taken from ``index``. Every indirect coordinate is checked (``index_check``) with
eager's exception; a lane with a bad index writes nothing.

Dimensions of the update space that are a coordinate of the target themselves can never
send two updates to one element; the others (``Scatter.serial``) can. kiln-cpp runs the
former in parallel and the latter in order inside each (no atomics; sums in eager's
order), kiln-triton adds atomically.

Sums of bfloat16/float16 (and of 8/16-bit ints) accumulate in float32 (int32) and are
converted at the end, as eager's CUDA kernels and torch's decompositions do; atomic adds
exist for those types everywhere. A backend says it generates scatters with a true
``supports_scatter`` attribute; elsewhere the op runs as a library call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from ..backend import registered_backends
from ..index_check import OUT_OF_BOUNDS, IndexCheck, index_check
from ..ir.nodes import ComputedBuffer, Layout, Pointwise, Scatter, StorageView, TensorValue
from ..ir.ops import ops
from ..ir.symbols import Expr, sym
from .context import current_graph, node_val
from .graph_unsupported import unsupported
from .registry import register_lowering
from .tensors import advanced_index
from .values import broadcast_loader, compute_dtype, normalize_dim, to_dtype

aten = torch.ops.aten

# what sums accumulate in (atomic adds of these exist on every backend and GPU)
_ACCUMULATE = {
    torch.bfloat16: torch.float32,
    torch.float16: torch.float32,
    torch.int8: torch.int32,
    torch.uint8: torch.int32,
    torch.int16: torch.int32,
}

Update = Callable[[Sequence[Expr]], tuple[Sequence[Expr], Any]]


def backend_supports_scatter(device: torch.device) -> bool:
    """Both of kiln's backends generate scatters; with no backend registered yet
    (lowering alone, in tests) they are lowered too."""
    backend = registered_backends().get(device.type)
    return backend is None or bool(getattr(backend, "supports_scatter", False))


def _layout(device: torch.device, dtype: torch.dtype, size: Sequence[Expr]) -> Layout:
    """Eager's strides for the result where they are a dense permutation (the op's
    meta value), else contiguous."""
    from ..graph import _dense_layout

    val = node_val()
    if (
        isinstance(val, torch.Tensor)
        and tuple(sym(s) for s in val.shape) == tuple(size)
        and val.dtype in (dtype, _ACCUMULATE.get(val.dtype))
    ):
        lay = _dense_layout(val, device)
        return Layout(device, dtype, lay.size, lay.stride)
    return Layout.contiguous(device, dtype, size)


def scatter_into(
    x: TensorValue,
    ranges: Sequence[Expr],
    update: Update,
    mode: str,
    serial: Sequence[int],
) -> TensorValue:
    """``x`` with the updates of ``update`` (``index -> (target, value)`` over
    ``ranges``) stored or added (``mode``); see the module docstring."""
    if not backend_supports_scatter(x.device):
        raise unsupported(f"the kernel backend for {x.device.type} tensors generates no scatters")
    if mode == "add" and x.dtype == torch.bool:
        raise unsupported("adding into a bool tensor")
    graph = current_graph()
    acc = _ACCUMULATE.get(x.dtype, x.dtype) if mode == "add" else x.dtype
    size = tuple(x.size)
    layout = _layout(x.device, acc, size)
    init = to_dtype(x, acc).make_loader()
    base = ComputedBuffer(
        graph.new_name(), layout, Pointwise(x.device, acc, size, init), graph.origin()
    )
    graph.add_node(base)
    if any(s == 0 for s in ranges) or any(s == 0 for s in size):
        out: TensorValue = StorageView(base, layout)
    else:

        def inner(index: Sequence[Expr]) -> tuple[Sequence[Expr], Any]:
            target, value = update(index)
            return target, ops.to_dtype(value, acc)

        body = Scatter(x.device, acc, size, tuple(ranges), inner, mode, base.name, tuple(serial))
        node = ComputedBuffer(graph.new_name(), layout, body, graph.origin())
        graph.add_node(node)
        out = StorageView(node, layout)
    return to_dtype(out, x.dtype) if acc != x.dtype else out


def _indirect(value: Any, size: Expr, check: IndexCheck | None) -> Expr:
    return ops.indirect_indexing(value, size, check)


# -- index_put ------------------------------------------------------------------------------


@register_lowering(aten.index_put, aten._unsafe_index_put)
def index_put(
    x: TensorValue,
    indices: Sequence[TensorValue | None],
    values: TensorValue,
    accumulate: bool = False,
) -> TensorValue:
    if all(t is None for t in indices):
        raise unsupported("index_put without an index tensor")
    adv = advanced_index(x, indices, wrap=True, message=OUT_OF_BOUNDS)
    vl = broadcast_loader(to_dtype(values, x.dtype), adv.size)
    mode = "add" if accumulate else "store"
    return scatter_into(x, adv.size, lambda idx: (adv.source(idx), vl(idx)), mode, adv.indexed)


# -- scatter, scatter_add, scatter_reduce ---------------------------------------------------


def _src_ndim(src: Any) -> int:
    return src.ndim if isinstance(src, TensorValue) else 0


def _scatter(x: TensorValue, dim: int, index: TensorValue, src: Any, mode: str) -> TensorValue:
    if index.ndim != x.ndim or x.ndim == 0 and _src_ndim(src) != 0:
        raise unsupported("a scatter whose index has another rank than self")
    dim = normalize_dim(dim, max(x.ndim, 1))
    il = index.make_loader()
    n = x.size[dim] if x.ndim else sympy.Integer(1)  # a 0-d tensor is one element
    check = index_check(dim, n, wrap=False, error=RuntimeError, index=index)
    if isinstance(src, TensorValue):
        sl = to_dtype(src, x.dtype).make_loader()
    else:
        sl = lambda idx: ops.constant(src, compute_dtype(x.dtype))

    def update(idx: Sequence[Expr]) -> tuple[Sequence[Expr], Any]:
        target = list(idx)
        at = _indirect(il(idx), n, check)
        if x.ndim:
            target[dim] = at
        return target, sl(idx)

    return scatter_into(x, tuple(index.size), update, mode, (dim,) if x.ndim else ())


@register_lowering(aten.scatter)
def scatter(
    x: TensorValue, dim: int, index: TensorValue, src: Any, reduce: str | None = None
) -> TensorValue:
    if reduce not in (None, "add"):
        raise unsupported(f"scatter with reduce={reduce!r}")
    return _scatter(x, dim, index, src, "store" if reduce is None else "add")


@register_lowering(aten.scatter_add)
def scatter_add(x: TensorValue, dim: int, index: TensorValue, src: TensorValue) -> TensorValue:
    return _scatter(x, dim, index, src, "add")


@register_lowering(aten.scatter_reduce)
def scatter_reduce(
    x: TensorValue,
    dim: int,
    index: TensorValue,
    src: TensorValue,
    reduce: str,
    include_self: bool = True,
) -> TensorValue:
    if reduce != "sum":
        raise unsupported(f"scatter_reduce with reduce={reduce!r}")
    if not include_self:  # the elements it reaches start from zero
        x = _scatter(x, dim, index, 0, "store")
    return _scatter(x, dim, index, src, "add")


# -- index_add ------------------------------------------------------------------------------


@register_lowering(aten.index_add)
def index_add(
    x: TensorValue, dim: int, index: TensorValue, source: TensorValue, alpha: Any = 1
) -> TensorValue:
    if source.ndim != x.ndim or index.ndim > 1:
        raise unsupported("index_add with a source of another rank than self")
    dim = normalize_dim(dim, max(x.ndim, 1))
    il = index.make_loader()
    n = x.size[dim] if x.ndim else sympy.Integer(1)  # a 0-d tensor is one element
    # eager's CPU kernel: along the first or last dimension of a self of 2 or more
    # dimensions it raises RuntimeError; otherwise (0-d, 1-d, middle dimensions) it takes
    # a row loop that raises IndexError
    iterated = x.ndim > 1 and dim in (0, x.ndim - 1)
    check = (
        index_check(dim, n, wrap=False, error=RuntimeError, index=index)
        if iterated
        else index_check(dim, n, wrap=False, message="index out of range in self", index=index)
    )
    sl = to_dtype(source, x.dtype).make_loader()

    def update(idx: Sequence[Expr]) -> tuple[Sequence[Expr], Any]:
        target = list(idx)
        # (a 0-d self: one update, from the index's one element)
        at = _indirect(il([idx[dim] if x.ndim else sympy.Integer(0)] * index.ndim), n, check)
        if x.ndim:
            target[dim] = at
        v = sl(idx)
        if alpha != 1:
            cdt = compute_dtype(x.dtype)
            v = ops.mul(ops.to_dtype(v, cdt), ops.constant(alpha, cdt))
        return target, v

    return scatter_into(x, tuple(source.size), update, "add", (dim,) if x.ndim else ())


# -- embedding_dense_backward ---------------------------------------------------------------


@register_lowering(aten.embedding_dense_backward)
def embedding_dense_backward(
    grad: TensorValue,
    indices: TensorValue,
    num_weights: Any,
    padding_idx: int,
    scale_grad_by_freq: bool,
) -> TensorValue:
    """``zeros(num_weights, D).index_put_([indices], grad, accumulate=True)``, with the
    rows of ``padding_idx`` left zero and, under ``scale_grad_by_freq``, each id's rows
    divided by how often it occurs (a scatter of ones counts them first)."""
    from .tensors import full

    n = sym(num_weights)
    dim = grad.size[-1]
    ishape = tuple(indices.size)
    space = (*ishape, dim)
    k = len(ishape)
    il = indices.make_loader()
    check = index_check(0, n, wrap=False, message="index out of range in self", index=indices)
    acc = _ACCUMULATE.get(grad.dtype, grad.dtype)
    gl = to_dtype(grad, acc).make_loader()
    counts = None
    if scale_grad_by_freq:

        def count(idx: Sequence[Expr]) -> tuple[Sequence[Expr], Any]:
            return [_indirect(il(idx), n, check)], ops.constant(1, torch.int32)

        counts = scatter_into(full((n,), 0, torch.int32, grad.device), ishape, count, "add", ())
        counts = current_graph().realize(counts)
    cl = counts.make_loader() if counts is not None else None

    def update(idx: Sequence[Expr]) -> tuple[Sequence[Expr], Any]:
        ids = il(idx[:k])
        row = _indirect(ids, n, check)
        v = gl(idx)
        if cl is not None:
            c = ops.to_dtype(cl([row]), acc)
            v = ops.truediv(v, c)
        if padding_idx >= 0:
            pad = ops.eq(ops.to_dtype(ids, torch.int64), ops.constant(padding_idx, torch.int64))
            v = ops.where(pad, ops.constant(0, acc), v)
        return [row, idx[k]], v

    zeros = full((n, dim), 0, acc, grad.device)
    out = scatter_into(zeros, space, update, "add", tuple(range(k)))
    return to_dtype(out, grad.dtype) if acc != grad.dtype else out
