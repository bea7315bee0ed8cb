"""Decompositions of ops that read a tensor at computed positions (``take``, ``bucketize``)
into ``index.Tensor`` and pointwise ops.

torch's own decompositions of these index with Python's ``t[i]``: for a 0-dim integer
``i`` (a 0-dim input of ``take``, a 0-dim ``bucketize`` input) Python indexing takes
``i.item()`` and selects, which no trace can do without the data. ``aten.index.Tensor``
with ``[i]`` computes the same values for every shape of ``i`` and stays in the graph.
"""

from __future__ import annotations

import torch

from kiln_aot.decompositions.registry import register

aten = torch.ops.aten


@register(aten.take.default)
def take(x, index):
    return aten.index.Tensor(aten.reshape.default(x, [-1]), [index])


@register(aten.bucketize.Tensor)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    """Eager's binary search (the first boundary ``>= x``, or ``> x`` when ``right``),
    every element stepping at once: ``n.bit_length()`` steps, the most the search takes
    over ``n`` boundaries, each a gather and a compare; elements whose search has ended
    keep their result. The first step compares every element with the middle boundary."""
    if boundaries.dim() != 1:
        return NotImplemented  # torch's decomposition raises eager's error
    n = int(boundaries.shape[0])  # the step count: a symbolic length is specialized
    dtype = torch.int32 if out_int32 else torch.int64
    if n == 0:
        return aten.full.default(list(x.shape), 0, dtype=dtype, device=x.device)
    common = torch.promote_types(x.dtype, boundaries.dtype)  # eager compares in it
    x, boundaries = _as_dtype(x, common), _as_dtype(boundaries, common)
    mid = n // 2
    stop = _stop(aten.select.int(boundaries, 0, mid), x, right)
    start = aten.where.self(stop, _int(0, x), _int(mid + 1, x))
    end = aten.where.self(stop, _int(mid, x), _int(n, x))
    for _ in range(n.bit_length() - 1):
        searching = aten.lt.Tensor(start, end)
        half = aten.div.Scalar_mode(aten.sub.Tensor(end, start), 2, rounding_mode="floor")
        mid = aten.add.Tensor(start, half)
        # an ended search may have mid == n: it reads the last boundary, and is not moved
        value = aten.index.Tensor(boundaries, [aten.clamp.default(mid, None, n - 1)])
        stop = _stop(value, x, right)
        up = aten.logical_and.default(searching, aten.logical_not.default(stop))
        down = aten.logical_and.default(searching, stop)
        start = aten.where.self(up, aten.add.Tensor(mid, 1), start)
        end = aten.where.self(down, mid, end)
    return _as_dtype(start, dtype)


def _stop(value, x, right):
    """Eager's test, written as it is so that a NaN on either side moves the search right."""
    return aten.gt.Tensor(value, x) if right else aten.ge.Tensor(value, x)


def _int(value, like):
    return aten.scalar_tensor.default(value, dtype=torch.int64, device=like.device)


def _as_dtype(t, dtype):
    return t if t.dtype == dtype else aten._to_copy.default(t, dtype=dtype)


@register(aten.bucketize.Scalar)
def bucketize_scalar(x, boundaries, *, out_int32=False, right=False):
    dtype = torch.result_type(boundaries, x)
    value = aten.scalar_tensor.default(x, dtype=dtype, device=boundaries.device)
    return bucketize(value, boundaries, out_int32=out_int32, right=right)
