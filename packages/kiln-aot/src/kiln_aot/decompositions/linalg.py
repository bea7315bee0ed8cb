"""``addmm``-style ops become ``mm``/``bmm`` plus a pointwise epilogue the compiler fuses."""

from __future__ import annotations

import torch

from kiln_aot.decompositions.registry import register

aten = torch.ops.aten


def _epilogue(out, bias, beta, alpha):
    if alpha != 1:
        out = aten.mul.Tensor(out, alpha)
    if beta == 0:
        return out
    if beta != 1:
        bias = aten.mul.Tensor(bias, beta)
    return aten.add.Tensor(out, bias)


@register(aten.addmm.default)
def addmm(bias, m1, m2, *, beta=1, alpha=1):
    return _epilogue(aten.mm.default(m1, m2), bias, beta, alpha)


@register(aten.baddbmm.default)
def baddbmm(bias, b1, b2, *, beta=1, alpha=1):
    return _epilogue(aten.bmm.default(b1, b2), bias, beta, alpha)


@register(aten.addmv.default)
def addmv(bias, mat, vec, *, beta=1, alpha=1):
    out = aten.squeeze.dims(aten.mm.default(mat, aten.unsqueeze.default(vec, 1)), [1])
    return _epilogue(out, bias, beta, alpha)


@register(aten.mv.default)
def mv(mat, vec):
    return aten.squeeze.dims(aten.mm.default(mat, aten.unsqueeze.default(vec, 1)), [1])


@register(aten.dot.default)
def dot(a, b):
    return aten.sum.dim_IntList(aten.mul.Tensor(a, b), [0])
