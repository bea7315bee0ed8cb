"""``min_cut_partition``: choose the saved tensors by a minimum s-t cut over the joint graph.

# Min-cut partitioning

Every forward-region node ``v`` (one that does not depend on a tangent) becomes an edge
``v.in -> v.out`` whose capacity is the bytes of saving ``v``; each data edge ``u -> w`` is
``u.out -> w.in`` with infinite capacity. The source feeds the primals and every node that
must not be recomputed (matmuls, convolutions, gathers/scatters, random ops, reductions over
more than ``KILN_AOT_RECOMPUTE_REDUCTION_NUMEL`` elements, anything not known to be cheap);
every forward value the backward reads drains into the sink. A finite cut crosses each
source-sink path at some ``v.in -> v.out`` edge: those ``v`` are saved, and the forward
nodes on the sink side are recomputed in the backward from them. The minimum cut is thus
the cheapest (fewest bytes) set of saved tensors from which the backward can recompute
everything else using only cheap ops, e.g. saving a GELU's input instead of its input and
output, or a ReLU's boolean mask instead of its float output.

Activation checkpointing (``torch.utils.checkpoint``, tagged ``meta["recompute"]`` by
capture and carried onto the ATen nodes): inside a region every op but random draws is
recomputable, matmuls too, and saving a value only the region reads costs
``CHECKPOINTED_SAVE_COST`` times its bytes, and a region's outputs (values read after it)
are not recomputed: the cut keeps the regions' inputs and outputs and the backward
recomputes each region from them, one region at a time, as eager checkpointing does.

Recomputed on request (``meta["recompute_in_backward"]``, carried from the torch-level node
onto its ATen nodes: kiln's FSDP graph tags each gather of a unit that reshards after
forward): such a node is recomputable whatever its op (a collective too) and saving it
costs ``CHECKPOINTED_SAVE_COST`` times its bytes, so the cut saves its inputs (the shard)
and the backward computes it again (gathers again), as eager FSDP2 does; without the tag
a collective is never recomputed and its result is saved. Tagged
``recompute_in_backward=False``, a node is never recomputed, however cheap its op: where
the backward reads it (or what is recomputed from it) it is saved. kiln's FSDP graph so
tags the copies of a unit's small parameters (biases, norms) out of the unit's gathered
buffer: the backward regathers the unit for its weights anyway, so recomputing a bias
from the regather would look free to the cut, and recomputing the forward's pointwise ops
from it (a residual stream from saved matmul outputs and biases) would make the
backward's first kernels wait on every unit's regather.

Random ops are never recomputed: dropout's mask is computed once in the forward and saved
(as a bool tensor: the tracer records ``bernoulli`` draws as a bool mask converted back to
floats, so the cut can keep the 1-byte mask and redo the conversion in the backward).
Ties prefer saving primals (alive anyway) over intermediates.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from kiln_shapes import hint_of, is_symbolic
from torch import fx

from kiln_aot import config, core_ops
from kiln_aot.log import log
from kiln_aot.partition.graph_split import (
    ancestors,
    output_values,
    saved_bytes,
    split_with_saved,
    tangent_dependent,
)
from kiln_aot.partition.maxflow import INF, FlowNetwork
from kiln_aot.sym_nodes import is_data_value, is_sym_node

aten = torch.ops.aten

_CHEAP = frozenset(
    {
        aten._to_copy.default,
        aten.clone.default,
        aten.full.default,
        aten.scalar_tensor.default,
        aten.arange.start_step,
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.cat.default,
        aten.constant_pad_nd.default,
    }
)
_REDUCTIONS = frozenset(
    {
        aten.sum.dim_IntList,
        aten.amax.default,
        aten.amin.default,
        aten.argmax.default,
        aten.argmin.default,
        aten.prod.dim_int,
        aten.any.dim,
        aten.any.dims,
        aten.all.dim,
        aten.max.dim,
        aten.min.dim,
    }
)


def _numel(val: Any) -> int:
    """Elements of a node's value; a symbolic count at its hint (a partition decision must
    not put a guard on the sizes)."""
    return hint_of(val.numel()) if isinstance(val, torch.Tensor) else 0


def nbytes(node: fx.Node) -> int | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        # symbolic sizes weigh in at their hints (the example's sizes)
        return hint_of(val.numel()) * val.element_size()
    return None


def recomputable(node: fx.Node) -> bool:
    """Whether the backward may recompute ``node`` from its inputs."""
    if node.op == "get_attr":
        return True
    if node.op != "call_function":
        return False
    target = node.target
    if is_data_value(node.meta.get("val")):
        return True  # .item() / nonzero's length / arithmetic on them: a read, recomputed
    if target is operator.getitem:
        return recomputable(node.args[0])
    if core_ops.is_random(target):
        return False
    asked = node.meta.get("recompute_in_backward")
    if asked is not None:
        return bool(asked)  # asked for, or against (module docstring): whatever its op
    if node.meta.get("recompute") is not None:
        return True  # inside a checkpointed region: everything but random draws
    if target in core_ops.VIEW_OPS or target in _CHEAP:
        return True
    if target in _REDUCTIONS:
        val = node.args[0].meta.get("val")
        if isinstance(val, torch.Tensor) and is_symbolic(val.numel()):
            # the graph serves every size: a reduction is recomputed only when it is small
            # for all of them, which a symbolic size is not
            return False
        return _numel(val) <= config.settings.recompute_reduction_numel
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags


# what saving a value made inside an activation-checkpointing region costs, relative to
# its bytes: the cut saves the region's inputs and outputs instead, as checkpointing does
CHECKPOINTED_SAVE_COST = 1 << 20


def _inside_region(node: fx.Node, backward: set[fx.Node]) -> bool:
    """A value of a checkpointed region that only its own region or the backward formulas
    read (``kiln_aot_backward``: what tracing the backward made, tangent-dependent or not):
    not one of the region's outputs, which the next region or the rest of the graph reads."""
    region = node.meta.get("recompute")
    if region is None or node.op != "call_function" or core_ops.is_random(node.target):
        return False
    return all(
        u in backward or u.meta.get("kiln_aot_backward") or u.meta.get("recompute") == region
        for u in node.users
    )


def _must_recompute(node: fx.Node) -> bool:
    """Tagged ``recompute_in_backward`` (module docstring), and recomputable."""
    return bool(node.meta.get("recompute_in_backward")) and recomputable(node)


def _tie_break(node: fx.Node) -> int:
    """Among equal sizes: save a primal (alive anyway), then an intermediate, and last an
    input the graph overwrites (saving it costs a copy at run time)."""
    if node.op == "placeholder":
        return 2 if node.meta.get("kiln_aot_mutated") else 0
    return 1


def choose_saved(joint: fx.GraphModule, num_fwd_outputs: int) -> list[fx.Node]:
    graph = joint.graph
    backward = tangent_dependent(graph)
    grads = output_values(graph)[num_fwd_outputs:]
    needed = ancestors(grads)
    net = FlowNetwork()
    src, sink = "source", "sink"
    net.node(src)
    net.node(sink)
    # symbolic sizes are never saved: the backward reads them from its own inputs
    forward = [
        n
        for n in graph.nodes
        if n.op in ("placeholder", "get_attr", "call_function")
        and n not in backward
        and not is_sym_node(n)
    ]
    for n in forward:
        size = nbytes(n)
        cap = INF if size is None else size * 4 + _tie_break(n)
        boundary = False  # a checkpointed region's output: saved, as checkpointing does
        if _must_recompute(n) and size is not None:
            cap = size * 4 * CHECKPOINTED_SAVE_COST + _tie_break(n)
        elif n.meta.get("recompute") is not None and size is not None:
            if _inside_region(n, backward):
                cap = size * 4 * CHECKPOINTED_SAVE_COST + _tie_break(n)
            else:
                boundary = True
        net.add_edge((n, "in"), (n, "out"), cap)
        if n.op == "placeholder" or boundary or not recomputable(n):
            net.add_edge(src, (n, "in"), INF)
        for user in n.users:
            if user.op != "output" and user not in backward:
                net.add_edge((n, "out"), (user, "in"), INF)
    for n in graph.nodes:
        if n in backward and n in needed:
            for a in n.all_input_nodes:
                if a not in backward and not is_sym_node(a):
                    net.add_edge((a, "out"), sink, INF)
    for g in grads:
        if isinstance(g, fx.Node) and g not in backward:
            net.add_edge((g, "out"), sink, INF)
    value, source_side = net.min_cut(src, sink)
    if value >= INF:
        raise RuntimeError(
            "min-cut partition found no finite cut (an unsavable value is needed by the backward)"
        )
    return [n for n in forward if (n, "in") in source_side and (n, "out") not in source_side]


def min_cut_partition(
    joint: fx.GraphModule, joint_inputs: Any = None, *, num_fwd_outputs: int
) -> tuple[fx.GraphModule, fx.GraphModule]:
    saved = choose_saved(joint, num_fwd_outputs)
    fw, bw = split_with_saved(joint, saved, num_fwd_outputs)
    log("partition", partition_summary(saved, bw))
    return fw, bw


def partition_summary(saved: list[fx.Node], bw: fx.GraphModule) -> str:
    """What a partition costs: the tensors saved for the backward (how many, their bytes)
    and the forward ops the backward recomputes, then each saved tensor's shape."""
    try:
        total = f"{saved_bytes(saved) / 2**20:.2f} MB"
    except TypeError:  # symbolic sizes
        total = "bytes of symbolic size"
    backward = tangent_dependent(bw.graph)
    recomputed = [n for n in bw.graph.nodes if n.op == "call_function" and n not in backward]
    return (
        f"min_cut_partition saves {len(saved)} tensors ({total}); the backward recomputes {len(recomputed)} forward ops; saved: "
        + ", ".join(f"{n.name}{tuple(n.meta['val'].shape)}" for n in saved)
    )
