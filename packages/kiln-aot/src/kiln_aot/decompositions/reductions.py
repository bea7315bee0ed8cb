"""Decompositions of means, variances and whole-tensor sums into ``sum`` + pointwise."""

from __future__ import annotations

import math

import torch

from kiln_aot.decompositions.registry import register

aten = torch.ops.aten


def reduced_dims(x, dims) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.dim()))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(d % max(x.dim(), 1) for d in dims)


def count(x, dims) -> int:
    return math.prod(x.shape[d] for d in dims) if x.dim() else 1


@register(aten.sum.default)
def sum_all(x, *, dtype=None):
    return aten.sum.dim_IntList(x, list(range(x.dim())), False, dtype=dtype)


@register(aten.mean.dim)
def mean(x, dim, keepdim=False, *, dtype=None):
    dims = reduced_dims(x, dim)
    total = aten.sum.dim_IntList(x, dims, keepdim, dtype=dtype)
    return aten.div.Tensor(total, count(x, dims))


@register(aten.mean.default)
def mean_all(x, *, dtype=None):
    return mean(x, None, False, dtype=dtype)


def var_and_mean(x, dims, correction, keepdim):
    n = count(x, dims)
    m = aten.div.Tensor(aten.sum.dim_IntList(x, dims, True), n)
    # one element per row: its deviation is exactly 0 (x * 0 keeps inf and NaN as NaN, as
    # eager's Welford does). x - m would be ~1 ulp where a compiler recomputes x in the
    # second loop with other rounding, and var's 0/0 = NaN would become inf.
    d = aten.mul.Tensor(x, 0) if n == 1 else aten.sub.Tensor(x, m)
    ss = aten.sum.dim_IntList(aten.mul.Tensor(d, d), dims, keepdim)
    var = aten.div.Tensor(ss, max(n - correction, 0))
    if not keepdim:
        m = aten.squeeze.dims(m, dims)
    return var, m


@register(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    dims = reduced_dims(x, dim)
    return var_and_mean(x, dims, 1 if correction is None else correction, keepdim)[0]


@register(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    dims = reduced_dims(x, dim)
    return var_and_mean(x, dims, 1 if correction is None else correction, keepdim)


@register(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return aten.sqrt.default(var(x, dim, correction=correction, keepdim=keepdim))
