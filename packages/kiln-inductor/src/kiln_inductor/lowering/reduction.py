"""Lowerings of reductions: sum, prod, mean, amax/amin, max/min with indices, argmax/argmin,
any/all, var/std/var_mean (one Welford pass), and softmax/log_softmax.

Producers are inlined into the reduction body (the pointwise → reduction fusion); the
reduction result is realized into a buffer that the scheduler may keep in a register when
only its own kernel reads it.

Split reductions: a reduction into few outputs over many elements (a weight or bias
gradient summing 4096 rows into 768 columns, a loss) gives a GPU too few programs: one per
block of outputs. Where the backend asks for it (``reduction_splits(device, outputs,
elements, inner)``, kiln-triton on GPUs; ``inner``: the reduced dimensions are the
innermost, so that each output is a row of its own), such a reduction is two: the first
reduces each of ``splits`` equal pieces of every output's elements into a partial buffer of
shape ``(splits, *outputs)`` (the piece index first, so that neighbouring programs read
neighbouring outputs), the second reduces the partials. Only associative reductions (and
Welford's mean and M2, combined as Chan et al. do) of static sizes whose element count the
split divides are split; the order of a sum changes (pieces of a few hundred elements, then
their sum), as in any parallel reduction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..backend import registered_backends
from ..ir.nodes import Reduction, TensorValue
from ..ir.ops import ops
from ..ir.symbols import Expr, product, unflatten_index
from .context import current_graph
from .pointwise import div, exp, sub
from .registry import register_lowering
from .values import compute_dtype, normalize_dims, pointwise, promote, to_dtype
from .views import unsqueeze

aten = torch.ops.aten


def reduce(
    x: TensorValue,
    dims: Any,
    keepdim: bool,
    rtype: str,
    out_dtype: torch.dtype,
    src_dtype: torch.dtype | None = None,
) -> TensorValue:
    """Realize a reduction of ``x`` over ``dims`` (all when empty) into a buffer."""
    src_dtype = compute_dtype(src_dtype or x.dtype)
    rdims, out_size, r_size, inner, inner_dims = _body(x, dims, src_dtype)
    splits = _splits(x.device, rtype, out_size, r_size, inner_dims)
    out: TensorValue
    if splits > 1:
        out = _split_reduce(x.device, rtype, out_dtype, src_dtype, out_size, r_size, inner, splits)
    else:
        red = Reduction(x.device, out_dtype, out_size, r_size, rtype, inner, src_dtype)
        out = current_graph().realize_reduction(red)
    if keepdim:
        for d in rdims:
            out = unsqueeze(out, d)
    return out


def _body(x: TensorValue, dims: Any, src_dtype: torch.dtype) -> tuple:
    """``(reduced dims, output sizes, reduced sizes, inner_fn(index, rindex), whether the
    reduced dims are the innermost)`` of a reduction of ``x`` over ``dims``."""
    ndim = x.ndim
    rdims = normalize_dims(dims, ndim)
    kept = [k for k in range(ndim) if k not in rdims]
    loader = x.make_loader()
    xdt = x.dtype

    def inner(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        full: list[Expr] = [sympy.Integer(0)] * ndim
        for k, i in zip(kept, index):
            full[k] = i
        for k, r in zip(rdims, rindex):
            full[k] = r
        v = loader(full)
        return ops.to_dtype(v, src_dtype) if xdt != src_dtype else v

    out_size = tuple(x.size[k] for k in kept)
    r_size = tuple(x.size[k] for k in rdims)
    innermost = rdims == list(range(ndim - len(rdims), ndim))
    return rdims, out_size, r_size, inner, innermost


SPLITTABLE = frozenset({"sum", "prod", "max", "min", "any", "all"})


def _splits(device: torch.device, rtype: str, out_size: tuple, r_size: tuple, inner: bool) -> int:
    """Into how many pieces the backend splits this reduction's elements (1: not split);
    ``inner``: the reduced dimensions are the innermost ones (rows, not columns)."""
    if rtype not in SPLITTABLE or not r_size:
        return 1
    outputs, elements = product(out_size), product(r_size)
    if not (outputs.is_Integer and elements.is_Integer):
        return 1
    hint = getattr(registered_backends().get(device.type), "reduction_splits", None)
    splits = int(hint(device, int(outputs), int(elements), inner)) if hint is not None else 1
    return splits if splits > 1 and int(elements) % splits == 0 else 1


def _pieces(inner: Any, r_size: tuple, splits: int) -> tuple[int, Any]:
    """``(piece length, body)``: the body reduces piece ``index[0]`` of the elements
    ``inner`` reduces, for the outputs ``index[1:]``."""
    chunk = int(product(r_size)) // splits

    def partial_fn(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        flat = index[0] * chunk + rindex[0]
        return inner(index[1:], unflatten_index(flat, r_size))

    return chunk, partial_fn


def _split_reduce(
    device: torch.device,
    rtype: str,
    out_dtype: torch.dtype,
    src_dtype: torch.dtype,
    out_size: tuple,
    r_size: tuple,
    inner: Any,
    splits: int,
) -> TensorValue:
    """The reduction as partial results of ``splits`` pieces, then their reduction (module
    docstring, "Split reductions")."""
    chunk, partial_fn = _pieces(inner, r_size, splits)
    part = Reduction(
        device,
        out_dtype,
        (sympy.Integer(splits), *out_size),
        (sympy.Integer(chunk),),
        rtype,
        partial_fn,
        src_dtype,
    )
    load = current_graph().realize_reduction(part).make_loader()

    def final_fn(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        return load([rindex[0], *index])

    final = Reduction(
        device, out_dtype, out_size, (sympy.Integer(splits),), rtype, final_fn, out_dtype
    )
    return current_graph().realize_reduction(final)


def _sum_dtype(x: TensorValue, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return torch.int64 if (not x.dtype.is_floating_point and not x.dtype.is_complex) else x.dtype


@register_lowering(aten.sum)
def sum_(
    x: TensorValue, dims: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None
) -> TensorValue:
    dt = _sum_dtype(x, dtype)
    acc = compute_dtype(dt)
    return to_dtype(reduce(x, dims, keepdim, "sum", acc, acc), dt)


@register_lowering(aten.prod)
def prod(
    x: TensorValue, dim: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None
) -> TensorValue:
    dt = _sum_dtype(x, dtype)
    acc = compute_dtype(dt)
    return to_dtype(reduce(x, dim, keepdim, "prod", acc, acc), dt)


@register_lowering(aten.mean)
def mean(
    x: TensorValue, dims: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None
) -> TensorValue:
    dt = dtype or x.dtype
    n = _count(x, dims)
    s = reduce(x, dims, keepdim, "sum", compute_dtype(dt), compute_dtype(dt))
    return to_dtype(
        pointwise(
            lambda v: ops.truediv(v, ops.constant(n, compute_dtype(dt))), [s], compute_dtype(dt)
        ),
        dt,
    )


def _count(x: TensorValue, dims: Any) -> Expr:
    return product(x.size[d] for d in normalize_dims(dims, x.ndim))


@register_lowering(aten.amax, aten.amin)
def _amax_amin(x: TensorValue, dims: Any = (), keepdim: bool = False) -> TensorValue:
    from .context import current_node

    is_max = current_node().target.overloadpacket is aten.amax
    return amax(x, dims, keepdim) if is_max else reduce(x, dims, keepdim, "min", x.dtype)


def amax(x: TensorValue, dims: Any, keepdim: bool) -> TensorValue:
    return to_dtype(reduce(x, dims, keepdim, "max", compute_dtype(x.dtype)), x.dtype)


@register_lowering(aten.max, aten.min)
def _max_min(x: TensorValue, dim: Any = None, keepdim: bool = False) -> Any:
    from .context import current_node

    kind = "max" if current_node().target.overloadpacket is aten.max else "min"
    if dim is None or isinstance(dim, TensorValue):
        if isinstance(dim, TensorValue):  # max.other == maximum
            return pointwise(getattr(ops, kind + "imum"), [x, dim], promote(x, dim))
        return to_dtype(reduce(x, None, False, kind, compute_dtype(x.dtype)), x.dtype)
    values = to_dtype(reduce(x, dim, keepdim, kind, compute_dtype(x.dtype)), x.dtype)
    indices = reduce(x, dim, keepdim, "arg" + kind, torch.int64)
    return values, indices


@register_lowering(aten.argmax, aten.argmin)
def _argmax(x: TensorValue, dim: int | None = None, keepdim: bool = False) -> TensorValue:
    from .context import current_node

    kind = "argmax" if current_node().target.overloadpacket is aten.argmax else "argmin"
    if dim is None:
        from .views import view

        flat = view(x, [-1])
        out = reduce(flat, [0], False, kind, torch.int64)
        return view(out, [1] * x.ndim) if keepdim else out
    return reduce(x, dim, keepdim, kind, torch.int64)


@register_lowering(aten.any, aten.all)
def _any_all(x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    from .context import current_node

    kind = "any" if current_node().target.overloadpacket is aten.any else "all"
    return reduce(to_dtype(x, torch.bool), dim, keepdim, kind, torch.bool, torch.bool)


def welford(x: TensorValue, dims: Any, keepdim: bool) -> tuple[TensorValue, TensorValue]:
    """(mean, sum of squared deviations) of one Welford pass over ``dims``."""
    acc = compute_dtype(x.dtype if x.dtype.is_floating_point else torch.get_default_dtype())
    rdims, out_size, r_size, inner, innermost = _body(x, dims, acc)
    splits = _splits(x.device, "sum", out_size, r_size, innermost)
    if splits > 1:
        m, m2 = _split_welford(x.device, acc, out_size, r_size, inner, splits)
        if keepdim:
            for d in rdims:
                m, m2 = unsqueeze(m, d), unsqueeze(m2, d)
        return m, m2
    m = reduce(x, dims, keepdim, "welford_mean", acc, acc)
    m2 = _shared_reduce(m, x, dims, keepdim, "welford_m2", acc)
    return m, m2


def _split_welford(
    device: torch.device, acc: torch.dtype, out_size: tuple, r_size: tuple, inner: Any, splits: int
) -> tuple[TensorValue, TensorValue]:
    """Welford over ``splits`` equal pieces (one pass, mean and M2 of each piece from one
    accumulator), then the pieces combined (Chan et al.): with n elements a piece, the mean
    is the pieces' mean and M2 = sum(M2_i) + n * sum((mean_i - mean)^2). Batch norm's
    statistics over (N, H, W) for a few hundred channels fill a GPU this way."""
    graph = current_graph()
    chunk, partial_fn = _pieces(inner, r_size, splits)
    psize = (sympy.Integer(splits), *out_size)
    pieces = (sympy.Integer(chunk),)
    # one body for both, so that the backend computes them from one accumulator
    means = graph.realize_reduction(
        Reduction(device, acc, psize, pieces, "welford_mean", partial_fn, acc)
    ).make_loader()
    m2s = graph.realize_reduction(
        Reduction(device, acc, psize, pieces, "welford_m2", partial_fn, acc)
    ).make_loader()
    whole = (sympy.Integer(splits),)
    total = graph.realize_reduction(
        Reduction(device, acc, out_size, whole, "sum", lambda i, r: means([r[0], *i]), acc)
    )
    mean = pointwise(lambda t: ops.truediv(t, ops.constant(float(splits), acc)), [total], acc)
    mean_at = graph.realize(mean).make_loader()

    def spread(i: Sequence[Expr], r: Sequence[Expr]) -> Any:
        d = ops.sub(means([r[0], *i]), mean_at(i))
        return ops.mul(d, d)

    between = graph.realize_reduction(Reduction(device, acc, out_size, whole, "sum", spread, acc))
    within = graph.realize_reduction(
        Reduction(device, acc, out_size, whole, "sum", lambda i, r: m2s([r[0], *i]), acc)
    )
    m2 = pointwise(
        lambda w, b: ops.add(w, ops.mul(b, ops.constant(float(chunk), acc))), [within, between], acc
    )
    return graph.realize(mean), m2


def _shared_reduce(
    first: TensorValue, x: TensorValue, dims: Any, keepdim: bool, rtype: str, dtype: torch.dtype
) -> TensorValue:
    """A second reduction over the very same body as ``first`` (so a backend can compute both
    from one accumulator)."""
    graph = current_graph()
    buf = graph.ir.nodes[-1]
    body = buf.body  # type: ignore[union-attr]
    red = Reduction(
        body.device, dtype, body.size, body.reduction_ranges, rtype, body.inner_fn, body.src_dtype
    )
    out: TensorValue = graph.realize_reduction(red)
    if keepdim:
        for d in normalize_dims(dims, x.ndim):
            out = unsqueeze(out, d)
    return out


def _correction(correction: Any, unbiased: Any) -> float:
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased is None or unbiased else 0.0


@register_lowering(aten.var_mean)
def var_mean(
    x: TensorValue,
    dims: Any = None,
    unbiased: Any = None,
    keepdim: bool = False,
    *,
    correction: Any = None,
) -> tuple[TensorValue, TensorValue]:
    if isinstance(unbiased, bool) or unbiased is None:
        corr = _correction(correction, unbiased)
    else:  # var_mean(x, dims, correction=...) positional forms
        corr = _correction(correction, unbiased)
    m, m2 = welford(x, dims, keepdim)
    n = _count(x, dims)
    dt = m.dtype

    def var(v: Any) -> Any:
        return ops.truediv(v, ops.constant(max(float(n) - corr, 0.0), dt))

    out_dtype = x.dtype if x.dtype.is_floating_point else dt
    return to_dtype(pointwise(var, [m2], dt), out_dtype), to_dtype(m, out_dtype)


@register_lowering(aten.var)
def var(
    x: TensorValue,
    dims: Any = None,
    unbiased: Any = None,
    keepdim: bool = False,
    *,
    correction: Any = None,
) -> TensorValue:
    return var_mean(x, dims, unbiased, keepdim, correction=correction)[0]


@register_lowering(aten.std)
def std(
    x: TensorValue,
    dims: Any = None,
    unbiased: Any = None,
    keepdim: bool = False,
    *,
    correction: Any = None,
) -> TensorValue:
    v = var_mean(x, dims, unbiased, keepdim, correction=correction)[0]
    return pointwise(ops.sqrt, [v], v.dtype)


@register_lowering(aten._softmax)
def softmax(x: TensorValue, dim: int, half_to_float: bool = False) -> TensorValue:
    out_dtype = torch.float32 if half_to_float else x.dtype
    xc = to_dtype(x, compute_dtype(x.dtype))
    m = amax(xc, [dim], True)
    e = exp(sub(xc, m))
    s = sum_(e, [dim], True)
    return to_dtype(div(e, s), out_dtype)


@register_lowering(aten._log_softmax)
def log_softmax(x: TensorValue, dim: int, half_to_float: bool = False) -> TensorValue:
    out_dtype = torch.float32 if half_to_float else x.dtype
    xc = to_dtype(x, compute_dtype(x.dtype))
    m = amax(xc, [dim], True)
    shifted = sub(xc, m)
    s = sum_(exp(shifted), [dim], True)
    return to_dtype(sub(shifted, pointwise(ops.log, [s], s.dtype)), out_dtype)


@register_lowering(aten.logsumexp)
def logsumexp(x: TensorValue, dims: Any, keepdim: bool = False) -> TensorValue:
    xc = to_dtype(x, compute_dtype(promote(x, int_to_float=True)))
    m = amax(xc, dims, True)
    mm = pointwise(
        lambda v: ops.where(ops.isinf(v), ops.constant(0.0, v_dtype(xc)), v), [m], m.dtype
    )
    s = sum_(exp(sub(xc, mm)), dims, keepdim)
    from .views import squeeze

    mk = mm if keepdim else squeeze(mm, normalize_dims(dims, x.ndim))
    return pointwise(lambda a, b: ops.add(ops.log(a), b), [s, mk], s.dtype)


def v_dtype(x: TensorValue) -> torch.dtype:
    return x.dtype
