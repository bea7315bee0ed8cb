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
  size, all-gathered over the unit's shard group (``AllGatherShard``:
  ``_c10d_functional.all_gather_into_tensor`` and ``wait_tensor``) and narrowed to the
  unsharded rows: the unsharded parameter is a value of the graph. ``AllGatherShard``'s
  gradient is FSDP's: a ``reduce_scatter_tensor`` averaging over the group (the op's own
  autograd rule sums), which reaches the DTensor parameter as a DTensor shard on the
  parameter's own spec, as FSDP's post-backward writes it.
- kiln-inductor's collectives pass waits on each collective just before the first kernel
  reading it and issues it early, bounded per unit (below): forward and backward
  prefetching, and each reduce-scatter under the next unit's backward.

Memory: each gather node is tagged ``collective_group`` (its unit; the reduce-scatters of
its backward too, through ``kiln_aot.annotate``) and, where the unit reshards after
forward (FSDP's default; not the root, nor ``reshard_after_forward=False``),
``recompute_in_backward``: kiln-aot carries both onto the ATen nodes. The min-cut
partitioner then saves the shard, not the gathered parameter, and the backward gathers it
again, as eager FSDP2 does; untagged, the gathered parameter is saved. The collectives pass
issues a unit's all-gathers about one unit ahead of its first use
(``KILN_PREFETCH_GROUPS``, default 1), in the forward and in the backward, and waits on one
unit's reduce-scatters before the next unit's start: the graph holds about two units'
unsharded parameters and one unit's unsharded gradients at a time, not the whole model.
Whether a unit reshards is read at each call: each setting of the units has its own
captured call (a copy of the root's ``forward``) and stand-ins, so after
``set_reshard_after_forward`` the graph is built again for the new setting (the earlier
one is kept for the old setting).

Mixed precision (``MixedPrecisionPolicy``): ``AllGatherShard`` casts the shard to
``param_dtype`` before gathering it (the stand-ins have that dtype, so the graph computes
in it) and the gradient to ``reduce_dtype`` before its reduce-scatter, then back to the
parameter's dtype; ``cast_forward_inputs`` becomes a forward pre-hook in place of FSDP's
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
    """Rewrite each stand-in placeholder of ``gm`` (by its example input) into the gather
    of its shard (module docstring); returns (input index, parameter) of each."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for i, (ph, value) in enumerate(zip(placeholders, example_inputs)):
        entry = params.get(id(value))
        if entry is None or entry.standin is not value:
            continue
        found.append((i, entry))
        _gather(gm.graph, ph, entry)
    if found:
        gm.graph.lint()
        gm.recompile()
    return found


class AllGatherShard(torch.autograd.Function):
    """FSDP's all-gather of a (padded) dim-0 shard over a group of ``n`` ranks; its
    gradient is FSDP's: the reduce-scatter of the unsharded gradient, averaged over the
    group. (``_c10d_functional.all_gather_into_tensor``'s own autograd rule sums.)"""

    @staticmethod
    def forward(
        ctx: Any,
        shard: torch.Tensor,
        n: int,
        group_name: str,
        param_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        unit: int | None = None,
    ) -> torch.Tensor:
        ctx.n, ctx.group_name, ctx.reduce_dtype, ctx.dtype, ctx.unit = (
            n,
            group_name,
            reduce_dtype,
            shard.dtype,
            unit,
        )
        if param_dtype is not None:  # mixed precision: gathered in the compute dtype
            shard = shard.to(param_dtype)
        c10d = torch.ops._c10d_functional
        return c10d.wait_tensor(c10d.all_gather_into_tensor(shard, n, group_name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        c10d = torch.ops._c10d_functional
        if ctx.reduce_dtype is not None:
            grad = grad.to(ctx.reduce_dtype)
        # the unit's reduce-scatters are a collective group too: kiln-inductor bounds how
        # many units' gradients are in flight (module docstring, "Memory")
        group = {} if ctx.unit is None else {"collective_group": ("reduce_scatter", ctx.unit)}
        with kiln_aot.annotate(**group):
            out = c10d.reduce_scatter_tensor(grad.contiguous(), "avg", ctx.n, ctx.group_name)
            out = c10d.wait_tensor(out)
        return out.to(ctx.dtype), None, None, None, None, None


def all_gather_shard(
    shard: torch.Tensor,
    n: int,
    group_name: str,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    unit: int | None = None,
) -> torch.Tensor:
    """``AllGatherShard``: the graph's call (a module-level name, which FX code can print)."""
    return AllGatherShard.apply(shard, n, group_name, param_dtype, reduce_dtype, unit)


def _gather(graph: torch.fx.Graph, ph: torch.fx.Node, entry: _Param) -> None:
    full = ph.meta["val"]
    local = entry.local()
    rows, n = full.shape[0], entry.group_size
    users = list(ph.users)
    grad = entry.standin.requires_grad

    def meta(shape: tuple, dtype: torch.dtype) -> dict:
        # as capture records a value: a meta tensor, and the device it lives on
        val = torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)
        return {"val": val, "device": ph.meta.get("device", local.device)}

    ph.meta.update(meta(tuple(local.shape), local.dtype))

    def add(target: Any, args: tuple, shape: tuple) -> torch.fx.Node:
        node = graph.call_function(target, args)
        gathered = target is not torch.constant_pad_nd
        node.meta.update(meta(shape, full.dtype if gathered else local.dtype))
        if "nn_module_stack" in ph.meta:
            node.meta["nn_module_stack"] = ph.meta["nn_module_stack"]
        # kiln-aot carries these onto the ATen nodes (module docstring, "Memory")
        node.meta["collective_group"] = ("all_gather", entry.unit)
        if entry.reshard:
            node.meta["recompute_in_backward"] = True
        return node

    rest = tuple(full.shape[1:])
    with graph.inserting_before(ph.next):
        x = ph
        # every rank pads (its last ranks' shards are short) or none does: the graphs of
        # all ranks have the same nodes, so kiln-inductor's collectives pass, which places
        # collectives by their positions in the graph, issues them in one order everywhere
        if entry.padded_rows * n != rows:
            pad = [0, 0] * len(rest) + [0, entry.padded_rows - local.shape[0]]
            x = add(torch.constant_pad_nd, (x, pad), (entry.padded_rows, *rest))
        shape = (entry.padded_rows * n, *rest)
        args = (x, n, entry.group_name, entry.param_dtype, entry.reduce_dtype, entry.unit)
        x = add(all_gather_shard, args, shape)
        if shape[0] != rows:
            x = add(torch.narrow, (x, 0, 0, rows), (rows, *rest))
    for user in users:
        user.replace_input_with(ph, x)


__all__ = ["GATHERED", "Whole", "compile_whole", "gather_params"]
