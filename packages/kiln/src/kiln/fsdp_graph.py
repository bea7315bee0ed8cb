"""FSDP2 compiled whole: one graph per model, all-gathers and reduce-scatters in it.

Design: FSDP's collectives as graph nodes
=========================================
``kiln.compile(root)`` of a ``fully_shard`` model could run each unit's forward as a
region between FSDP's eager hooks (kiln/fsdp.py): correct, but the root's graph ends at
every call of a unit. Here the whole forward is one graph, and FSDP's work is in it, as
torch's SimpleFSDP expresses FSDP:

- While the compiled call runs, each unit's FSDP forward hooks are out of its hook tables
  and each sharded parameter (a DTensor shard) is replaced in its module by a *stand-in*:
  an ``nn.Parameter`` of the unsharded shape and dtype holding no storage (size 0, as FSDP
  frees its unsharded parameters). kiln-capture then traces the root's forward through
  every unit, with the stand-ins as graph inputs: one graph, no break.
- ``gather_params`` (the backend's first step) rewrites each stand-in's placeholder into
  this rank's shard (``LocalShard``, passed on every call), padded to FSDP's padded shard
  size; a unit's padded shards are all-gathered together over its shard group, as FSDP2
  does (``AllGatherUnit``: flattened into one buffer, one
  ``_c10d_functional.all_gather_into_tensor`` and ``wait_tensor``, each parameter's rows
  taken from every rank's part), each narrowed to the unsharded rows: the unsharded
  parameters are values of the graph. ``AllGatherUnit``'s gradient is FSDP's: one
  ``reduce_scatter_tensor`` of the unit's gradients, averaging over the group (the op's own
  autograd rule sums), each shard's part reaching its DTensor parameter as a DTensor shard
  on the parameter's own spec, as FSDP's post-backward writes it. One collective a unit,
  not one a parameter: over gloo, where kiln-inductor runs one collective at a time, a
  unit's gather then overlaps the previous unit's computation whole (per parameter, only
  a unit's last gather ran under the previous unit's matmuls). Each unit's gather is
  recorded just before the first read of any of its parameters, not all at the graph's
  start: autograd runs a gather's backward (its reduce-scatter) after everything
  recorded later, so gathers recorded first put every reduce-scatter at the backward's
  end.
- kiln-inductor's collectives pass waits on each collective just before the first kernel
  reading it and issues it early, bounded per unit (below): forward and backward
  prefetching, and each reduce-scatter under the next unit's backward.

Memory: each gather node is tagged ``collective_group`` (its unit; the reduce-scatters of
its backward too, through ``kiln_aot.annotate``) and, where the unit reshards after
forward (FSDP's default; not the root, nor ``reshard_after_forward=False``),
``recompute_in_backward``: kiln-aot carries both onto the ATen nodes. The min-cut
partitioner then saves the shards, not the gathered parameters, and the backward gathers
the unit again, as eager FSDP2 does; untagged, the gathered parameters are saved. A unit's
small parameters (1-D: biases, norms' weights) are the exception: their copies out of the
gathered buffer are tagged ``recompute_in_backward=False`` and saved (unsharded; a few KB
a unit). Recomputable, they looked free to the cut (the backward regathers the unit for
its weights anyway), which then recomputed the residual stream from saved matmul outputs
and the blocks' biases: every unit's regather was waited on at the backward's start, all
units' parameters alive at once. Saved, nothing but a unit's own backward reads its
regather, and the collectives pass (which moves a gather with the copies and the
concatenation that pack its input, and places each reduce-scatter, whose gradients the
graph only returns, right after its gradients) issues a unit's all-gather about one unit
ahead of its first use (``KILN_PREFETCH_GROUPS``, default 1), in the forward and in the
backward, and waits on one unit's reduce-scatter before the next unit's start: the graph
holds about two units' unsharded parameters and one unit's unsharded gradients at a time,
not the whole model. A coalesced gather costs a copy per parameter out of the unit's
buffer and a copy of the unit's gradients into the reduce-scatter's (FSDP2's own copy-in
and copy-out): rank 0's peak is eager FSDP2's or a little above, more than the
per-parameter graph's (README, "Distributed").
Whether a unit reshards is read at each call: each setting of the units has its own
captured call (a copy of the root's ``forward``) and stand-ins, so after
``set_reshard_after_forward`` the graph is built again for the new setting (the earlier
one is kept for the old setting).

Mixed precision (``MixedPrecisionPolicy``): ``AllGatherUnit`` casts the shards to
``param_dtype`` before gathering them (the stand-ins have that dtype, so the graph computes
in it) and the gradients to ``reduce_dtype`` before their reduce-scatter, then back to the
parameters' dtype; ``cast_forward_inputs`` becomes a forward pre-hook in place of FSDP's
that kiln-capture traces (``_CAST_SOURCE``), and the root's own inputs are cast by the
compiled call's first lines.

When it applies: every unit has FSDP's defaults where they change what the graph must do
(no ``output_dtype`` cast, a float32 or bfloat16 reduction, no CPU offload, a 1-D shard
mesh and Shard(0) placements, no custom collectives or divide factors, gradient sync on,
no unsharded gradients accumulated and every parameter sharded, checked on every call),
and ``model``'s outermost units are FSDP's roots. A call where any of these does not hold
runs the regions of kiln/fsdp.py: per-block compilation under an eager root, the
micro-batches of gradient accumulation under ``set_requires_gradient_sync(False)`` and the
step after them, whose reduce-scatter FSDP owes. ``kiln.compile(model,
options={"fsdp_graph": False})`` always takes the regions.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

import kiln_aot
from kiln import fsdp

Backend = Callable[[torch.fx.GraphModule, list], Callable]

# sharded parameters gathered in each graph compiled this way since the last kiln.reset()
GATHERED: list[int] = []


class _Param:
    """One FSDP parameter: its stand-in and how its shard becomes the unsharded value.
    (A plain class: a dataclass's generated ``__init__`` is not code of kiln's files, so a
    compiled training step calling the model would capture it once per parameter.)"""

    def __init__(
        self,
        fsdp_param: Any,  # torch's FSDPParam
        standin: torch.nn.Parameter,
        group_name: str,
        group_size: int,
        padded_rows: int,
        param_dtype: torch.dtype | None,  # FSDP's mixed precision: gathered and computed in
        reduce_dtype: torch.dtype | None,  # reduce-scattered in (None: the gradient's dtype)
        unit: int,  # its FSDP parameter group's number: the collectives pass's group
        reshard: bool,  # the unit reshards after forward: the backward gathers it again
    ) -> None:
        self.fsdp_param, self.standin = fsdp_param, standin
        self.group_name, self.group_size, self.padded_rows = group_name, group_size, padded_rows
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.unit, self.reshard = unit, reshard

    def coalesce_key(self) -> tuple:
        """Parameters gathered by one collective: a unit's, alike in group, dtypes, whether
        they need gradients and whether the backward gathers them again."""
        grad = self.standin.requires_grad
        dtype = self.standin.dtype
        return (
            self.unit,
            self.group_name,
            self.group_size,
            self.param_dtype,
            self.reduce_dtype,
            self.reshard,
            grad,
            dtype,
            self.fsdp_param.sharded_param.dtype,
        )

    def local(self) -> torch.Tensor:
        # read each call: FSDP may replace its sharded parameter (load_state_dict)
        return LocalShard.apply(self.fsdp_param.sharded_param, self.fsdp_param)

    def swap(self, param: torch.nn.Parameter) -> None:
        info = self.fsdp_param._module_info
        info.module._parameters[info.param_name] = param
        for module, name in zip(info.shared_modules, info.shared_param_names):
            module._parameters[name] = param


class LocalShard(torch.autograd.Function):
    """A sharded parameter's local tensor, whose gradient becomes the parameter's as FSDP's
    post-backward makes it (``FSDPParam.to_sharded_dtensor``: a DTensor on the parameter's
    own spec). ``DTensor.to_local`` would build a new spec for every gradient, running
    torch's generated dataclass code inside a compiled step's backward."""

    @staticmethod
    def forward(ctx: Any, param: torch.Tensor, fsdp_param: Any) -> torch.Tensor:
        ctx.fsdp_param = fsdp_param
        return param._local_tensor.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return ctx.fsdp_param.to_sharded_dtensor(grad.contiguous()), None


def _groups(model: torch.nn.Module) -> list:
    return [g for u in fsdp.units(model) for g in u._get_fsdp_state()._fsdp_param_groups]


def _eligible(model: torch.nn.Module) -> bool:
    """FSDP's defaults hold where they change the graph (module docstring)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll
    from torch.distributed.fsdp._fully_shard._fsdp_api import CPUOffloadPolicy
    from torch.distributed.fsdp._fully_shard._fsdp_common import (
        FSDPMeshInfo,
        HSDPMeshInfo,
        TrainingState,
    )
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    for group in _groups(model):
        if group.mp_policy.output_dtype is not None:
            return False
        reduced = group._reduce_dtype or group.mp_policy.param_dtype or group._orig_dtype
        if reduced not in (None, torch.float32, torch.bfloat16):
            return False  # FSDP divides before and after a float16 sum: not an average
        if isinstance(group.offload_policy, CPUOffloadPolicy):
            return False
        info = group.mesh_info
        if not isinstance(info, FSDPMeshInfo) or isinstance(info, HSDPMeshInfo):
            return False
        if not (group.reduce_grads and group.all_reduce_grads):
            return False
        if group.gradient_divide_factor is not None or group.force_sum_reduction_for_comms:
            return False
        if type(group._all_gather_comm) is not coll.DefaultAllGather:
            return False
        if type(group._reduce_scatter_comm) is not coll.DefaultReduceScatter:
            return False
        if group._training_state != TrainingState.IDLE or group._all_reduce_hook is not None:
            return False
        for p in group.fsdp_params:
            if p.fsdp_placement.dim != 0 or p.is_dtensor or p.offload_to_cpu:
                return False
            if p.sharded_state != ShardedState.SHARDED or p.unsharded_accumulated_grad is not None:
                return False
            unsharded = getattr(p, "_unsharded_param", None)  # FSDP's, after its first gather
            if unsharded is not None and unsharded.grad is not None:
                return False  # gradients accumulated without sync: FSDP reduces them
            if hasattr(p, "_extensions_data"):  # a tensor subclass's own all-gather
                return False
    return True


class Whole:
    """The graph path of one ``kiln.compile(root)``: its stand-ins and the scope that puts
    them (and takes FSDP's forward hooks out) while the compiled call runs."""

    def __init__(self, model: torch.nn.Module, enabled: bool = True) -> None:
        self.model = weakref.ref(model)
        self.enabled = enabled
        self.params: dict[int, _Param] = {}  # by id of the stand-in
        # by id of FSDP's parameter (the entry holds it) and whether its unit reshards
        self.made: dict[tuple[int, bool], _Param] = {}
        self.hooks: list[tuple[torch.nn.Module, str, dict]] = []
        self.depth = 0
        self.tops: list[weakref.ref] | None = None
        # the captured root call, one per setting of the units' reshard_after_forward
        # (compile_whole sets the factory): the setting decides which gathers the backward
        # repeats, so a graph is built for each setting met
        self.make_forward: Callable[[], Callable] | None = None
        self.forwards: dict[tuple[bool, ...], Callable] = {}

    def applies(self) -> bool:
        model = self.model()
        if model is None or not self.enabled or self.depth:
            return False
        if self.tops is None:
            self.tops = [weakref.ref(u) for u in _outermost(model)]
        return _ready(model, [u for ref in self.tops if (u := ref()) is not None])

    def enter(self) -> None:
        self.depth += 1
        if self.depth > 1:
            return
        model = self.model()
        for unit, group in enumerate(_groups(model)):
            reshard = _reshards(group)
            for p in group.fsdp_params:
                # the same stand-in every call: captured frames guard it. One per setting of
                # reshard_after_forward: set_reshard_after_forward() changes the stand-in,
                # so the frame is captured again and its graph built for the new setting
                entry = self.made.get((id(p), reshard))
                if entry is None:
                    entry = self.made[id(p), reshard] = _stand_in(p, group, unit)
                    self.params[id(entry.standin)] = entry
                entry.swap(entry.standin)
        for unit in fsdp.units(model):
            cast = _cast_inputs_hook(unit._get_fsdp_state()._mp_policy)
            for table in ("_forward_pre_hooks", "_forward_hooks"):
                hooks = getattr(unit, table)
                kept = dict(hooks)
                for key, hook in kept.items():
                    if not fsdp._is_fsdp_hook(hook):
                        continue
                    if table == "_forward_pre_hooks" and cast is not None:
                        hooks[key] = cast  # FSDP's pre-hook takes kwargs: so does this
                    else:
                        del hooks[key]
                self.hooks.append((unit, table, kept))

    def leave(self) -> None:
        self.depth -= 1
        if self.depth:
            return
        for entry in self.params.values():
            entry.swap(entry.fsdp_param.sharded_param)
        for unit, table, kept in self.hooks:
            hooks = getattr(unit, table)
            added = {k: h for k, h in hooks.items() if k not in kept}
            hooks.clear()
            hooks.update(kept)
            hooks.update(added)
        self.hooks.clear()

    def or_else(self, regions: Callable) -> Callable:
        """The compiled call: the whole graph where it applies, else ``regions``."""

        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.applies():
                return regions(*args, **kwargs)
            model = self.model()
            setting = tuple(_reshards(g) for g in _groups(model))
            forward = self.forwards.get(setting)
            if forward is None:
                forward = self.forwards[setting] = self.make_forward()
            self.enter()
            try:
                return forward(model, *args, **kwargs)
            finally:
                self.leave()

        call.__wrapped__ = regions
        return call

    def backend(self, inner: Backend) -> Backend:
        """``inner`` applied to the graph ``gather_params`` made of a captured one."""

        def gathering_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            found = gather_params(gm, example_inputs, self.params)
            if not found:
                return inner(gm, example_inputs)
            examples = list(example_inputs)
            for i, entry in found:
                examples[i] = entry.local().detach().requires_grad_(entry.standin.requires_grad)
            GATHERED.append(len(found))
            compiled = inner(gm, examples)

            def call(*args: Any) -> Any:
                args = list(args)
                for i, entry in found:
                    args[i] = entry.local()
                return compiled(*args)

            return call

        return gathering_backend


def compile_whole(
    model: torch.nn.Module,
    optimize: Callable[[Backend], Callable],
    backend: Backend,
    enabled: bool = True,
) -> Whole:
    """The graph path of ``kiln.compile(model)``: ``optimize(backend)`` (kiln-capture with
    kiln.compile's options) over a copy of the model's forward, with ``gather_params``
    before ``backend``; ``Whole.or_else(regions)`` is the compiled call."""
    whole = Whole(model, enabled)
    forward = type(model).forward
    cast = _cast_inputs_hook(model._get_fsdp_state()._mp_policy) if fsdp.is_unit(model) else None
    if cast is not None:  # the root's own inputs are cast as its FSDP pre-hook would
        forward = _CAST["root_call"](cast, forward)
    # a code object of its own for each (kiln-capture's cache is per code object)
    whole.make_forward = lambda: optimize(whole.backend(backend))(fsdp._own_copy(forward))
    return whole


# FSDP's cast of a unit's floating-point inputs to its parameters' dtype (mixed precision,
# ``cast_forward_inputs``), as a forward pre-hook kiln-capture traces into the graph:
# compiled from source under a file name of its own (kiln's own files are never traced)
_CAST_SOURCE = """
def cast_floats(x, dtype):
    if isinstance(x, torch.Tensor):
        if torch.is_floating_point(x) and x.dtype != dtype:
            return x.to(dtype)
        return x
    if type(x) is tuple or type(x) is list:
        return type(x)([cast_floats(y, dtype) for y in x])
    if type(x) is dict:
        return {k: cast_floats(v, dtype) for k, v in x.items()}
    return x


def make_hook(dtype):
    def cast_forward_inputs(module, args, kwargs):
        return cast_floats(args, dtype), cast_floats(kwargs, dtype)

    return cast_forward_inputs


def root_call(cast, forward):
    def cast_then_forward(self, *args, **kwargs):
        args, kwargs = cast(self, args, kwargs)
        return forward(self, *args, **kwargs)

    return cast_then_forward
"""
_CAST: dict = {"torch": torch}
exec(compile(_CAST_SOURCE, "<fsdp cast_forward_inputs>", "exec"), _CAST)
_CAST_HOOKS: dict[torch.dtype, Callable] = {}


def _cast_inputs_hook(policy: Any) -> Callable | None:
    if not (policy.cast_forward_inputs and policy.param_dtype):
        return None
    dtype = policy.param_dtype
    if dtype not in _CAST_HOOKS:  # one hook per dtype: captured frames guard on it
        _CAST_HOOKS[dtype] = _CAST["make_hook"](dtype)
    return _CAST_HOOKS[dtype]


def _ready(model: torch.nn.Module, tops: list[torch.nn.Module]) -> bool:
    """FSDP initialized (as its first forward does) with ``model``'s outermost units as
    FSDP's roots: a unit compiled alone whose parent is FSDP's root (per-block
    compilation) runs its region between the root's hooks."""
    for unit in tops:
        state = unit._get_fsdp_state()
        if state._is_root is None:
            state._lazy_init()
        if not state._is_root:
            return False
    return _eligible(model)


def _outermost(model: torch.nn.Module) -> list[torch.nn.Module]:
    units = fsdp.units(model)
    inner = {id(m) for u in units for m in u.modules() if m is not u}
    return [u for u in units if id(u) not in inner]


def _reshards(group: Any) -> bool:
    """Whether FSDP frees ``group``'s unsharded parameters after its forward (read at each
    call: ``set_reshard_after_forward`` changes it)."""
    return group.post_forward_mesh_info is not None


def _stand_in(p: Any, group: Any, unit: int) -> _Param:
    """``p``'s stand-in; whether its unit reshards after forward is FSDP's
    ``post_forward_mesh_info`` as its lazy init left it (None for the root, whose
    parameters the backward needs at once, and under ``reshard_after_forward=False``)."""
    size = p._orig_size
    standin = torch.nn.Parameter(
        torch.empty(size, dtype=p.param_dtype or p.orig_dtype, device=p.sharded_param.device),
        requires_grad=p.sharded_param.requires_grad,
    )
    standin.untyped_storage().resize_(0)  # a shape for capture, no memory
    pg = p.mesh_info.shard_process_group
    rows = p.padded_sharded_param_size[0]
    reshard = _reshards(group)
    return _Param(
        p, standin, pg.group_name, pg.size(), rows, p.param_dtype, p.reduce_dtype, unit, reshard
    )


def gather_params(
    gm: torch.fx.GraphModule, example_inputs: list, params: dict[int, _Param]
) -> list[tuple[int, _Param]]:
    """Rewrite the stand-in placeholders of ``gm`` (by their example inputs) into the
    gathers of their shards, one collective per FSDP unit (module docstring); returns
    (input index, parameter) of each."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    units: dict[tuple, list[tuple[torch.fx.Node, _Param]]] = {}
    for i, (ph, value) in enumerate(zip(placeholders, example_inputs)):
        entry = params.get(id(value))
        if entry is None or entry.standin is not value:
            continue
        found.append((i, entry))
        units.setdefault(entry.coalesce_key(), []).append((ph, entry))
    if found:
        # capture adds a placeholder where its value is first read: all first (in their
        # order, which is the inputs'), so each unit's gather can come just before the
        # first read of any of its parameters. There, not all at the start: autograd runs
        # a gather's backward (its reduce-scatter) after everything recorded later, so
        # gathers recorded first would put every unit's reduce-scatter at the backward's
        # end; kiln-inductor's collectives pass issues each gather ahead of that point
        _placeholders_first(gm.graph, placeholders)
        position = {n: k for k, n in enumerate(gm.graph.nodes)}
        for members in units.values():
            readers = [u for ph, _ in members for u in ph.users]
            first = min(readers, key=position.__getitem__, default=gm.graph.output_node())
            _gather_unit(gm.graph, first, members)
        gm.graph.lint()
        gm.recompile()
    return found


def _placeholders_first(graph: torch.fx.Graph, placeholders: list[torch.fx.Node]) -> None:
    """Move ``placeholders`` (all of ``graph``'s, in order) to its start."""
    anchor = placeholders[0]
    start = next(iter(graph.nodes))
    if start is not anchor:
        start.prepend(anchor)
    for ph in placeholders[1:]:
        if anchor.next is not ph:
            anchor.append(ph)
        anchor = ph


class AllGatherUnit(torch.autograd.Function):
    """FSDP's all-gather of one unit's (padded) dim-0 shards over a group of ``n`` ranks,
    as FSDP2 does it: the shards flattened into one buffer, one
    ``_c10d_functional.all_gather_into_tensor`` of it, each parameter's rows taken from
    every rank's part. Its gradient is FSDP's: the unsharded gradients laid out the same
    way, one ``reduce_scatter_tensor`` averaging over the group (the op's own autograd rule
    sums), each shard's gradient taken from this rank's part."""

    @staticmethod
    def forward(
        ctx: Any,
        n: int,
        group_name: str,
        param_dtype: torch.dtype | None,  # mixed precision: gathered in the compute dtype
        reduce_dtype: torch.dtype | None,
        unit: int | None,
        *shards: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.n, ctx.group_name, ctx.reduce_dtype, ctx.unit = n, group_name, reduce_dtype, unit
        ctx.shapes = [s.shape for s in shards]
        ctx.dtypes = [s.dtype for s in shards]
        ctx.gathered = (param_dtype or shards[0].dtype, shards[0].device)
        if param_dtype is not None:
            shards = tuple(s.to(param_dtype) for s in shards)
        numels = [s.numel() for s in shards]
        flat = torch.cat([s.reshape(-1) for s in shards]) if len(shards) > 1 else shards[0]
        c10d = torch.ops._c10d_functional
        out = c10d.wait_tensor(c10d.all_gather_into_tensor(flat.reshape(-1), n, group_name))
        parts = out.view(n, -1).split(numels, dim=1)
        params = []
        for p, s in zip(parts, shards, strict=True):
            # a small parameter's copy (a bias, a norm's weight) is saved for the backward,
            # never recomputed from the unit's regather (module docstring, "Memory")
            small = {"recompute_in_backward": False} if s.dim() <= 1 else {}
            with kiln_aot.annotate(**small):
                params.append(p.reshape(n * s.shape[0], *s.shape[1:]))
        return tuple(params)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple:
        n, (dtype, device) = ctx.n, ctx.gathered
        rows = [  # a parameter the loss does not reach: a zero gradient, as FSDP reduces
            (g if g is not None else torch.zeros((n, *shape), dtype=dtype, device=device)).reshape(
                n, -1
            )
            for g, shape in zip(grads, ctx.shapes, strict=True)
        ]
        flat = torch.cat(rows, dim=1) if len(rows) > 1 else rows[0]
        if ctx.reduce_dtype is not None:
            flat = flat.to(ctx.reduce_dtype)
        c10d = torch.ops._c10d_functional
        # the unit's reduce-scatter is a collective group too: kiln-inductor bounds how many
        # units' gradients are in flight (module docstring, "Memory")
        group = {} if ctx.unit is None else {"collective_group": ("reduce_scatter", ctx.unit)}
        with kiln_aot.annotate(**group):
            out = c10d.reduce_scatter_tensor(flat.reshape(-1), "avg", n, ctx.group_name)
            out = c10d.wait_tensor(out)
        parts = out.split([s.numel() for s in ctx.shapes])
        shards = [p.view(shape).to(dtype) for p, shape, dtype in zip(parts, ctx.shapes, ctx.dtypes)]
        return (None, None, None, None, None, *shards)


def all_gather_unit(
    n: int,
    group_name: str,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
    unit: int | None,
    *shards: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """``AllGatherUnit``: the graph's call (a module-level name, which FX code can print)."""
    return AllGatherUnit.apply(n, group_name, param_dtype, reduce_dtype, unit, *shards)


def _gather_unit(
    graph: torch.fx.Graph, before: torch.fx.Node, members: list[tuple[torch.fx.Node, _Param]]
) -> None:
    """Before ``before``: each member placeholder (now its shard) padded to FSDP's padded
    shard rows, one ``all_gather_unit`` of them all, each result narrowed to the unsharded
    rows; the placeholders' readers read those."""
    first = members[0][1]
    n, grad = first.group_size, first.standin.requires_grad
    stack = next(
        (ph.meta["nn_module_stack"] for ph, _ in members if "nn_module_stack" in ph.meta), None
    )
    device = members[0][0].meta.get("device", first.fsdp_param.sharded_param.device)

    def add(target: Any, args: tuple, val: Any) -> torch.fx.Node:
        node = graph.call_function(target, args)
        node.meta.update({"val": val, "device": device})
        if stack is not None:
            node.meta["nn_module_stack"] = stack
        # kiln-aot carries these onto the ATen nodes (module docstring, "Memory")
        node.meta["collective_group"] = ("all_gather", first.unit)
        if first.reshard:
            node.meta["recompute_in_backward"] = True
        return node

    def meta(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        # as capture records a value: a meta tensor
        return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)

    users = {ph: list(ph.users) for ph, _ in members}
    fulls = {ph: ph.meta["val"] for ph, _ in members}
    padded = []
    with graph.inserting_before(before):
        for ph, entry in members:
            full, local = fulls[ph], entry.local()
            ph.meta.update({"val": meta(tuple(local.shape), local.dtype), "device": device})
            rest = tuple(full.shape[1:])
            x = ph
            # every rank pads (its last ranks' shards are short) or none does: the graphs of
            # all ranks have the same nodes, so kiln-inductor's collectives pass, which
            # places collectives by their positions in the graph, issues them in one order
            if entry.padded_rows * n != full.shape[0]:
                pad = [0, 0] * len(rest) + [0, entry.padded_rows - local.shape[0]]
                x = add(
                    torch.constant_pad_nd, (x, pad), meta((entry.padded_rows, *rest), local.dtype)
                )
            padded.append(x)
        vals = tuple(
            meta((entry.padded_rows * n, *fulls[ph].shape[1:]), fulls[ph].dtype)
            for ph, entry in members
        )
        args = (n, first.group_name, first.param_dtype, first.reduce_dtype, first.unit, *padded)
        gathered = add(all_gather_unit, args, vals)
        for k, (ph, _) in enumerate(members):
            full = fulls[ph]
            x = add(operator.getitem, (gathered, k), vals[k])
            if vals[k].shape[0] != full.shape[0]:
                x = add(torch.narrow, (x, 0, 0, full.shape[0]), meta(tuple(full.shape), full.dtype))
            for user in users[ph]:
                user.replace_input_with(ph, x)


__all__ = ["GATHERED", "Whole", "compile_whole", "gather_params"]
