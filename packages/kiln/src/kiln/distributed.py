"""DistributedDataParallel: graphs split at gradient buckets, so all-reduce overlaps backward.

DDP all-reduces gradients in buckets, each as soon as autograd has produced every gradient
of the bucket; after the first step its Reducer rebuilds the buckets in the order gradients
became ready, a first one of ``first_bucket_bytes_cap`` (1 MiB under the default
``bucket_cap_mb``) and then ``bucket_bytes_cap`` each (or the ``bucket_cap_mb_list`` given).
A model compiled into one graph has one backward that returns every gradient at its end,
so no bucket can start before the whole backward finished. ``split_at_buckets`` cuts the
captured graph into pieces that each use one bucket's worth of parameters, with DDP's
limits (``bucket_caps``), counted from the graph's end, where the backward starts, as DDP
fills its buckets, and compiles each piece on its own: the backward then runs piece by
piece, and DDP's hooks start a bucket's all-reduce while earlier pieces' backward still
runs. (DDP orders the gradients of one piece as autograd hands them over, so a rebuilt
bucket's edge can fall one parameter off the piece's.)

The pieces are contiguous runs of the graph's nodes; a piece takes the values earlier
pieces made and returns those later pieces or the graph's outputs read. Each piece is
compiled on its first call (its real arguments are then its example inputs), through the
same guarded backend as an unsplit graph (an error there runs that piece eagerly with a
warning). Graphs with one (first) bucket's worth of parameters or fewer, and graphs passing a
symbolic size between pieces, are compiled whole.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

log = logging.getLogger("kiln")

Backend = Callable[[torch.fx.GraphModule, list], Callable]

# piece counts of the graphs split since the last kiln.reset() (tests and explain read it)
SPLITS: list[int] = []


def is_ddp(model: object) -> bool:
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


def bucket_caps(ddp: torch.nn.parallel.DistributedDataParallel) -> list[int]:
    """The byte limits of DDP's buckets in the order gradients become ready, as DDP's
    Reducer sets them when it rebuilds its buckets after the first step: the list given as
    ``bucket_cap_mb_list``, else a first bucket of ``first_bucket_bytes_cap`` (1 MiB when
    ``bucket_cap_mb`` is left at its default: the gradients of the last layers start
    their all-reduce early) and then ``bucket_cap_mb`` each; the last limit repeats."""
    cap = ddp.bucket_bytes_cap
    config = getattr(ddp, "_bucket_config", None)  # torch >= 2.12
    if config is not None:
        if config.per_bucket_bytes_caps:
            return list(config.per_bucket_bytes_caps)
        return [config.first_bucket_bytes_cap, cap]
    import torch.distributed as dist

    default = getattr(ddp, "bucket_bytes_cap_default", False)
    return [dist._DEFAULT_FIRST_BUCKET_BYTES if default else cap, cap]


def split_inside_ddp(backend: Backend) -> Backend:
    """``backend``, or ``split_at_buckets`` of it for a graph captured while a DDP module
    runs its wrapped module's forward (``DistributedDataParallel._get_active_ddp_module``,
    as torch's DDPOptimizer finds it): a compiled function calling a DDP model (a whole
    training step) gets the model's graph split at DDP's buckets too."""

    @functools.wraps(backend)
    def backend_inside_ddp(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        active = _active_ddp()
        if active is None:
            return backend(gm, example_inputs)
        return split_at_buckets(backend, bucket_caps(active))(gm, example_inputs)

    reload = getattr(backend, "kiln_reload", None)

    def reload_outside_ddp(recipe: Any, example_inputs: list, make_graph: Callable) -> Any:
        # a kept capture's reload recipe is the unsplit graph's: inside DDP, compile
        return None if _active_ddp() is not None else reload(recipe, example_inputs, make_graph)

    backend_inside_ddp.kiln_reload = reload_outside_ddp if reload is not None else None
    return backend_inside_ddp


def _active_ddp() -> Any:
    ddp = torch.nn.parallel.DistributedDataParallel
    return getattr(ddp, "_get_active_ddp_module", lambda: None)()


def split_at_buckets(backend: Backend, caps: list[int]) -> Backend:
    """``backend`` applied to each bucket-sized piece of a graph (see the module docstring);
    ``caps`` from ``bucket_caps``."""

    def split_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        buckets = _buckets(gm, example_inputs, caps)
        if buckets is None or max(buckets.values(), default=0) == 0:
            return backend(gm, example_inputs)
        top = _split(gm, buckets, backend)
        if top is None:
            return backend(gm, example_inputs)
        pieces = max(buckets.values()) + 1
        SPLITS.append(pieces)
        log.info("kiln: DDP graph split into %d pieces at buckets of %s bytes", pieces, caps)
        return top.forward

    return split_backend


def _buckets(
    gm: torch.fx.GraphModule, example_inputs: list, caps: list[int]
) -> dict[torch.fx.Node, int] | None:
    """Bucket number of every compute node, counted from the graph's end: bucket ``k``
    closes once the parameters first read (walking backwards) reach ``caps[k]`` (the last
    cap for the rest), as DDP closes a bucket once its gradients reach the limit."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = {
        ph: p.numel() * p.element_size()
        for ph, p in zip(placeholders, example_inputs)
        if isinstance(p, torch.nn.Parameter) and p.requires_grad
    }
    if sum(params.values()) <= caps[0]:
        return None
    out: dict[torch.fx.Node, int] = {}
    seen: set[torch.fx.Node] = set()
    bucket, filled = 0, 0
    for node in reversed(list(gm.graph.nodes)):
        if node.op in ("placeholder", "output"):
            continue
        if filled >= caps[min(bucket, len(caps) - 1)]:
            bucket, filled = bucket + 1, 0
        for a in node.all_input_nodes:
            if a in params and a not in seen:
                seen.add(a)
                filled += params[a]
        out[node] = bucket
    # pieces in program order: the last bucket (the graph's start) is piece 0
    last = max(out.values(), default=0)
    return {n: last - b for n, b in out.items()}


class _LazyPiece(torch.nn.Module):
    """One piece, compiled by ``backend`` on its first call with the arguments it gets."""

    def __init__(self, gm: torch.fx.GraphModule, backend: Backend) -> None:
        super().__init__()
        self.gm = gm
        self.backend = backend
        self.compiled: Callable | None = None

    def forward(self, *args: Any) -> Any:
        if self.compiled is None:
            self.compiled = self.backend(self.gm, list(args))
        return self.compiled(*args)


def _split(
    gm: torch.fx.GraphModule, piece_of: dict[torch.fx.Node, int], backend: Backend
) -> torch.fx.GraphModule | None:
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    count = max(piece_of.values()) + 1
    groups: list[list[torch.fx.Node]] = [[] for _ in range(count)]
    for n in nodes:
        groups[piece_of[n]].append(n)
    # pieces must be contiguous in program order (a node never reads a later piece)
    for n in nodes:
        if any(piece_of.get(a, -1) > piece_of[n] for a in n.all_input_nodes):
            return None
    top = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for ph in (n for n in gm.graph.nodes if n.op == "placeholder"):
        env[ph] = top.placeholder(ph.name)
        env[ph].meta = dict(ph.meta)
    root = torch.nn.Module()
    output = gm.graph.output_node()
    for k, group in enumerate(groups):
        members = set(group)
        inputs: list[torch.fx.Node] = []
        for n in group:
            for a in n.all_input_nodes:
                if a not in members and a not in inputs:
                    inputs.append(a)
        outputs = [n for n in group if any(u not in members or u is output for u in n.users)]
        crossing = [*inputs, *outputs]
        if any(not isinstance(v.meta.get("val"), torch.Tensor) for v in crossing):
            return None  # a size or a non-tensor value between pieces: compile whole
        sub = torch.fx.Graph()
        local: dict[torch.fx.Node, torch.fx.Node] = {}
        for a in inputs:
            local[a] = sub.placeholder(a.name)
            local[a].meta = dict(a.meta)
        for n in group:
            local[n] = sub.node_copy(n, local.__getitem__)
        sub.output(tuple(local[o] for o in outputs))
        piece = torch.fx.GraphModule(gm, sub, class_name=f"KilnBucket{k}")
        piece.meta.update(gm.meta)
        name = f"bucket{k}"
        root.add_module(name, _LazyPiece(piece, backend))
        call = top.call_module(name, tuple(env[a] for a in inputs))
        for j, o in enumerate(outputs):
            env[o] = top.call_function(operator.getitem, (call, j))
            env[o].meta = dict(o.meta)
    top.output(torch.fx.node.map_arg(output.args[0], lambda a: env[a]))
    return torch.fx.GraphModule(root, top, class_name="KilnDDPGraph")


__all__ = ["SPLITS", "bucket_caps", "is_ddp", "split_at_buckets", "split_inside_ddp"]
