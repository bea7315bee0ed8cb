"""Entry points: ``aot_graph`` (what a backend calls), ``aot_function``, ``aot_module``.

# Compilation flow

Each call looks at its arguments' signature (shapes, strides, dtypes, devices,
``requires_grad``, non-tensor values) and whether gradients are needed now
(``torch.is_grad_enabled()`` and some input requires grad), and compiles once per
signature:

- inference: ``trace`` -> drop outputs that alias inputs -> ``fw_compiler(gm, inputs)``;
- training: ``trace_joint`` -> ``partition_fn`` -> ``fw_compiler(fw_gm, inputs)`` and
  ``bw_compiler(bw_gm, bw_inputs)`` (``bw_inputs``: the fake values of its placeholders).
  The backward is compiled on its first call, for the strides its tangents arrive with
  (backward_variants.py, "Lazy compilation"); a ``bw_compiler`` with the attribute
  ``kiln_eager_backward = True`` gets it with the forward, for the traced strides.

The callable runs through ``kiln_aot.runtime``.

# Persistent plans

``aot_graph(..., plan_store=store)`` consults ``store.load(signature)`` before tracing a
signature and offers each newly compiled plan to ``store.save(signature, plan)``: a
compiler that can serialize what its ``fw_compiler``/``bw_compiler`` returned (kiln-
inductor's artifact cache does) makes a second process skip tracing, partitioning and
compiling. A training plan is offered again each time its backward compiles for new
tangent strides (``BackwardVariants.on_compiled``); a loaded one compiles new strides
with this ``bw_compiler``. ``signature`` is the plan cache's key (this module's
``_signature``); the store adds the graph's own identity. Signatures holding an object
by identity (an unhashable non-tensor input) are never offered: their key means nothing
in another process. ``load`` returns an ``InferencePlan``/``TrainingPlan`` or None;
``save`` must not raise.

# Guarded calls

``aot_graph``'s callable checks every call's signature against its plan cache: a tuple of
six metadata reads per input, hashed and compared, about 1.5 us a tensor on CPU, which
for a model whose parameters are graph inputs is most of kiln-aot's per-call time. A
caller that already guards each tensor input's dtype, device, shape, stride and
``requires_grad`` (kiln-capture's tensor guards do, on every cache hit) can skip that:
the callable carries ``kiln_guarded_call``, the same call for inputs whose tensors match
the example inputs' in those five properties. It still reads what the caller does not
guard and what the plan depends on (grad mode, the module's ``training`` flag, the
storage offset of each input an output aliases, inputs sharing storage when the graph
writes one) and takes the checked path when any of them differs. It is offered only
when every example input is a tensor and the graph has no state of its own (no
parameters held as ``get_attr``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from kiln_shapes.compiling import compiler_running
from torch import fx
from torch.utils import _pytree as pytree

from kiln_aot import core_ops
from kiln_aot.backward_variants import BackwardVariants
from kiln_aot.debug_dump import DebugDump, partition_report
from kiln_aot.graph_trace import TraceInfo, symbolic_inputs, trace
from kiln_aot.joint import trace_joint
from kiln_aot.log import log
from kiln_aot.module_state import call_module, state_names, state_tensors, swapped_state
from kiln_aot.partition import min_cut_partition
from kiln_aot.runtime import InferencePlan, TrainingPlan, autocast_key

Compiler = Callable[[fx.GraphModule, list], Callable]


class PlanStore(Protocol):
    """Where compiled plans persist across processes (module docstring, "Persistent plans")."""

    def load(self, signature: tuple) -> InferencePlan | TrainingPlan | None: ...

    def save(self, signature: tuple, plan: InferencePlan | TrainingPlan) -> None: ...


def persistent_signature(signature: tuple) -> bool:
    """Whether a plan cache key means the same in another process (no object identities)."""
    return not any(type(p) is tuple and p[:1] == ("object",) for p in signature)


def _signature(
    flat: Sequence[Any], need_grad: bool, extra: Any, symbolic: Sequence[Any] | None = None
) -> tuple:
    """The plan cache's key. Runs on every call, over every input (a model's parameters
    too): ``torch.Size`` and the stride tuple are hashed as they come (no copies). An
    input with symbolic sizes is keyed without its sizes and strides: its plan serves every
    size (the caller guards them; kiln-capture does)."""
    parts: list[Any] = [need_grad, extra, autocast_key()]
    tensor = torch.Tensor
    for i, a in enumerate(flat):
        if symbolic is not None and i < len(symbolic) and symbolic[i] is not None:
            if isinstance(a, tensor):
                parts.append(("symbolic", a.dim(), a.dtype, a.device, a.requires_grad))
            else:  # an int the plan takes as a symbol
                parts.append(("symbolic int", type(a)))
        elif isinstance(a, tensor):
            parts.append(
                (a.shape, a.stride(), a.storage_offset(), a.dtype, a.device, a.requires_grad)
            )
        else:
            try:
                hash(a)
                parts.append(("value", type(a), a))
            except TypeError:
                parts.append(("object", id(a)))
    return tuple(parts)


def _inputs_share_storage(flat_args: Sequence[Any]) -> bool:
    seen = set()
    for a in flat_args:
        if isinstance(a, torch.Tensor) and a.untyped_storage().nbytes() > 0:
            ptr = a.untyped_storage().data_ptr()
            if ptr in seen:
                return True
            seen.add(ptr)
    return False


def drop_alias_outputs(gm: fx.GraphModule, info: TraceInfo) -> fx.GraphModule:
    """The graph without the outputs that alias inputs (the runtime rebuilds those)."""
    out_node = gm.graph.output_node()
    values = list(out_node.args[0])
    tensor_kinds = [o.kind for o in info.outputs if o.kind != "constant"]
    keep = [v for v, k in zip(values, tensor_kinds) if k == "tensor"] + values[len(tensor_kinds) :]
    out_node.args = (tuple(keep),)
    gm.graph.eliminate_dead_code(is_impure_node=core_ops.is_kept_for_effect)
    gm.recompile()
    return gm


class AotCompiled:
    """A callable compiling ``flat_fn`` per signature; ``flat_fn`` takes flat positional args."""

    def __init__(
        self,
        flat_fn: Callable,
        fw_compiler: Compiler,
        bw_compiler: Compiler | None,
        partition_fn: Callable | None,
        decompositions: dict | None,
        symbolic: Sequence[Any] | None = None,
        plan_store: PlanStore | None = None,
    ):
        self.flat_fn = flat_fn
        self.plan_store = plan_store
        # per flat input: a meta tensor with symbolic sizes (one plan serves every size
        # the caller's guards admit), or None
        self.symbolic = list(symbolic) if symbolic is not None else None
        self.fw_compiler = fw_compiler
        self.bw_compiler = bw_compiler or fw_compiler
        self.partition_fn = partition_fn or min_cut_partition
        self.decompositions = decompositions
        self.plans: dict[tuple, Any] = {}

    def plan_for(self, flat_args: Sequence[Any], extra: Any = None) -> Any:
        """The compiled plan for these arguments and the current grad mode (compiled once)."""
        need_grad = _needs_grad(flat_args)
        key = _signature(flat_args, need_grad, extra, self.symbolic)
        plan = self.plans.get(key)
        if plan is not None:
            return plan
        # compiled (or loaded) during a call: maybe inside a frame a capture engine
        # watches, whose hook must leave the compiler's own Python alone
        with compiler_running():
            return self._new_plan(flat_args, extra, need_grad, key)

    def _new_plan(self, flat_args: Sequence[Any], extra: Any, need_grad: bool, key: tuple) -> Any:
        plan = None
        store = self.plan_store if persistent_signature(key) else None
        if plan is None and store is not None:
            plan = store.load(key)
            if plan is not None:
                self._attach(plan, key, store)
                self.plans[key] = plan
        if plan is None:
            start = time.perf_counter()
            plan = (
                self._compile_training(flat_args)
                if need_grad
                else self._compile_inference(flat_args)
            )
            log(
                "timings",
                f"{'training' if need_grad else 'inference'} compile took {time.perf_counter() - start:.3f}s",
            )
            self.plans[key] = plan
            if store is not None:
                store.save(key, plan)
                self._attach(plan, key, store)
        return plan

    def _attach(self, plan: Any, key: tuple, store: PlanStore) -> None:
        """A training plan's backward variants compile with this compiler (a loaded plan
        has none) and are offered to ``store`` as they compile (backward_variants.py)."""
        variants = getattr(plan, "variants", None)
        if variants is None:
            return
        if variants.compiler is None:
            variants.compiler = self.bw_compiler
        variants.on_compiled = lambda: store.save(key, plan)

    def run(self, flat_args: Sequence[Any], extra: Any = None) -> Any:
        plan = self.plan_for(flat_args, extra)
        if plan.info.mutated_inputs and _inputs_share_storage(flat_args):
            reason = "inputs share storage and the graph writes to one of them; kiln's functional graph would miss the aliasing"
            log("breaks", f"running eagerly: {reason}")
            warnings.warn(f"kiln_aot: running eagerly: {reason}", stacklevel=3)
            return self.flat_fn(*flat_args)
        return plan(list(flat_args))

    def _compile_inference(self, flat_args: Sequence[Any]) -> InferencePlan:
        gm = trace(
            self.flat_fn,
            list(flat_args),
            decompositions=self.decompositions,
            symbolic=self.symbolic,
        )
        info: TraceInfo = gm.meta["kiln_aot"]
        gm = drop_alias_outputs(gm, info)
        if info.mutated_inputs:
            # the new values of written inputs are the last outputs: the compiler may
            # compute each in its input's storage (contract 3's recorded aliasing)
            n_out = len(next(n for n in gm.graph.nodes if n.op == "output").args[0])
            first = n_out - len(info.mutated_inputs)
            gm.meta["kiln_input_writes"] = tuple(
                (first + j, i) for j, i in enumerate(info.mutated_inputs)
            )
        log("graphs", f"aot inference graph:\n{gm.code}")
        DebugDump().graph("aot.inference", gm)
        compiled = self.fw_compiler(gm, list(flat_args))
        num_user = sum(o.kind == "tensor" for o in info.outputs)
        return InferencePlan(compiled, info, num_user)

    def _compile_training(self, flat_args: Sequence[Any]) -> TrainingPlan:
        requires_grad = [isinstance(a, torch.Tensor) and a.requires_grad for a in flat_args]
        joint, info = trace_joint(
            self.flat_fn,
            list(flat_args),
            requires_grad,
            decompositions=self.decompositions,
            symbolic=self.symbolic,
        )
        if not info.differentiable:
            # nothing the program returns or writes has a gradient (an optimizer step, a
            # body under no_grad): no backward, and written inputs may be computed in place
            plan = self._compile_inference(flat_args)
            plan.under_grad = True
            return plan
        log("graphs", f"aot joint graph:\n{joint.code}")
        fw_gm, bw_gm = self.partition_fn(
            joint, list(flat_args), num_fwd_outputs=info.num_fwd_outputs
        )
        log("graphs", f"aot forward graph:\n{fw_gm.code}\naot backward graph:\n{bw_gm.code}")
        dump = DebugDump()
        dump.graph("aot.joint", joint)
        dump.graph("aot.fw", fw_gm)
        dump.graph("aot.bw", bw_gm)
        dump.text("aot.partition.txt", partition_report(fw_gm, info.num_fwd_outputs))
        fw_gm.meta["kiln_aot_training"] = {"role": "forward", "outputs": info.num_fwd_outputs}
        bw_gm.meta["kiln_aot_training"] = {"role": "backward"}
        fw = self.fw_compiler(fw_gm, list(flat_args))
        # the backward compiles on its first call, for the tangent strides that arrive
        # (backward_variants.py), unless its compiler wants it now or tangents are symbolic
        variants = BackwardVariants.for_graph(bw_gm, self.bw_compiler, len(info.differentiable))
        if variants is None:
            bw_inputs = [n.meta.get("val") for n in bw_gm.graph.nodes if n.op == "placeholder"]
            bw = self.bw_compiler(bw_gm, bw_inputs)
        elif getattr(self.bw_compiler, "kiln_eager_backward", False):
            bw = variants.compile_traced()
        else:
            bw = None
        plan = TrainingPlan(
            fw=fw,
            bw=bw,
            info=info.trace,
            num_user=len(info.fw_user_outputs),
            num_fwd_outputs=info.num_fwd_outputs,
            differentiable=info.differentiable,
            grad_inputs=info.grad_inputs,
            num_inputs=len(flat_args),
            saved_ints=tuple(
                k
                for k, n in enumerate(p for p in bw_gm.graph.nodes if p.op == "placeholder")
                if n.name.startswith("saved_") and isinstance(n.meta.get("val"), torch.SymInt)
            ),
        )
        plan.variants = variants
        return plan


def guarded_call(
    compiled: AotCompiled,
    example_inputs: Sequence[Any],
    checked: Callable,
    module: torch.nn.Module | None = None,
) -> Callable | None:
    """The ``kiln_guarded_call`` of ``checked`` (module docstring, "Guarded calls"): the
    plan compiled for ``example_inputs``, run without the signature check; None when the
    example inputs are not all tensors."""
    examples = list(example_inputs)
    if not all(isinstance(a, torch.Tensor) for a in examples):
        return None
    training = module.training if module is not None else None
    plan = compiled.plans.get(
        _signature(examples, _needs_grad(examples), training, compiled.symbolic)
    )
    if plan is None:
        return None
    any_requires_grad = any(a.requires_grad for a in examples)
    need_grad = isinstance(plan, TrainingPlan) or plan.under_grad
    aliases = tuple(
        (o.input_index, examples[o.input_index].storage_offset())
        for o in plan.info.outputs
        if o.kind == "alias"
    )
    mutates = bool(plan.info.mutated_inputs)
    grad_enabled = torch.is_grad_enabled
    autocast = autocast_key()

    def call(*args: Any) -> Any:
        if (
            (grad_enabled() and any_requires_grad) is not need_grad
            or (module is not None and module.training is not training)
            or autocast_key() != autocast
        ):
            return checked(*args)
        for i, offset in aliases:
            if args[i].storage_offset() != offset:
                return checked(*args)
        if mutates and _inputs_share_storage(args):
            return checked(*args)
        return run(args)

    run = plan.guarded if isinstance(plan, InferencePlan) else plan
    return call


def _needs_grad(flat_args: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in flat_args
    )


def aot_function(
    fn: Callable,
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    partition_fn: Callable | None = None,
    decompositions: dict | None = None,
) -> Callable:
    """``fn`` compiled lazily per argument signature; trainable when inputs require grad.

    ``fn`` takes any pytree of arguments (tensors become graph inputs, other values are
    baked in) and returns a pytree."""
    holder: dict[str, Any] = {}

    def flat_fn(*flat):
        args, kwargs = pytree.tree_unflatten(list(flat), holder["spec"])
        return fn(*args, **kwargs)

    compiled = AotCompiled(flat_fn, fw_compiler, bw_compiler, partition_fn, decompositions)

    def run(*args: Any, **kwargs: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs))
        holder["spec"] = spec
        return compiled.run(flat, extra=spec)

    run.__wrapped__ = fn  # type: ignore[attr-defined]
    return run


class AotModule(torch.nn.Module):
    """``module`` whose forward runs compiled graphs; parameters and buffers are graph inputs."""

    def __init__(
        self,
        module: torch.nn.Module,
        fw_compiler: Compiler,
        bw_compiler: Compiler | None,
        partition_fn: Callable | None,
        decompositions: dict | None,
    ):
        super().__init__()
        self.orig_module = module
        self._names = state_names(module)
        self._spec: Any = None

        def flat_fn(*flat):
            n = len(self._names)
            args, kwargs = pytree.tree_unflatten(list(flat[n:]), self._spec)
            with swapped_state(module, self._names, flat[:n]):
                return module(*args, **kwargs)

        self._compiled = AotCompiled(
            flat_fn, fw_compiler, bw_compiler, partition_fn, decompositions
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        flat, self._spec = pytree.tree_flatten((args, kwargs))
        state = state_tensors(self.orig_module, self._names)
        return self._compiled.run([*state, *flat], extra=(self._spec, self.orig_module.training))


def aot_module(
    module: torch.nn.Module,
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    partition_fn: Callable | None = None,
    decompositions: dict | None = None,
) -> AotModule:
    return AotModule(module, fw_compiler, bw_compiler, partition_fn, decompositions)


def aot_graph(
    gm_or_fn: fx.GraphModule | Callable,
    example_inputs: Sequence[Any],
    *,
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    partition_fn: Callable | None = None,
    decompositions: dict | None = None,
    plan_store: PlanStore | None = None,
) -> Callable:
    """The backend entry point: compile a torch-level graph (or callable) called as
    ``gm(*args)``; returns a callable with the same calling convention and outputs.

    Parameters and buffers of ``gm`` (``get_attr`` targets or submodules' state) become
    graph inputs ahead of ``args``; the example inputs fix the first compilation (inference
    or training), other signatures compile on first use. ``plan_store`` keeps compiled
    plans across processes (module docstring, "Persistent plans")."""
    module = gm_or_fn if isinstance(gm_or_fn, torch.nn.Module) else None
    symbolic = symbolic_inputs(gm_or_fn)
    if module is None:
        compiled = AotCompiled(
            gm_or_fn, fw_compiler, bw_compiler, partition_fn, decompositions, symbolic, plan_store
        )

        def run_fn(*args: Any) -> Any:
            return compiled.run(list(args))

        compiled.plan_for(list(example_inputs))  # compile now: errors surface here
        run_fn.kiln_guarded_call = guarded_call(compiled, example_inputs, run_fn)  # type: ignore[attr-defined]
        return run_fn
    names = state_names(module)

    def flat_fn(*flat):
        n = len(names)
        with swapped_state(module, names, flat[:n]):
            return call_module(module, flat[n:])

    if symbolic is not None:
        symbolic = [None] * len(names) + symbolic
    compiled = AotCompiled(
        flat_fn, fw_compiler, bw_compiler, partition_fn, decompositions, symbolic, plan_store
    )

    def run_gm(*args: Any) -> Any:
        return compiled.run([*state_tensors(module, names), *args], extra=module.training)

    compiled.plan_for([*state_tensors(module, names), *example_inputs], extra=module.training)
    if not names:  # state read per call is not the caller's to guard
        run_gm.kiln_guarded_call = guarded_call(compiled, example_inputs, run_gm, module)  # type: ignore[attr-defined]
    return run_gm
