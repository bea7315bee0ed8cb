"""The declared core ATen set: the only operators kiln-aot's graphs may contain.

# Core set

Every ``call_function`` node of a graph that kiln-aot hands to a compiler targets either an
OpOverload in ``CORE_ATEN_OPS``, an OpOverload in ``KEPT_OPS`` (composites kept on purpose
for the compiler to lower as a unit, or call as an extern kernel), or ``operator.getitem``
(taking an item of a multi-output op). Everything else is decomposed
(``kiln_aot.decompositions``) or rejected with ``kiln_aot.Unsupported``.

The set is smaller than PyTorch's own Core ATen IR where a decomposition fuses better:
``addmm`` is ``mm`` + ``add``, ``mean``/``var`` are ``sum`` + pointwise, softmax/layer_norm/
batch_norm/group_norm/gelu/silu are pointwise + reductions. Views stay views (``view``,
``permute``, ``expand``, ``slice``, ``select``, ``unsqueeze``, ``squeeze.dims``,
``as_strided``); writes through views are expressed with the ``*_scatter`` ops.
"""

from __future__ import annotations

import operator

import torch

aten = torch.ops.aten

_CORE_NAMES = """
abs acos acosh asin asinh atan atanh atan2 ceil cos cosh erf erfc erfinv exp exp2 expm1 floor
frac isinf isnan log log10 log1p log2 logical_not neg reciprocal relu round rsqrt sigmoid sign
signbit sin sinh sqrt tan tanh trunc bitwise_not
add.Tensor add.Scalar sub.Tensor sub.Scalar mul.Tensor mul.Scalar div.Tensor div.Scalar
div.Tensor_mode div.Scalar_mode remainder.Tensor remainder.Scalar fmod.Tensor fmod.Scalar
pow.Tensor_Tensor pow.Tensor_Scalar pow.Scalar maximum minimum
eq.Tensor eq.Scalar ne.Tensor ne.Scalar lt.Tensor lt.Scalar le.Tensor le.Scalar gt.Tensor
gt.Scalar ge.Tensor ge.Scalar logical_and logical_or logical_xor bitwise_and.Tensor
bitwise_or.Tensor bitwise_xor.Tensor bitwise_and.Scalar bitwise_or.Scalar bitwise_xor.Scalar
clamp.default clamp.Tensor where.self _to_copy clone
sum.dim_IntList prod.dim_int amax amin argmax argmin any.dim any.dims all.dim max.dim min.dim
cumsum
mm bmm convolution convolution_backward
view permute expand slice.Tensor select.int unsqueeze squeeze.dims as_strided
slice_scatter select_scatter diagonal_scatter as_strided_scatter
cat constant_pad_nd index.Tensor index_put.default index_select gather scatter.src
scatter.value scatter_add scatter_reduce.two sort topk
full scalar_tensor arange.start_step empty.memory_format empty_strided
rand.default randn.default bernoulli.p
max_pool2d_with_indices max_pool2d_with_indices_backward avg_pool2d avg_pool2d_backward
_adaptive_avg_pool2d _adaptive_avg_pool2d_backward
"""

# The fused attention kernels ``scaled_dot_product_attention`` dispatches to, and their
# backwards: kept as extern calls while ``config.fused_attention`` is on (the tracer
# decomposes them otherwise, where a decomposition exists).
_ATTENTION_NAMES = """
_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_flash_attention_for_cpu_backward
_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_backward
_scaled_dot_product_efficient_attention _scaled_dot_product_efficient_attention_backward
_scaled_dot_product_cudnn_attention _scaled_dot_product_cudnn_attention_backward
"""

# Composites kept whole: the compiler lowers them itself or calls them as extern kernels.
# (index_add: its decomposition, an index_put, would wrap negative indices and raise
# IndexError where index_add raises RuntimeError for them.)
_KEPT_NAMES = (
    """
native_dropout embedding embedding_dense_backward index_add
"""
    + _ATTENTION_NAMES
)


def _resolve(name: str) -> torch._ops.OpOverload:
    packet_name, _, overload = name.partition(".")
    packet = getattr(aten, packet_name)
    return getattr(packet, overload or "default")


def _resolve_all(names: str) -> frozenset[torch._ops.OpOverload]:
    return frozenset(_resolve(n) for n in names.split())


CORE_ATEN_OPS: frozenset[torch._ops.OpOverload] = _resolve_all(_CORE_NAMES)
KEPT_OPS: frozenset[torch._ops.OpOverload] = _resolve_all(_KEPT_NAMES)
ATTENTION_OPS: frozenset[torch._ops.OpOverload] = _resolve_all(_ATTENTION_NAMES)

# Ops a graph node may target besides core/kept OpOverloads.
GRAPH_HELPERS = frozenset({operator.getitem})

VIEW_OPS: frozenset[torch._ops.OpOverload] = frozenset(
    {
        aten.view.default,
        aten.permute.default,
        aten.expand.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.unsqueeze.default,
        aten.squeeze.dims,
        aten.as_strided.default,
    }
)


def is_random(target: object) -> bool:
    """Whether ``target`` draws from the RNG (``nondeterministic_seeded``): kept whole,
    never recomputed, never merged with another call."""
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in target.tags
    )


# Ops whose output shape depends on tensor data: tracing them raises Unsupported.
DATA_DEPENDENT_OPS: frozenset[torch._ops.OpOverload] = frozenset(
    {
        aten._local_scalar_dense.default,
        aten.nonzero.default,
        aten.masked_select.default,
        aten._unique2.default,
        aten.unique_dim.default,
        aten.unique_consecutive.default,
        aten.repeat_interleave.Tensor,
        aten.equal.default,
        aten.is_nonzero.default,
        aten.bincount.default,
    }
)


def is_allowed(target: object) -> bool:
    """Whether a graph node may call ``target`` (core, kept, or a graph helper)."""
    return target in CORE_ATEN_OPS or target in KEPT_OPS or target in GRAPH_HELPERS


def is_library_callable(op: object) -> bool:
    """Whether ``op`` may stay in a graph as an opaque library call: an OpOverload that
    writes none of its arguments, returns only new tensors (no output aliases an input),
    and whose output shapes do not depend on data, or do through unbacked symbols."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    if op in DATA_DEPENDENT_OPS:
        # those whose outputs kiln-shapes sizes by unbacked symbols (the compiler binds
        # them from the call's result); the others' shapes are not known at all
        from kiln_shapes.unbacked import RULES

        return op in RULES
    schema = op._schema
    if schema.is_mutable:
        return False
    # no outputs: a check that raises eager's error (``_linalg_check_errors``), kept
    # whole by ``is_kept_for_effect`` below
    return all(r.alias_info is None for r in schema.returns)


def is_kept_for_effect(node: object) -> bool:
    """Whether dead-code elimination keeps ``node`` though nothing reads it: FX's own rule,
    and library ops that return nothing (checks that raise eager's error)."""
    if node.is_impure():  # type: ignore[attr-defined]
        return True
    target = getattr(node, "target", None)
    return bool(
        node.meta.get("kiln_library_op")  # type: ignore[attr-defined]
        and isinstance(target, torch._ops.OpOverload)
        and not target._schema.returns
    )


def is_inplace(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` writes to any of its arguments (in-place or ``out=``)."""
    return op._schema.is_mutable
