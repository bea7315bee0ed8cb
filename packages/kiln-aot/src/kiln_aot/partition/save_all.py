"""``save_all_partition``: save every forward value the backward reads; recompute nothing."""

from __future__ import annotations

from typing import Any

from torch import fx

from kiln_aot.partition.graph_split import (
    ancestors,
    output_values,
    split_with_saved,
    tangent_dependent,
)


def backward_reads(joint: fx.GraphModule, num_fwd_outputs: int) -> list[fx.Node]:
    """Forward-region values read by the backward region (or returned as gradients)."""
    graph = joint.graph
    backward = tangent_dependent(graph)
    grads = output_values(graph)[num_fwd_outputs:]
    needed = ancestors(grads)
    reads: dict[fx.Node, None] = {}
    for n in graph.nodes:
        if n in backward and n in needed:
            for a in n.all_input_nodes:
                if a not in backward:
                    reads[a] = None
    for g in grads:
        if g not in backward:
            reads[g] = None
    return [n for n in graph.nodes if n in reads]


def save_all_partition(
    joint: fx.GraphModule, joint_inputs: Any = None, *, num_fwd_outputs: int
) -> tuple[fx.GraphModule, fx.GraphModule]:
    return split_with_saved(joint, backward_reads(joint, num_fwd_outputs), num_fwd_outputs)
