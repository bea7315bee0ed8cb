"""Functionalization during tracing: in-place and ``out=`` ops become functional ones.

# Functionalization

A mutating op ``foo_(x, ...)`` / ``foo(..., out=x)`` is recorded as its functional form
``foo(...)``; the result becomes ``x``'s new value (``mutate``). When ``x`` is a view, the
write is carried back to its storage's root through the inverse of each view step
(``slice`` -> ``slice_scatter``, ``select`` -> ``select_scatter``, ``permute`` -> the inverse
permutation, ``view`` -> ``view`` back, ``as_strided`` -> ``as_strided_scatter``); other
aliases of the storage are regenerated from the root when next read (``Tracer.node_of``).

Writes to graph inputs are remembered in order of first write: the trace returns each
mutated input's final value as an extra output, and the runtime wrapper copies it back
into the input. The in-place view ops (``t_``, ``transpose_``, ``squeeze_``,
``unsqueeze_``, ``swapdims_``) on a tensor the graph made turn that tensor object into the
view (its metadata and trace state become the view's): later reads and writes through it
go through the view. On a graph input they, and the other ops that change a tensor's
metadata in place (``resize_``, ``set_``, ``as_strided_``), are ``Unsupported``: the
caller's tensor would have to change shape after the call.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from kiln_aot.fake import FakeTensor
from kiln_aot.state import ViewStep, bind_args

if TYPE_CHECKING:
    from kiln_aot.op_tracer import Tracer

aten = torch.ops.aten

METADATA_MUTATIONS = frozenset(
    {
        aten.resize_.default,
        aten.resize_as_.default,
        aten.set_.source_Tensor,
        aten.set_.source_Storage,
        aten.set_.source_Storage_storage_offset,
        aten.set_.default,
        aten.t_.default,
        aten.transpose_.default,
        aten.squeeze_.default,
        aten.squeeze_.dim,
        aten.unsqueeze_.default,
        aten.as_strided_.default,
        aten.swapdims_.default,
        aten.swapaxes_.default,
    }
)


# in-place view ops -> the view they make the tensor into
INPLACE_VIEWS = {
    aten.t_.default: aten.t.default,
    aten.transpose_.default: aten.transpose.int,
    aten.swapdims_.default: aten.transpose.int,
    aten.swapaxes_.default: aten.transpose.int,
    aten.squeeze_.default: aten.squeeze.default,
    aten.squeeze_.dim: aten.squeeze.dim,
    aten.unsqueeze_.default: aten.unsqueeze.default,
}
if hasattr(aten.squeeze_, "dims"):
    INPLACE_VIEWS[aten.squeeze_.dims] = aten.squeeze.dims


def _inplace_view(tracer: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    """``x.t_()`` on a tensor the graph made: ``x`` becomes ``x.t()``; None when ``x`` is
    a graph input's storage (or not traced), which the caller reports."""
    x = args[0]
    st = getattr(x, "trace_state", None)
    if not isinstance(x, FakeTensor) or st is None or st.storage.input_index is not None:
        return None
    if st.storage.root is x:  # the storage keeps its root value under another object
        st.storage.root = tracer.alias_of(x)
    view = tracer.dispatch(INPLACE_VIEWS[func], args, kwargs)
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch():
        torch.Tensor.as_strided_(x, view.shape, view.stride(), view.storage_offset())
    x.meta = view.meta
    x.trace_state = view.trace_state
    return x


@functools.cache
def functional_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The non-mutating overload computing what ``op`` writes: ``add_.Tensor`` ->
    ``add.Tensor``; ``add.out`` -> ``add.Tensor`` (same arguments minus ``out``)."""
    name = op._schema.name.split("::")[-1]
    written = [
        a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write
    ]
    if name.endswith("_") and written == ["self"]:
        packet = getattr(aten, name[:-1], None)
        candidates = [op._overloadname] if packet is not None else []
        wanted = [a.name for a in op._schema.arguments]
    else:
        packet = getattr(aten, name, None)
        candidates = []
        wanted = [a.name for a in op._schema.arguments if a.name not in written]
    if packet is None:
        return None
    for overload in candidates + list(packet.overloads()):
        fn = getattr(packet, overload, None)
        if fn is None or fn._schema.is_mutable:
            continue
        if [a.name for a in fn._schema.arguments] == wanted:
            return fn
    return None


@functools.cache
def returning_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``<name>_functional``: the form of an op that writes arguments other than ``self``
    which returns their new values after its own results (``rrelu_with_noise`` ->
    ``rrelu_with_noise_functional``, returning ``(out, noise_out)``), with the same
    arguments; None where there is none."""
    name = op._schema.name.split("::")[-1]
    packet = getattr(aten, f"{name}_functional", None)
    fn = getattr(packet, op._overloadname, None) if packet is not None else None
    if fn is None or fn._schema.is_mutable:
        return None
    if [a.name for a in fn._schema.arguments] != [a.name for a in op._schema.arguments]:
        return None
    return fn


def _written_targets(tracer: Tracer, func: Any, bound: tuple, written: list[int]) -> list:
    """The tensors ``func`` writes (a written argument may be a list: the _foreach_ ops),
    each an input or intermediate of the trace."""
    targets = []
    for i in written:
        targets.extend(bound[i] if isinstance(bound[i], (list, tuple)) else [bound[i]])
    for t in targets:
        if not isinstance(t, FakeTensor) or t.trace_state is None:
            raise tracer.unsupported(
                func,
                "it writes to a tensor that is not an input or intermediate of the traced graph",
                fix="pass the tensor as an input of the compiled function",
            )
    return targets


def _call_returning_variant(tracer: Tracer, func: Any, variant: Any, args: tuple, kwargs: dict):
    written = [
        i
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]
    targets = _written_targets(tracer, func, bind_args(func, args, kwargs), written)
    result = tracer.dispatch(variant, args, kwargs)
    n_out = len(func._schema.returns)
    outs, new = tuple(result[:n_out]), tuple(result[n_out:])
    for target, value in zip(targets, new, strict=True):
        mutate(tracer, target, tracer.node_of(value))
    if n_out == 0:
        return None
    return outs[0] if n_out == 1 else outs


def functionalize_call(tracer: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    if func in INPLACE_VIEWS:
        out = _inplace_view(tracer, func, args, kwargs)
        if out is not None:
            return out
    if func in METADATA_MUTATIONS:
        raise tracer.unsupported(
            func,
            "it changes a tensor's shape, strides or storage in place",
            fix="use the out-of-place form (x = x.t() instead of x.t_()); the op runs eagerly meanwhile",
        )
    if func is aten.copy_.default:
        return _copy_(tracer, args[0], args[1])
    functional = functional_variant(func)
    schema = func._schema
    written = [
        i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]
    simple_inplace = schema.name.endswith("_") and written == [0]
    out_variant = bool(written) and all(schema.arguments[i].kwarg_only for i in written)
    if functional is None or not (simple_inplace or out_variant):
        if func in tracer.decompositions or func.has_kernel_for_dispatch_key(
            torch._C.DispatchKey.CompositeImplicitAutograd
        ):
            return tracer.decompose(func, args, kwargs)
        variant = returning_variant(func) if written else None
        if variant is not None:
            return _call_returning_variant(tracer, func, variant, args, kwargs)
        raise tracer.unsupported(
            func,
            "it mutates its arguments and kiln knows no functional form of it",
            fix="add a decomposition to kiln_aot.decompositions; the op runs eagerly meanwhile",
        )
    bound = bind_args(func, args, kwargs)
    targets = _written_targets(tracer, func, bound, written)
    f_args, f_kwargs = _functional_args(func, functional, bound, written)
    result = tracer.dispatch(functional, f_args, f_kwargs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    for target, value in zip(targets, results):
        if tuple(value.shape) != tuple(target.shape) and out_variant:
            raise tracer.unsupported(
                func,
                "its out= tensor would be resized",
                fix="allocate out= with the result's shape",
            )
        mutate(tracer, target, tracer.node_of(value))
    if not func._schema.returns:
        return None
    return targets[0] if len(targets) == 1 else tuple(targets)


def _functional_args(
    func: Any, functional: Any, bound: tuple, written: list[int]
) -> tuple[tuple, dict]:
    args, kwargs = [], {}
    f_names = {a.name: a for a in functional._schema.arguments}
    for i, a in enumerate(func._schema.arguments):
        if i in written and a.kwarg_only:
            continue
        if f_names[a.name].kwarg_only:
            kwargs[a.name] = bound[i]
        else:
            args.append(bound[i])
    return tuple(args), kwargs


def _copy_(tracer: Tracer, dst: Any, src: Any) -> Any:
    if not isinstance(dst, FakeTensor) or dst.trace_state is None:
        raise tracer.unsupported(
            aten.copy_.default,
            "it writes to a tensor that is not an input or intermediate of the traced graph",
            fix="pass the tensor as an input of the compiled function",
        )
    value = src
    if not isinstance(src, torch.Tensor):
        value = tracer.dispatch(
            aten.full.default, (list(dst.shape), src), {"dtype": dst.dtype, "device": dst.device}
        )
    if value.dtype != dst.dtype or value.device != dst.device:
        value = tracer.dispatch(
            aten._to_copy.default, (value,), {"dtype": dst.dtype, "device": dst.device}
        )
    if tuple(value.shape) != tuple(dst.shape):
        value = tracer.dispatch(aten.expand.default, (value, list(dst.shape)), {})
    mutate(tracer, dst, tracer.node_of(value))
    return dst


def _conform(tracer: Tracer, node: fx.Node, like: FakeTensor) -> fx.Node:
    val = node.meta["val"]
    if val.dtype != like.dtype:
        node = tracer.emit_node(aten._to_copy.default, (node,), {"dtype": like.dtype})
    if tuple(node.meta["val"].shape) != tuple(like.shape):
        node = tracer.emit_node(aten.expand.default, (node, list(like.shape)), {})
    return node


def mutate(tracer: Tracer, target: FakeTensor, new: fx.Node) -> None:
    """Make ``new`` the value of ``target`` and carry the write back to its storage root."""
    st = target.trace_state
    storage = st.storage
    new = _conform(tracer, new, target)
    root_state = storage.root.trace_state
    if st.views:
        values = [tracer.node_of(storage.root)]
        for step in st.views[:-1]:
            values.append(tracer.replay_view(step, values[-1]))
        cur = new
        for step, prev in zip(reversed(st.views), reversed(values)):
            cur = _inverse_view(tracer, step, prev, cur)
        root_new = cur
    else:
        root_new = new
    storage.version += 1
    root_state.node, root_state.version = root_new, storage.version
    st.node, st.version = new, storage.version
    if storage.input_index is not None and storage.mutation_order is None:
        storage.mutation_order = tracer.next_mutation_order()


def _inverse_view(tracer: Tracer, step: ViewStep, prev: fx.Node, new: fx.Node) -> fx.Node:
    """The value of ``prev`` after its view ``step(prev)`` was overwritten by ``new``."""
    op, a = step.op, step.args
    prev_shape = list(prev.meta["val"].shape)
    if op is aten.view.default or op is aten.squeeze.dims:
        return tracer.emit_node(aten.view.default, (new, prev_shape), {})
    if op is aten.permute.default:
        dims = [d % len(prev_shape) for d in a[0]] if prev_shape else []
        inverse = [dims.index(i) for i in range(len(dims))]
        return tracer.emit_node(aten.permute.default, (new, inverse), {})
    if op is aten.unsqueeze.default:
        return tracer.emit_node(aten.squeeze.dims, (new, [a[0]]), {})
    if op is aten.slice.Tensor:
        return tracer.emit_node(aten.slice_scatter.default, (prev, new, *a), {})
    if op is aten.select.int:
        return tracer.emit_node(aten.select_scatter.default, (prev, new, *a), {})
    if op is aten.as_strided.default:
        return tracer.emit_node(aten.as_strided_scatter.default, (prev, new, *a), {})
    from kiln_aot.op_tracer import LIBRARY_VIEW_COPIES

    if op in LIBRARY_VIEW_COPIES:  # view_as_real_copy <-> view_as_complex_copy
        node = tracer.emit_node(LIBRARY_VIEW_COPIES[op], (new,), {})
        node.meta["kiln_library_op"] = True
        return node
    raise tracer.unsupported(
        op,
        f"a write through the view {step} cannot be carried back to its base",
        fix="write to a clone (x = x.clone()) before the in-place op",
    )
