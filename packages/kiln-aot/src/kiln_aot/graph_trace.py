"""``trace``: a function and example inputs to an ATen-level, functional FX graph.

# Graph contract

The returned GraphModule's placeholders are the flattened example inputs, in order (a
non-tensor input gets a placeholder too; its value is baked into the graph). The graph
returns a tuple: first one tensor per tensor leaf of the function's (flattened) output, then
the final value of every graph input the function wrote to, in order of first write.
``gm.meta["kiln_aot"]`` is a ``TraceInfo`` saying which is which, which outputs alias
an input (and with which size/stride/offset, so a runtime can hand back a real view) and
the output's pytree spec. Tensor constants the function closed over are ``get_attr``
nodes on the module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from kiln_shapes import env_of, expr_of, is_symbolic, python_expr
from torch import fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from kiln_aot import core_ops
from kiln_aot.argmap import iter_leaves
from kiln_aot.decompositions import with_overrides
from kiln_aot.errors import Unsupported
from kiln_aot.fake import FakeTensor
from kiln_aot.module_state import state_names, state_tensors, swapped_state
from kiln_aot.op_tracer import VIEW_OF_COPY, Tracer


@dataclass(frozen=True)
class OutputInfo:
    """One leaf of the traced function's output.

    kind: ``"tensor"`` (a graph output), ``"alias"`` (a view of input ``input_index`` with
    ``size``/``stride``/``storage_offset``; also a graph output), or ``"constant"`` (a
    non-tensor ``value``). ``requires_grad``: whether autograd tracked it during a joint trace.
    """

    kind: str
    value: Any = None
    input_index: int | None = None
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    storage_offset: int = 0
    requires_grad: bool = False
    # for an alias with symbolic sizes: args -> (size, stride, storage_offset) of this call
    geometry: Any = None
    # for an alias whose views change the dtype (view_as_complex/view_as_real of an input,
    # which as_strided cannot rebuild): the view ops ``(op, args)`` replayed on the input
    replay: tuple[tuple[Any, tuple], ...] = ()


@dataclass(frozen=True)
class TraceInfo:
    num_inputs: int
    outputs: tuple[OutputInfo, ...]
    out_spec: pytree.TreeSpec
    mutated_inputs: tuple[int, ...]
    state_names: tuple[str, ...] = ()  # a traced module's parameters/buffers (leading inputs)

    @property
    def num_tensor_outputs(self) -> int:
        return sum(o.kind != "constant" for o in self.outputs)


def make_inputs(
    tracer: Tracer,
    flat_args: Sequence[Any],
    prefix: str,
    requires_grad: Sequence[bool] | None = None,
    symbolic: Sequence[Any] | None = None,
) -> list[Any]:
    """Placeholders and fakes for the flat inputs; ``symbolic[i]``, when a meta tensor with
    symbolic sizes, gives input i's sizes (see ``symbolic_inputs``)."""
    fakes = []
    for i, a in enumerate(flat_args):
        if isinstance(a, torch.Tensor):
            rg = bool(requires_grad[i]) if requires_grad is not None else False
            sym = symbolic[i] if symbolic is not None and i < len(symbolic) else None
            fakes.append(tracer.input(f"{prefix}_{i + 1}", a, i, rg, symbolic=sym))
        else:
            node = tracer.graph.placeholder(f"{prefix}_{i + 1}")
            sym = symbolic[i] if symbolic is not None and i < len(symbolic) else None
            # an int input that is a symbol of kiln's capture: traced as that symbol
            a = sym if isinstance(sym, torch.SymInt) else _concrete(a)
            node.meta["val"] = a
            fakes.append(a)
    return fakes


def _concrete(a: Any) -> Any:
    """A symbolic number of another shape engine (torch's capture hands SymInt inputs of a
    dynamic graph) as its value: kiln then compiles the graph for it (torch's capture keeps
    the guard that this asks for)."""
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)) and env_of([a]) is None:
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(a)](a)
    return a


def collect_outputs(
    tracer: Tracer, out: Any
) -> tuple[list[OutputInfo], list[fx.Node], pytree.TreeSpec]:
    """Describe the user outputs and return the graph nodes of the tensor ones."""
    leaves, spec = pytree.tree_flatten(out)
    infos, nodes = [], []
    for leaf in leaves:
        if _data_scalar(leaf):
            # a number only the data gives (.item(), allclose): a graph output, handed
            # back as the runtime's value (kind "tensor": taken from the graph's outputs)
            nodes.append(tracer.node_of(leaf))
            infos.append(OutputInfo("tensor"))
            continue
        if not isinstance(leaf, torch.Tensor):
            infos.append(OutputInfo("constant", value=leaf))
            continue
        node = tracer.node_of(leaf)
        nodes.append(node)
        st = leaf.trace_state if isinstance(leaf, FakeTensor) else None
        if st is not None and st.storage.input_index is not None and not _data_sized(leaf):
            replay = _dtype_view_replay(st.views)  # first: it refuses symbolic arguments
            geometry = _input_view_geometry(tracer, st.storage.input_index, st.views)
            infos.append(
                OutputInfo(
                    "alias",
                    input_index=st.storage.input_index,
                    size=geometry[0],
                    stride=geometry[1],
                    storage_offset=geometry[2],
                    requires_grad=leaf.requires_grad,
                    geometry=None if replay else _symbolic_geometry(tracer, geometry),
                    replay=replay,
                )
            )
        else:
            infos.append(OutputInfo("tensor", requires_grad=leaf.requires_grad))
    return infos, nodes, spec


def _data_sized(t: torch.Tensor) -> bool:
    """A view whose geometry depends on the data (``tensor_split`` at ``t.item()``): the
    graph returns it itself (a view of the caller's tensor, made by the compiled code)
    rather than the runtime rebuilding it from sizes it does not know."""
    values = [*t.shape, *t.stride(), t.storage_offset()]
    env = env_of(values)
    return env is not None and any(env.unbacked_in(expr_of(v)) for v in values)


def _data_scalar(leaf: Any) -> bool:
    """A SymInt/SymFloat/SymBool that depends on an unbacked symbol (kiln_shapes)."""
    if not isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False
    env = env_of([leaf])
    return env is not None and bool(env.unbacked_in(expr_of(leaf)))


def _input_view_geometry(
    tracer: Tracer, index: int, views: tuple
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    placeholders = [n for n in tracer.graph.nodes if n.op == "placeholder"]
    m = placeholders[index].meta["val"].meta
    if any(step.op in VIEW_OF_COPY for step in views):  # replayed (no symbolic arguments)
        with _disable_current_modes():  # the meta tensors' own views, not the tracer's
            for step in views:
                m = VIEW_OF_COPY.get(step.op, step.op)(m, *step.args)
    else:
        for step in views:
            m = step.op(m, *step.args)
    return tuple(m.shape), tuple(m.stride()), m.storage_offset()


def _dtype_view_replay(views: tuple) -> tuple[tuple[Any, tuple], ...]:
    """The view chain of an alias output to replay on the real input, when it changes the
    dtype (a copied view: view_as_complex/view_as_real); () when as_strided rebuilds it."""
    if not any(step.op in VIEW_OF_COPY for step in views):
        return ()
    steps = tuple((VIEW_OF_COPY.get(step.op, step.op), tuple(step.args)) for step in views)
    if any(isinstance(a, torch.SymInt) for _, args in steps for a in iter_leaves(args)):
        raise Unsupported(
            "view_as_complex/view_as_real of a graph input's view with symbolic arguments",
            "the output, a view of the caller's tensor, is rebuilt by replaying its views, "
            "and these take sizes of this trace",
            fix="mark the dimensions static (kiln.mark_static)",
        )
    return steps


def _symbolic_geometry(tracer: Tracer, geometry: tuple) -> Any:
    """For a view geometry with symbolic sizes: a function of the call's flat arguments
    computing it (each size symbol read from the input that has it as a dimension, or from
    the int input that is the symbol)."""
    values = [*geometry[0], *geometry[1], geometry[2]]
    if not any(isinstance(v, torch.SymInt) for v in values):
        return None
    exprs = [expr_of(v) for v in values]
    needed = set().union(*(e.free_symbols for e in exprs))
    placeholders = [n for n in tracer.graph.nodes if n.op == "placeholder"]
    lines, bound = [], set()
    for k, ph in enumerate(placeholders):
        val = ph.meta.get("val")
        if isinstance(val, torch.SymInt):  # an int input that is a symbol
            e = expr_of(val)
            if e in needed and e not in bound:
                bound.add(e)
                lines.append(f"    {e} = args[{k}]")
            continue
        if not isinstance(val, torch.Tensor):
            continue
        for d, size in enumerate(val.shape):
            e = expr_of(size) if isinstance(size, torch.SymInt) else None
            if e is not None and e in needed and e not in bound:
                bound.add(e)
                lines.append(f"    {e} = args[{k}].shape[{d}]")
    if bound != needed:
        return None
    n = len(geometry[0])
    # sizes are ints: an exact quotient (48/s1, a reshape's -1) prints as a true division
    out = [f"int({python_expr(e)})" if not e.is_Integer else python_expr(e) for e in exprs]

    def tup(items: list[str]) -> str:
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    body = "\n".join(lines)
    src = (
        f"def geometry(args):\n{body}\n"
        f"    return {tup(out[:n])}, {tup(out[n : 2 * n])}, {out[-1]}\n"
    )
    ns: dict = {"math": math}  # python_expr's floor and ceiling
    exec(compile(src, "<kiln_aot alias geometry>", "exec"), ns)
    return ns["geometry"]


def mutated_inputs(tracer: Tracer, fakes: Sequence[Any]) -> list[tuple[int, fx.Node]]:
    """(input index, final value node) of every written input, in order of first write."""
    seen = []
    for f in fakes:
        if isinstance(f, FakeTensor) and f.trace_state is not None:
            storage = f.trace_state.storage
            if storage.mutation_order is not None and storage.root is f:
                seen.append((storage.mutation_order, storage.input_index, tracer.node_of(f)))
    return [(i, n) for _, i, n in sorted(seen, key=lambda t: t[0])]


def build_module(tracer: Tracer, info: TraceInfo | None = None) -> fx.GraphModule:
    root = torch.nn.Module()
    for name, t in tracer.constants.items():
        setattr(root, name, t)
    tracer.graph.eliminate_dead_code(is_impure_node=core_ops.is_kept_for_effect)
    tracer.graph.lint()
    gm = fx.GraphModule(root, tracer.graph)
    if info is not None:
        gm.meta["kiln_aot"] = info
    return gm


def symbolic_inputs(gm: Any) -> list[Any] | None:
    """The symbolic sizes a torch-level graph's placeholders carry (capture's
    ``meta["val"]`` with kiln_shapes sizes, or a SymInt for an int input), one entry per
    placeholder (None where static); None when no input is symbolic."""
    if not isinstance(gm, fx.GraphModule):
        return None
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    # only kiln's own symbols: a graph from torch's capture carries torch's (FakeTensor and
    # torch's SymNode); kiln then traces it per signature, as for static graphs. An int
    # input whose value is a symbol (capture's symbolic ints) is traced as that symbol.
    vals = [
        v
        if (isinstance(v, torch.Tensor) and is_symbolic(v) or isinstance(v, torch.SymInt))
        and env_of([v]) is not None
        else None
        for v in vals
    ]
    return vals if any(v is not None for v in vals) else None


def trace(
    fn: Callable,
    example_inputs: Sequence[Any],
    *,
    decompositions: dict | None = None,
    symbolic: Sequence[Any] | None = None,
) -> fx.GraphModule:
    """Trace ``fn(*example_inputs)`` into an ATen-level functional graph, without computing.

    When ``fn`` is an ``nn.Module`` its parameters and buffers become graph inputs too: the
    placeholders are then the module's state (``TraceInfo.state_names``, parameters then
    buffers) followed by the flattened example inputs. See the module docstring for the
    graph's outputs and ``meta``.
    """
    flat, in_spec = pytree.tree_flatten(list(example_inputs))
    names: list[str] = []
    if isinstance(fn, torch.nn.Module):
        module = fn
        names = state_names(module)
        flat = [*state_tensors(module, names), *flat]

        def call(*args: Any) -> Any:
            n = len(names)
            with swapped_state(module, names, args[:n]):
                return module(*pytree.tree_unflatten(list(args[n:]), in_spec))
    else:

        def call(*args: Any) -> Any:
            return fn(*pytree.tree_unflatten(list(args), in_spec))

    tracer = Tracer(with_overrides(decompositions))
    if symbolic is not None and names:
        symbolic = [None] * len(names) + list(symbolic)
    fakes = make_inputs(tracer, flat, "arg", symbolic=symbolic)
    with torch.no_grad(), tracer.running():
        out = call(*fakes)
        infos, nodes, out_spec = collect_outputs(tracer, out)
        muts = mutated_inputs(tracer, fakes)
    tracer.graph.output(tuple(nodes) + tuple(n for _, n in muts))
    info = TraceInfo(len(flat), tuple(infos), out_spec, tuple(i for i, _ in muts), tuple(names))
    return build_module(tracer, info)
