"""Runtime wrappers around compiled graphs: input-mutation write-back, alias outputs
regenerated as real views, and the ``autograd.Function`` that runs a compiled forward and
backward.

# Runtime

``InferencePlan`` runs one compiled forward-only graph. ``TrainingPlan`` runs the compiled
forward inside ``CompiledFunction`` (saving what the partitioner chose) and the compiled
backward when autograd asks for gradients; a second differentiation of that backward raises
``DoubleBackwardError``. Both finish the same way (``finish``): write each mutated input's
new value back into the input (``copy_``, in order of first write, outside autograd),
rebuild outputs that alias an input as ``as_strided`` views of the real input (so they stay
views, and autograd differentiates them natively), and rebuild the output's pytree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kiln_aot.backward_variants import BackwardVariants, contiguous_tangent
from kiln_aot.errors import DoubleBackwardError
from kiln_aot.graph_trace import OutputInfo, TraceInfo

# Autocast acts when a graph is traced: the traced graph holds its casts and the dtypes
# they give. Its compiled code must then run with autocast off, or the ATen ops it calls
# (extern matmuls, fallback kernels) would be cast again and hand a kernel a bf16 buffer
# where the graph planned a float32 one (a nested ``torch.autocast(enabled=False)``
# region's matmul, rotary embeddings: garbage on the CPU, a Triton compile error on GPUs).
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
_no_autocast = torch._C._DisableAutocast


def autocast_key() -> tuple:
    """The thread's autocast state, part of a plan's key: ``()`` when autocast is off."""
    if not _any_autocast():
        return ()
    return tuple(
        (d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)
    )


def call_without_autocast(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` with autocast off (compiled code, see above)."""
    if not _any_autocast():
        return fn(*args)
    with _no_autocast():
        return fn(*args)


def _as_tuple(out: Any) -> tuple:
    if isinstance(out, (tuple, list)):
        return tuple(out)
    return (out,)


def _alias(inp: torch.Tensor, info: OutputInfo) -> torch.Tensor:
    if (
        tuple(inp.shape) == info.size
        and tuple(inp.stride()) == info.stride
        and inp.storage_offset() == info.storage_offset
    ):
        return inp
    return inp.as_strided(info.size, info.stride, info.storage_offset)


def _same_memory(value: torch.Tensor, target: torch.Tensor) -> bool:
    """``value`` is ``target``'s memory read the same way (a graph that wrote an input's
    new value in place returns the input, or a view of it over the same elements)."""
    return value is target or (
        value.data_ptr() == target.data_ptr()
        and value.shape == target.shape
        and value.stride() == target.stride()
        and value.dtype == target.dtype
        and value.device == target.device
    )


def finish(
    info: TraceInfo,
    flat_args: Sequence[Any],
    user_values: Sequence[torch.Tensor],
    mutation_values: Sequence[torch.Tensor],
) -> Any:
    """Write back mutations, rebuild alias outputs, unflatten. ``user_values``: one tensor per
    user output of kind ``"tensor"``, in order."""
    for index, value in zip(info.mutated_inputs, mutation_values):
        target = flat_args[index]
        if _same_memory(value, target):  # computed in the input's storage by the graph
            torch.autograd.graph.increment_version(target)
            continue
        if value.requires_grad:
            # written with grad: the input's history continues through the graph (and
            # autograd refuses it on a leaf, as eager does)
            target.copy_(value)
        else:
            with torch.no_grad():  # written under no_grad, or no grad at all
                target.copy_(value)
    it = iter(user_values)
    leaves = []
    for o in info.outputs:
        if o.kind == "constant":
            leaves.append(o.value)
        elif o.kind == "alias" and o.replay:  # a dtype-changing view: the real view ops
            t = flat_args[o.input_index]
            for op, args in o.replay:
                t = op(t, *args)
            leaves.append(t)
        elif o.kind == "alias" and o.geometry is not None:  # symbolic: this call's sizes
            size, stride, offset = o.geometry(flat_args)
            leaves.append(flat_args[o.input_index].as_strided(size, stride, offset))
        elif o.kind == "alias":
            leaves.append(_alias(flat_args[o.input_index], o))
        else:
            leaves.append(next(it))
    return pytree.tree_unflatten(leaves, info.out_spec)


def returns_graph_outputs(info: TraceInfo) -> bool:
    """Whether ``finish`` returns the graph's user outputs as they are, as one tuple: no
    input is written, no output is a constant or an alias, the output is a flat tuple."""
    if info.mutated_inputs or any(o.kind != "tensor" for o in info.outputs):
        return False
    n = len(info.outputs)
    try:
        rebuilt = pytree.tree_unflatten(list(range(n)), info.out_spec)
    except Exception:
        return False
    return type(rebuilt) is tuple and rebuilt == tuple(range(n))


@dataclass
class InferencePlan:
    compiled: Callable
    info: TraceInfo
    num_user: int  # graph outputs before the mutated inputs' values
    # compiled for a call with grad enabled and inputs that require grad whose outputs
    # and writes have no gradient (an optimizer step): guarded calls expect that mode
    under_grad: bool = False

    def __post_init__(self) -> None:
        self.plain = returns_graph_outputs(self.info)  # read on every call
        # the compiled graph's call for inputs the caller has guarded, where it has one
        self._guarded = getattr(self.compiled, "kiln_guarded_call", self.compiled)

    def __call__(self, flat_args: Sequence[Any]) -> Any:
        return self._finish(flat_args, _as_tuple(call_without_autocast(self.compiled, *flat_args)))

    def guarded(self, flat_args: Sequence[Any]) -> Any:
        """``self(flat_args)`` for inputs matching the plan's examples in dtype, device,
        sizes and strides (api.guarded_call's callers check them)."""
        return self._finish(flat_args, _as_tuple(call_without_autocast(self._guarded, *flat_args)))

    def _finish(self, flat_args: Sequence[Any], outs: tuple) -> Any:
        if self.plain:
            return outs if len(outs) == self.num_user else outs[: self.num_user]
        return finish(self.info, flat_args, outs[: self.num_user], outs[self.num_user :])


@dataclass
class TrainingPlan:
    fw: Callable
    bw: Callable | None  # None: compiled on the first backward (``variants``)
    info: TraceInfo
    num_user: int  # user forward outputs (before mutated inputs' values)
    num_fwd_outputs: int
    differentiable: tuple[int, ...]
    grad_inputs: tuple[int, ...]
    num_inputs: int
    # positions among the saved values that are ints (size symbols the backward binds):
    # autograd saves only tensors, so these are kept apart (decided when compiled)
    saved_ints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # forward outputs without a tangent (fixed per plan; read on every call)
        diff = set(self.differentiable)
        self.nondifferentiable = tuple(i for i in range(self.num_fwd_outputs) if i not in diff)
        self.plain = returns_graph_outputs(self.info)
        # the backward compiled per set of tangent strides, on first sight of each
        # (backward_variants.py); None: ``bw`` serves every call (tangents made contiguous)
        self.variants: BackwardVariants | None = None

    def backward_for(self, tangents: list[torch.Tensor]) -> tuple[Callable, list[torch.Tensor]]:
        """The compiled backward for these tangents, and the tangents it takes: as they
        are where a backward is (or now gets) compiled for their strides, else copied."""
        if self.variants is None:
            return self.bw, [contiguous_tangent(t, k) for k, t in enumerate(tangents)]
        return self.variants.backward_for(tangents)

    def __call__(self, flat_args: Sequence[Any]) -> Any:
        outs = CompiledFunction.apply(self, *flat_args)
        if self.plain:
            return outs if len(outs) == self.num_user else outs[: self.num_user]
        return finish(self.info, flat_args, outs[: self.num_user], outs[self.num_user :])


def _double_backward_guard(grads: tuple) -> tuple:
    """Gradients that raise ``DoubleBackwardError``'s message if differentiated again."""
    present = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
    if not present:
        return grads
    err = torch._C._functions.DelayedError(DoubleBackwardError.MESSAGE, len(present))
    guarded = _as_tuple(err(*[grads[i].detach().requires_grad_(True) for i in present]))
    out = list(grads)
    for i, g in zip(present, guarded):
        out[i] = g
    return tuple(out)


class CompiledFunction(torch.autograd.Function):
    """Runs ``plan.fw`` forward, ``plan.backward_for``'s backward backward. Outputs: the
    forward graph's user outputs then mutated inputs' values (the latter non-differentiable)."""

    @staticmethod
    def forward(ctx, plan: TrainingPlan, *args):
        outs = _as_tuple(call_without_autocast(plan.fw, *args))
        fw_outs, saved = outs[: plan.num_fwd_outputs], outs[plan.num_fwd_outputs :]
        if plan.info.mutated_inputs:
            # A saved input that is about to be overwritten keeps its pre-write value.
            written = {id(args[i]) for i in plan.info.mutated_inputs}
            saved = tuple(s.clone() if id(s) in written else s for s in saved)
        ctx.plan = plan
        if plan.variants is not None and plan.variants.saved_strides is None:
            plan.variants.note_saved(saved)
        if plan.saved_ints:
            ctx.saved_ints = [saved[k] for k in plan.saved_ints]
            ints = set(plan.saved_ints)
            saved = tuple(v for k, v in enumerate(saved) if k not in ints)
        ctx.save_for_backward(*saved)
        nondiff = [
            fw_outs[i] for i in plan.nondifferentiable if isinstance(fw_outs[i], torch.Tensor)
        ]
        if nondiff:
            ctx.mark_non_differentiable(*nondiff)
        return tuple(fw_outs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        plan: TrainingPlan = ctx.plan
        bw, tangents = plan.backward_for([grad_outputs[i] for i in plan.differentiable])
        saved = list(ctx.saved_tensors)
        # Without retain_graph autograd would keep the saved tensors until this returns:
        # dropped now, each is freed when the compiled backward no longer needs it (a
        # backward that takes its inputs as a list it may empty: ``call_stealing``).
        ctx.maybe_clear_saved_tensors()
        if plan.saved_ints:
            for k, v in zip(plan.saved_ints, ctx.saved_ints):
                saved.insert(k, v)
        args = saved + list(tangents)
        del saved, tangents
        steal = getattr(bw, "call_stealing", None)
        run = steal if steal is not None else (lambda a: bw(*a))
        if torch.is_grad_enabled():
            # create_graph=True: the compiled backward is not itself differentiable.
            with torch.no_grad():
                grads = _as_tuple(call_without_autocast(run, args))
            grads = _double_backward_guard(grads)
        else:
            grads = _as_tuple(call_without_autocast(run, args))
        result: list[Any] = [None] * (plan.num_inputs + 1)
        for index, g in zip(plan.grad_inputs, grads):
            result[index + 1] = g
        return tuple(result)
