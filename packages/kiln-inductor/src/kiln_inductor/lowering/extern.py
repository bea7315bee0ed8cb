"""Ops called from ATen on purpose (extern kernels: matmuls, convolution, attention) and
ops known to run eagerly (fallbacks: random numbers, data-dependent shapes, sorts)."""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx

from ..ir.nodes import Layout, StorageView, TensorValue, View
from ..ir.symbols import FloorDiv, size_hint, sym
from .context import current_graph, current_node
from .registry import register_extern, register_fallback, register_lowering

aten = torch.ops.aten

register_extern(
    aten.mm,
    aten.bmm,
    aten.addmm,
    aten.baddbmm,
    aten.mv,
    aten.dot,
    aten.convolution,
)

# torch.distributed's functional collectives and their wait (passes/collectives.py orders
# them): library calls by nature, present where torch was built with distributed support
_c10d = getattr(torch.ops, "_c10d_functional", None)
if torch.distributed.is_available() and _c10d is not None:
    register_extern(
        *(
            getattr(_c10d, name)
            for name in (
                "all_reduce",
                "all_reduce_coalesced",
                "all_gather_into_tensor",
                "all_gather_into_tensor_coalesced",
                "reduce_scatter_tensor",
                "reduce_scatter_tensor_coalesced",
                "all_to_all_single",
                "broadcast",
                "wait_tensor",
            )
            if hasattr(_c10d, name)
        )
    )

# Fused attention: kiln-aot keeps the kernel scaled_dot_product_attention picks (and its
# backward) as one op. Its outputs' strides follow its inputs' (CPU flash attention returns
# the query's layout), so the inputs are handed over in the strides they were traced with:
# the extern's outputs then have the strides the graph's metadata says.
ATTENTION_OPS = (
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
)


def _same_strides(layout: Layout, val: torch.Tensor) -> bool:
    return all(n == 1 or st == vs for st, vs, n in zip(layout.stride, val.stride(), val.shape))


def _in_traced_strides(value: Any, val: Any) -> Any:
    """``value`` in memory with the strides of ``val`` (its traced metadata)."""
    if not isinstance(value, TensorValue) or not isinstance(val, torch.Tensor):
        return value
    graph = current_graph()
    have = value if isinstance(value, StorageView) else None
    if have is None and isinstance(value, View):
        have = graph.as_strided_view(value)
    if have is not None and _same_strides(have.layout, val):
        return have
    return graph.realize(value, _dense_in_stride_order(val, value.device))


def _dense_in_stride_order(val: torch.Tensor, device: torch.device) -> Layout:
    """A dense layout ordering the dimensions as ``val``'s strides do (a sliced query,
    strides (3072, 16, 192, 1), becomes (1024, 16, 64, 1)), which the kernels read alike.
    Broadcast (stride 0) and size-1 dimensions go outermost: an attention mask expanded
    over batch and heads, strides (0, 0, 128, 1), keeps its last dimension contiguous,
    which CUDA's memory-efficient kernel requires of its bias."""
    st = [size_hint(x) for x in val.stride()]
    sizes = [sym(n) for n in val.shape]
    order = sorted(range(val.dim()), key=lambda d: (st[d] == 0 or sizes[d] == 1, st[d], -d))
    strides: list[Any] = [0] * val.dim()
    acc: Any = sympy.Integer(1)
    for d in order:
        strides[d] = acc
        acc = acc * (sizes[d] if not sizes[d].is_Integer else max(int(sizes[d]), 1))
    return Layout(device, val.dtype, tuple(sizes), tuple(strides))


# CUDA's memory-efficient attention reads its bias in 16-element aligned rows: eager pads
# the bias's last dimension (a decode step's mask of 25 keys has rows of 25 floats, which
# the kernel refuses). Position of the bias among each op's arguments:
_ALIGNED_BIAS = {
    aten._scaled_dot_product_efficient_attention.default: 3,
    aten._scaled_dot_product_efficient_attention_backward.default: 4,
}
BIAS_ALIGNMENT = 16


def _aligned_bias(value: Any, val: Any) -> Any:
    """``value`` realized with rows padded to ``BIAS_ALIGNMENT`` elements (the padding is
    never read), its last dimension contiguous, broadcast dimensions kept at stride 0."""
    if not isinstance(value, TensorValue) or not isinstance(val, torch.Tensor) or val.dim() < 2:
        return _in_traced_strides(value, val)
    dense = _dense_in_stride_order(val, value.device)
    size = list(dense.size)
    if dense.stride[-1] != 1:
        return _in_traced_strides(value, val)
    order = sorted(  # (symbolic strides ordered at the sizes' hints)
        range(len(size)),
        key=lambda d: (dense.stride[d] == 0 or size[d] == 1, size_hint(dense.stride[d])),
    )
    strides: list[Any] = [0] * len(size)
    acc: Any = sympy.Integer(1)
    for k, d in enumerate(order):
        strides[d] = acc
        n = (
            sympy.Max(size[d], 1)
            if not getattr(size[d], "is_Integer", False)
            else max(int(size[d]), 1)
        )
        acc = acc * n
        if k == 0:  # round the row up
            acc = FloorDiv(acc + BIAS_ALIGNMENT - 1, BIAS_ALIGNMENT) * BIAS_ALIGNMENT
    layout = Layout(value.device, val.dtype, tuple(size), tuple(sym(x) for x in strides))
    have = value if isinstance(value, StorageView) else None
    if have is not None and have.layout.stride == layout.stride:
        return have
    return current_graph().realize(value, layout)


def _extern_in_traced_strides(op: Any) -> Any:
    def lower(*args: Any, **kwargs: Any) -> Any:
        node = current_node()
        assert node is not None
        vals = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        bias_at = _ALIGNED_BIAS.get(op)
        args = tuple(
            _aligned_bias(a, v) if i == bias_at else _in_traced_strides(a, v)
            for i, (a, v) in enumerate(zip(args, vals[0]))
        )
        kwargs = {k: _in_traced_strides(a, vals[1].get(k)) for k, a in kwargs.items()}
        return current_graph().extern_call(op, args, kwargs, "extern")

    return lower


for _op in ATTENTION_OPS:
    register_lowering(_op)(_extern_in_traced_strides(_op))

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
# Data-dependent ops (kiln_shapes' unbacked symbols): library calls by nature; the wrapper
# binds the symbols their results give (ExternKernel.binds), so later kernels and
# allocations sized by them run in the same graph
DATA_DEPENDENT_EXTERNS = (
    aten.nonzero.default,
    aten.masked_select.default,
    aten.unique_dim.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
    aten._local_scalar_dense.default,
    aten.equal.default,
    aten.is_nonzero.default,
    aten.allclose.default,
)
register_extern(*DATA_DEPENDENT_EXTERNS)
# what kiln-aot assumed about such a value inside an op, checked when the graph runs
register_extern(aten._assert_scalar)
register_fallback(
    "backward kernels of convolution and pooling run in ATen",
    aten.convolution_backward,
    aten.max_pool2d_with_indices_backward,
    aten.avg_pool2d_backward,
    aten._adaptive_avg_pool2d_backward,
)
register_fallback(
    "these scatters, sorts and special functions are not lowered yet",
    aten.erfinv,
    aten.as_strided_scatter,
    aten.diagonal_scatter,
    aten.sort,
    aten.topk,
)
