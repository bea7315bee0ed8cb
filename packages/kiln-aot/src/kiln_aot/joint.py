"""Joint forward + backward tracing: one ATen graph from primals and tangents to the
forward's outputs and the inputs' gradients.

# Joint graph

Placeholders: ``primals_*`` (the flattened inputs, in order) then ``tangents_*`` (one per
differentiable forward output, contiguous). Outputs: the forward outputs (user tensor
outputs that do not alias an input, then the final values of mutated inputs) followed by
the gradients of the inputs that require grad (those autograd found unused are omitted).
The backward is traced by running the autograd engine on kiln's fake tensors, so every
backward formula is recorded, decomposed and functionalized like the forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from kiln_aot.decompositions import with_overrides
from kiln_aot.fake import contiguous_fake
from kiln_aot.graph_trace import (
    TraceInfo,
    build_module,
    collect_outputs,
    make_inputs,
    mutated_inputs,
)
from kiln_aot.op_tracer import Tracer


@dataclass(frozen=True)
class JointInfo:
    trace: TraceInfo
    num_fwd_outputs: int  # user tensor outputs (non-alias) + mutated inputs
    fw_user_outputs: tuple[int, ...]  # index into trace.outputs of each user forward output
    differentiable: tuple[int, ...]  # forward-output positions that have a tangent
    grad_inputs: tuple[int, ...]  # flat input index of each gradient output


def _differentiable(t: torch.Tensor) -> bool:
    return t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)


class _InputAlias(torch.autograd.Function):
    """The function sees each input that requires grad through this identity: to autograd
    a non-leaf (so in-place writes are allowed, as on the activations a graph usually
    receives), to the tracer the same value and storage as the input placeholder."""

    @staticmethod
    def forward(ctx, leaf):
        return leaf.trace_state.tracer.alias_of(leaf)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _written_with_grad(t: Any) -> bool:
    """Whether autograd recorded a write to this input (not only ``_InputAlias``): eager
    would then carry the write's history, and refuse it on a leaf."""
    fn = t.grad_fn if isinstance(t, torch.Tensor) else None
    return fn is not None and fn.name() != "_InputAliasBackward" and _differentiable(t)


def trace_joint(
    fn: Callable,
    flat_args: Sequence[Any],
    requires_grad: Sequence[bool],
    *,
    decompositions: dict | None = None,
    symbolic: Sequence[Any] | None = None,
) -> tuple[fx.GraphModule, JointInfo]:
    tracer = Tracer(with_overrides(decompositions))
    leaves_in = make_inputs(tracer, flat_args, "primals", requires_grad, symbolic=symbolic)
    with torch.enable_grad(), tracer.running():
        seen = [
            _InputAlias.apply(f) if isinstance(f, torch.Tensor) and f.requires_grad else f
            for f in leaves_in
        ]
        out = fn(*seen)
        infos, nodes, spec = collect_outputs(tracer, out)
        leaves = [
            leaf for leaf in torch.utils._pytree.tree_leaves(out) if isinstance(leaf, torch.Tensor)
        ]
        muts = mutated_inputs(tracer, leaves_in)
        tensor_infos = [(k, info) for k, info in enumerate(infos) if info.kind != "constant"]
        fw = [
            (k, leaf, node)
            for (k, info), leaf, node in zip(tensor_infos, leaves, nodes)
            if info.kind == "tensor"
        ]
        # Forward outputs: user tensors, then written inputs' new values (differentiable when
        # the input requires grad: the runtime's write-back then carries their history).
        outs = [leaf for _, leaf, _ in fw] + [seen[i] for i, _ in muts]
        out_nodes = [node for _, _, node in fw] + [n for _, n in muts]
        diff = [j for j, (_, leaf, _) in enumerate(fw) if _differentiable(leaf)]
        diff += [len(fw) + k for k, (i, _) in enumerate(muts) if _written_with_grad(seen[i])]
        tangents = [
            tracer.new_placeholder(
                f"tangents_{n + 1}", contiguous_fake(outs[j].shape, outs[j].dtype, outs[j].device)
            )
            for n, j in enumerate(diff)
        ]
        wanted = [
            i for i, rg in enumerate(requires_grad) if rg and isinstance(flat_args[i], torch.Tensor)
        ]
        grads: Sequence[Any] = [None] * len(wanted)
        if diff and wanted:
            before = set(tracer.graph.nodes)
            grads = torch.autograd.grad(
                [outs[j] for j in diff], [leaves_in[i] for i in wanted], tangents, allow_unused=True
            )
            for n in tracer.graph.nodes:  # what the backward formulas made (partitioners)
                if n not in before:
                    n.meta["kiln_aot_backward"] = True
        grad_out = [(i, tracer.node_of(g)) for i, g in zip(wanted, grads) if g is not None]
    placeholders = [n for n in tracer.graph.nodes if n.op == "placeholder"]
    for i, _ in muts:
        placeholders[i].meta["kiln_aot_mutated"] = True  # partitioners avoid saving it
    tracer.graph.output(tuple(out_nodes) + tuple(n for _, n in grad_out))
    trace_info = TraceInfo(len(flat_args), tuple(infos), spec, tuple(i for i, _ in muts))
    info = JointInfo(
        trace=trace_info,
        num_fwd_outputs=len(out_nodes),
        fw_user_outputs=tuple(k for k, _, _ in fw),
        differentiable=tuple(diff),
        grad_inputs=tuple(i for i, _ in grad_out),
    )
    gm = build_module(tracer)
    gm.meta["kiln_aot_joint"] = info
    mark_checked_indices(gm.graph)
    return gm, info


aten = torch.ops.aten


def mark_checked_indices(graph: fx.Graph) -> int:
    """Mark each ``embedding_dense_backward`` whose indices the forward's ``embedding`` read
    from a table of ``num_weights`` rows (``meta["kiln_indices_checked"]``): that read has
    already bounds-checked them (an ``embedding`` with a bad index raises in the forward),
    and autograd refuses a backward through indices changed in place since, so the
    backward's scatter needs no check of its own. A compiler may then drop the check, and
    on a GPU the host's wait for it: the scatter is the backward's last kernel, so the wait
    held the host until the whole backward had run, and the GPU then idled while the host
    prepared the next step (HF BERT-base, batch 8 x 512 on the H200: about 7 ms a step).
    Returns how many were marked."""
    marked = 0
    for node in graph.nodes:
        if node.target is not aten.embedding_dense_backward.default:
            continue
        indices, num_weights = node.args[1], node.args[2]
        for user in getattr(indices, "users", ()):
            if user.target is not aten.embedding.default or user.args[1] is not indices:
                continue
            table = user.args[0].meta.get("val") if isinstance(user.args[0], fx.Node) else None
            rows = None if table is None else table.shape[0]
            if rows is not None and str(rows) == str(num_weights):
                node.meta["kiln_indices_checked"] = True
                marked += 1
                break
    return marked
