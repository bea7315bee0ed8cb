"""Splitting a joint graph into forward and backward graphs once the saved set is chosen.

# Partition contract

``partition_fn(joint_gm, joint_inputs, *, num_fwd_outputs) -> (fw_gm, bw_gm)``:

- ``fw_gm(*primals)`` returns the joint's first ``num_fwd_outputs`` outputs followed by the
  saved values;
- ``bw_gm(*saved, *tangents)`` returns the joint's remaining outputs (the gradients).

Any forward value the backward reads and that is not saved is recomputed in the backward
from saved values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from kiln_shapes import expr_of
from torch import fx

from kiln_aot.errors import PartitionError
from kiln_aot.sym_nodes import SymEmitter, is_sym_node


def placeholders(graph: fx.Graph, prefix: str) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "placeholder" and n.name.startswith(prefix)]


def output_values(graph: fx.Graph) -> list[fx.Node]:
    return list(graph.output_node().args[0])


def tangent_dependent(graph: fx.Graph) -> set[fx.Node]:
    """Nodes whose value depends on a tangent: the backward region."""
    dep: set[fx.Node] = set()
    for n in graph.nodes:
        if n.op == "placeholder":
            if n.name.startswith("tangents"):
                dep.add(n)
        elif n.op == "call_function" and any(a in dep for a in n.all_input_nodes):
            dep.add(n)
    return dep


def ancestors(outputs: Iterable[fx.Node], stop: set[fx.Node] = frozenset()) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in stop:
            stack.extend(n.all_input_nodes)
    return seen


def build_graph(
    joint: fx.GraphModule,
    inputs: Sequence[fx.Node],
    outputs: Sequence[fx.Node],
    names: Sequence[str],
    what: str,
    lazy: Iterable[fx.Node] = (),
) -> fx.GraphModule:
    """A graph taking ``inputs`` (as placeholders named ``names``) and returning ``outputs``,
    with every joint node in between copied in joint order, except the ``lazy`` ones: each
    of those comes just before the first node that needs it."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n, name in zip(inputs, names):
        p = g.placeholder(name)
        p.meta = dict(n.meta)
        env[n] = p
    # symbolic sizes are read from this graph's own inputs (sym_nodes), never passed
    sizes = SymEmitter(g)
    syms = {n for n in joint.graph.nodes if is_sym_node(n) and n not in env}
    needed = ancestors(outputs, stop=set(inputs) | syms)
    for n in joint.graph.nodes:  # sizes first: they only read this graph's placeholders
        if n in syms and n in needed:
            env[n] = sizes.emit(expr_of(n.meta["val"]))
    order = [n for n in joint.graph.nodes if n in needed and n not in env and n.op != "output"]
    for n in _on_demand(order, set(lazy), set(env)):
        if n.op == "placeholder":
            raise PartitionError(
                f"{what} graph needs {n.name}, which is neither an input of it nor saved"
            )
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[o] for o in outputs))
    for n in reversed(list(g.nodes)):  # size reads a re-emitted expression did not need
        if is_sym_node(n) and not n.users:
            g.erase_node(n)
    g.lint()
    return fx.GraphModule(joint, g)


def _on_demand(order: list[fx.Node], lazy: set[fx.Node], ready: set[fx.Node]) -> list[fx.Node]:
    """``order`` with each ``lazy`` node moved to just before its first user (a dependency
    first search from the other nodes, in order; lazy nodes nothing else needs last)."""
    if not lazy:
        return order
    done = set(ready)
    out: list[fx.Node] = []
    for root in [*(n for n in order if n not in lazy), *order]:
        stack = [(root, False)]
        while stack:
            n, inputs_done = stack.pop()
            if n in done:
                continue
            if inputs_done:
                done.add(n)
                out.append(n)
                continue
            stack.append((n, True))
            stack.extend((a, False) for a in reversed(n.all_input_nodes) if a not in done)
    return out


def split_with_saved(
    joint: fx.GraphModule, saved: Sequence[fx.Node], num_fwd_outputs: int
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward graphs that pass exactly ``saved`` from one to the other."""
    graph = joint.graph
    primals, tangents = placeholders(graph, "primals"), placeholders(graph, "tangents")
    outs = output_values(graph)
    fw_outs, grads = outs[:num_fwd_outputs], outs[num_fwd_outputs:]
    saved = [*saved, *_int_symbols_to_save(primals, [*saved, *tangents])]
    fw = build_graph(joint, primals, [*fw_outs, *saved], [p.name for p in primals], "forward")
    saved_names = [f"saved_{n.name}" for n in saved]
    # what the backward recomputes from saved values comes just before its first use, as
    # eager's autograd would compute it, not all at the start: a model's recomputed
    # activations of every layer would otherwise be alive at once
    recomputed = [n for n in graph.nodes if n.op == "call_function"]
    backward = tangent_dependent(graph)
    bw = build_graph(
        joint,
        [*saved, *tangents],
        grads,
        [*saved_names, *(t.name for t in tangents)],
        "backward",
        lazy=[n for n in recomputed if n not in backward],
    )
    fw.meta["kiln_aot_saved"] = tuple(n.name for n in saved)
    bw.meta["kiln_aot_saved"] = tuple(n.name for n in saved)
    return fw, bw


def _int_symbols_to_save(primals: Sequence[fx.Node], bw_inputs: Sequence[fx.Node]) -> list[fx.Node]:
    """Int inputs that are size symbols (kiln-capture's symbolic ints) no tensor the
    backward receives has as a size: saved, so the backward can bind them."""
    have = set()
    for n in bw_inputs:
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt):
            have.add(expr_of(val))
        elif isinstance(val, torch.Tensor):
            have |= {expr_of(d) for d in val.shape if isinstance(d, torch.SymInt)}
    out = []
    for p in primals:
        val = p.meta.get("val")
        if isinstance(val, torch.SymInt) and expr_of(val) not in have:
            have.add(expr_of(val))
            out.append(p)
    return out


def saved_bytes(gm_or_nodes: fx.GraphModule | Sequence[fx.Node]) -> int:
    """Bytes of the tensors a forward graph saves for its backward (its ``saved_*``)."""
    if isinstance(gm_or_nodes, fx.GraphModule):
        nodes = [
            n
            for n in gm_or_nodes.graph.nodes
            if n.op == "placeholder" and n.name.startswith("saved_")
        ]
    else:
        nodes = list(gm_or_nodes)
    total = 0
    for n in nodes:
        val = n.meta.get("val")
        if val is not None and hasattr(val, "numel"):
            total += val.numel() * val.element_size()
    return total
