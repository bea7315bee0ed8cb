"""Ops called from ATen on purpose (extern kernels: matmuls, convolution, attention) and
ops known to run eagerly (fallbacks: random numbers, data-dependent shapes, scatter)."""

from __future__ import annotations

import torch

from .registry import register_extern, register_fallback

aten = torch.ops.aten

register_extern(
    aten.mm,
    aten.bmm,
    aten.addmm,
    aten.baddbmm,
    aten.mv,
    aten.dot,
    aten.convolution,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_flash_attention,
)

register_fallback(
    "random numbers come from ATen's generator so that results match eager's seeding",
    aten.rand,
    aten.randn,
    aten.rand_like,
    aten.randn_like,
    aten.randint,
    aten.randint_like,
    aten.bernoulli,
    aten.native_dropout,
    aten.normal,
    aten.uniform,
    aten.randperm,
    aten.multinomial,
)
register_fallback(
    "its output shape depends on the data",
    aten.nonzero,
    aten.masked_select,
    aten.unique_dim,
    aten._unique2,
)
register_fallback(
    "backward kernels of convolution and pooling run in ATen",
    aten.convolution_backward,
    aten.max_pool2d_with_indices_backward,
    aten.avg_pool2d_backward,
    aten._adaptive_avg_pool2d_backward,
)
register_fallback(
    "scatters, sorts and these special functions are not lowered yet",
    aten.erfinv,
    aten.as_strided_scatter,
    aten.diagonal_scatter,
    aten.scatter,
    aten.scatter_add,
    aten.scatter_reduce,
    aten.index_put,
    aten.sort,
    aten.topk,
    aten.index_add,
)
