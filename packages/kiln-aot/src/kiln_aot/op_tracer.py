"""kiln's ATen tracer: runs a function on fake tensors under a ``__torch_dispatch__`` mode and
records every ATen op it reaches as an FX node, decomposing to the core set and
functionalizing as it goes.

# Tracer

``Tracer.dispatch`` is the one entry for every op (from the dispatch mode, or from a
fake's own ``__torch_dispatch__`` when the mode is not on this thread's stack, e.g. in the
autograd engine). In order:

1. data-dependent ops (``nonzero``, ``.item()``, ``unique``, ...: ``kiln_shapes.unbacked``)
   stay in the graph as library calls whose outputs are sized by unbacked symbols (each
   symbol read from the result by a node: ``sym_size.int``, or the ``.item()`` node
   itself); ``x[mask]`` reads are ``x[mask.nonzero().unbind(1)]``; a boolean-mask write
   ``x[mask] = v`` of one value is ``where``; other masked writes raise ``Unsupported``;
2. identity ops (``detach``, ``alias``, ``lift_fresh``) relabel a value, profiler markers
   pass through;
3. mutating ops are functionalized (``kiln_aot.functionalize``);
4. core and kept ops are recorded (``emit_call``), view ops remembering their base;
5. other ops run their decomposition with the mode re-entered, so the ops it calls come
   back through 1-5.

Before any of this, ``kiln_aot.redirects`` reroutes a few torch-level functions whose C++
implementation does what a functional graph cannot hold (``adaptive_avg_pool2d``'s in-place
restride), and attention when ``config.fused_attention`` is off. With it on (the default),
``scaled_dot_product_attention`` picks its fused kernel from the fakes' metadata and real
device, and step 4 keeps it (``core_ops.ATTENTION_OPS``).

Nothing is computed: node values are meta tensors wrapped as ``FakeTensor``s that report
the real device.
"""

from __future__ import annotations

import contextlib
import operator
import re
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import kiln_shapes
import sympy
import torch
from kiln_shapes import unbacked
from kiln_shapes.indexing import uniform_masked_write
from kiln_shapes.meta import CompositeMode
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

from kiln_aot import config, core_ops, functionalize, log, sym_nodes
from kiln_aot.argmap import iter_leaves, map_args
from kiln_aot.decompositions import attention
from kiln_aot.errors import Unsupported
from kiln_aot.fake import FakeTensor, fake_like, run_on_meta
from kiln_aot.redirects import redirect_mode
from kiln_aot.state import StorageState, TensorState, ViewStep, bind_args

_LIBRARY_LOGGED: set[Any] = set()  # library ops already logged (KILN_LOG=fallbacks)

# Metadata of a torch-level node that every ATen node traced from it carries (plain data):
# - ``recompute``: the activation-checkpointing region it is in (kiln-capture's tag);
# - ``recompute_in_backward``: recompute it in the backward rather than save it (its
#   inputs are saved instead; ``partition.min_cut``), e.g. a sharded parameter's gather;
#   ``False``: never recompute it, save it where the backward reads it;
# - ``collective_group``: a key shared by collectives that are fetched together (one
#   sharded unit's parameters): kiln-inductor's collectives pass bounds how many groups
#   are in flight at once.
CARRIED_META = ("recompute", "recompute_in_backward", "collective_group")

aten = torch.ops.aten

# Ops that only re-label a tensor: the result is the same value (and the same storage).
_IDENTITY_OPS = frozenset(
    {aten.detach.default, aten.alias.default, aten.lift_fresh.default, aten.detach_.default}
)


class _TraceMode(TorchDispatchMode):
    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.tracer.dispatch(func, args, kwargs or {})


_INTERNAL = (
    "/torch/",
    "/kiln_aot/",
    "/kiln_capture/",
    "/kiln_inductor/",
    "/kiln_shapes/",
    "/kiln_cpp/",
    "/kiln_triton/",
    "/kiln/",
)
_ACTIVE: list[Tracer] = []


def current_tracer() -> Tracer | None:
    """The innermost running tracer on this thread of control, if any."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def annotate(**meta: Any) -> Iterator[None]:
    """While tracing, every ATen node recorded inside the block gets ``meta`` (plain data,
    keys of ``CARRIED_META``), as a torch-level node's carried metadata does: for code
    that has no torch-level node of its own (an ``autograd.Function``'s backward). Outside
    a trace it does nothing."""
    tracer = current_tracer()
    if tracer is None:
        yield
        return
    saved = tracer.annotations
    tracer.annotations = {**saved, **meta}
    try:
        yield
    finally:
        tracer.annotations = saved


def user_source_line() -> str | None:
    """The innermost stack frame outside torch and kiln, as ``file:line   code``."""
    for frame in reversed(traceback.extract_stack()):
        f = frame.filename.replace("\\", "/")
        if any(part in f for part in _INTERNAL) or f.startswith("<"):
            continue
        return f"{frame.filename}:{frame.lineno}   {(frame.line or '').strip()}"
    return None


def format_stack_trace(stack_trace: str | None) -> str | None:
    """``file:line   code`` from the innermost frame of an FX node's ``meta["stack_trace"]``."""
    if not stack_trace:
        return None
    matches = list(re.finditer(r'File "([^"]+)", line (\d+), in [^\n]*\n?([^\n]*)', stack_trace))
    if not matches:
        return None
    match = matches[-1]
    return f"{match.group(1)}:{match.group(2)}   {match.group(3).strip()}"


class Tracer:
    """Builds one ATen-level FX graph. Use ``input``, then run code inside ``running()``."""

    def __init__(self, decompositions: dict[Any, Callable]):
        self.graph = fx.Graph()
        self.decompositions = decompositions
        self.constants: dict[str, torch.Tensor] = {}
        self._const_nodes: dict[int, fx.Node] = {}
        self.mode = _TraceMode(self)
        self.active = False
        # The torch-level node being traced, when the caller knows it (graph capture's
        # meta["stack_trace"], and its innermost frame as "file:line   code").
        self.stack_trace: str | None = None
        self.source: str | None = None
        # that node's CARRIED_META entries (an activation-checkpointing region, a
        # recompute or collective-group tag), copied onto the ATen nodes it becomes
        self.annotations: dict[str, Any] = {}
        self._mutations = 0
        self.sizes = sym_nodes.SymEmitter(self.graph)  # symbolic sizes as graph nodes
        self.shape_env: Any = None  # where unbacked symbols go when no input has an env
        self._speculating: dict[int, Any] = {}  # env id -> its speculating() context
        self.speculation: list[bool] = []  # sides the capture took in the node traced now
        self._pending_facts: list[Any] = []  # facts about sizes of a result not yet read

    # ---- inputs, constants, running -------------------------------------------------
    def input(
        self,
        name: str,
        example: torch.Tensor,
        index: int,
        requires_grad: bool = False,
        symbolic: torch.Tensor | None = None,
    ) -> FakeTensor:
        """A graph input like ``example``; with sizes and strides of ``symbolic`` (a meta
        tensor with kiln_shapes sizes) when given: the graph then serves every size."""
        if symbolic is not None:
            fake = fake_like(symbolic, requires_grad=requires_grad, device=example.device)
        else:
            fake = fake_like(example, requires_grad=requires_grad)
        node = self.graph.placeholder(name)
        node.meta["val"] = fake_like(fake)
        storage = StorageState(root=fake, input_index=index)
        fake.trace_state = TensorState(self, node, storage, (), 0)
        return fake

    def new_placeholder(self, name: str, val: FakeTensor) -> FakeTensor:
        """A placeholder added after tracing began (tangents); placed after the others."""
        last = [n for n in self.graph.nodes if n.op == "placeholder"][-1]
        with self.graph.inserting_after(last):
            node = self.graph.placeholder(name)
        node.meta["val"] = fake_like(val)
        fake = fake_like(val)
        fake.trace_state = TensorState(self, node, StorageState(root=fake), (), 0)
        return fake

    def constant(self, t: torch.Tensor) -> fx.Node:
        node = self._const_nodes.get(id(t))
        if node is None:
            name = f"_tensor_constant{len(self.constants)}"
            self.constants[name] = t
            with self.graph.inserting_before(self._first_non_placeholder()):
                node = self.graph.get_attr(name)
            node.meta["val"] = fake_like(t)
            self._const_nodes[id(t)] = node
        return node

    def _first_non_placeholder(self) -> fx.Node | None:
        for n in self.graph.nodes:
            if n.op != "placeholder":
                return n
        return None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.active = True
        _ACTIVE.append(self)
        try:
            # symbolic calls of C++ composites that read sizes as ints (torch 2.11's linear
            # on bfloat16) run as the ops they are made of
            with redirect_mode(), CompositeMode(metadata_only=False), self.mode:
                yield
        finally:
            _ACTIVE.pop()
            self.active = False
            for ctx in self._speculating.values():
                ctx.__exit__(None, None, None)
            self._speculating.clear()

    def unsupported(self, op: object, why: str, fix: str | None = None) -> Unsupported:
        return Unsupported(op, why, where=self.source or user_source_line(), fix=fix)

    # ---- reading values ---------------------------------------------------------------
    def node_of(self, x: Any) -> Any:
        """The graph node holding ``x``'s current value (regenerating stale aliases)."""
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.sym_value(x)
        if isinstance(x, FakeTensor) and x.trace_state is not None:
            st = x.trace_state
            if st.tracer is not self:
                raise self.unsupported(
                    "tensor", "a fake tensor from another trace reached this one"
                )
            if st.version != st.storage.version:
                cur = st.storage.root.trace_state.node
                for step in st.views:
                    cur = self.replay_view(step, cur)
                st.node, st.version = cur, st.storage.version
            return st.node
        if isinstance(x, torch.Tensor):
            if isinstance(x, FakeTensor):
                raise self.unsupported(
                    "tensor", "a fake tensor that is not part of this trace was used"
                )
            return self.constant(x)
        return x

    def sym_value(self, value: Any) -> Any:
        """A node computing a symbolic int from the inputs' sizes (``aten.sym_size.int``
        and Python arithmetic), or the number itself when it is constant. Symbolic floats
        and bools are specialized (their guard is recorded), unless the data gives them
        (an unbacked symbol's node computes them)."""
        expr = kiln_shapes.expr_of(value)
        env = kiln_shapes.env_of([value])
        if env is not None and env.unbacked_in(expr):
            node = self.sizes.emit(expr)
            if isinstance(node, fx.Node):
                node.meta["val"] = value
            return node
        if isinstance(value, torch.SymFloat):
            return float(value)
        if isinstance(value, torch.SymBool):
            return bool(value)
        return self.sizes.emit(expr)

    def graph_args(self, args: Any) -> Any:
        return map_args(self.node_of, args)

    # ---- recording ------------------------------------------------------------------------
    def emit_node(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Record ``func(*args, **kwargs)`` on nodes; returns a node, or a list of getitem
        nodes for multi-output ops. Output metadata comes from the meta kernels."""
        vals = map_args(_node_val, (args, kwargs))
        if func is aten.view.default and not _viewable(vals[0][0], vals[0][1]):
            args = (
                self.emit_node(
                    aten.clone.default, (args[0],), {"memory_format": torch.contiguous_format}
                ),
                *args[1:],
            )
            vals = map_args(_node_val, (args, kwargs))
        out = run_on_meta(func, *vals)
        node = self.graph.call_function(func, args, kwargs)
        if self.stack_trace:
            node.meta["stack_trace"] = self.stack_trace
        node.meta.update(self.annotations)
        if isinstance(out, torch.Tensor):
            node.meta["val"] = out
            return node
        if isinstance(out, (torch.SymInt, torch.SymFloat, torch.SymBool)):  # .item()
            node.meta["val"] = out
            return node
        if out is None:  # an op returning nothing (a check that raises eager's error)
            node.meta["val"] = None
            return node
        node.meta["val"] = tuple(out)
        items = []
        for i, o in enumerate(out):
            if not isinstance(o, torch.Tensor):
                # None: e.g. convolution_backward's gradients not asked for; ints: e.g.
                # flash attention's max sequence lengths, known from the shapes.
                items.append(o)
                continue
            g = self.graph.call_function(operator.getitem, (node, i))
            g.meta["val"] = o
            items.append(g)
        return items

    def wrap(self, node: fx.Node, base: Any = None, step: ViewStep | None = None) -> FakeTensor:
        """A fake for ``node``'s value: a view of ``base`` through ``step``, or a new storage."""
        val = node.meta["val"]
        fake = FakeTensor(val.meta, val.device)
        if step is not None and isinstance(base, FakeTensor) and base.trace_state is not None:
            bst = base.trace_state
            bst_version = bst.storage.version
            fake.trace_state = TensorState(self, node, bst.storage, (*bst.views, step), bst_version)
        else:
            fake.trace_state = TensorState(self, node, StorageState(root=fake), (), 0)
        return fake

    def emit_call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Record a core/kept op called on fakes and return fakes for its outputs."""
        out = self.emit_node(func, self.graph_args(args), self.graph_args(kwargs))
        if isinstance(out, fx.Node) and out.meta["val"] is None:
            return None
        if func is aten.bernoulli.p and out.meta["val"].dtype != torch.bool:
            # Draws are exactly 0 or 1: keep them as a bool mask converted back, so a
            # partitioner can save 1 byte per element (the mask) instead of the floats.
            mask = self.emit_node(aten.ne.Scalar, (out, 0), {})
            out = self.emit_node(aten._to_copy.default, (mask,), {"dtype": out.meta["val"].dtype})
        if isinstance(out, list):
            return tuple(self.wrap(n) if isinstance(n, fx.Node) else n for n in out)
        if func in core_ops.VIEW_OPS:
            bound = bind_args(func, args, kwargs)
            # replayed as op(prev, *args): only the positional arguments (expand's
            # kwarg-only ``implicit`` changes nothing a replay computes)
            positional = sum(1 for a in func._schema.arguments if not a.kwarg_only)
            return self.wrap(out, args[0], ViewStep(func, bound[1:positional]))
        return self.wrap(out)

    def emit_library_call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An op with no decomposition that returns new tensors stays in the graph as it is
        (``meta["kiln_library_op"]``): the compiler calls the library for it and fuses the
        ops around it (DESIGN.md contract 3). Logged once per op under KILN_LOG=fallbacks."""
        try:
            out = self.emit_call(func, args, kwargs)
        except Unsupported:
            raise
        except Exception as e:
            raise self.unsupported(
                func,
                f"it has no decomposition and its meta kernel cannot infer its outputs "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                fix="add a decomposition to kiln_aot.decompositions, or a meta kernel with torch.library.register_fake",
            ) from e
        for n in reversed(self.graph.nodes):  # the node emit_call made (maybe with getitems)
            if n.op == "call_function" and n.target is func:
                n.meta["kiln_library_op"] = True
                break
        if func not in _LIBRARY_LOGGED:
            _LIBRARY_LOGGED.add(func)
            log.log(
                "fallbacks",
                f"{func} has no decomposition: it stays in the graph as a library call "
                f"(at {self.source or user_source_line() or 'an unknown line'})",
            )
        return out

    # ---- dispatch ---------------------------------------------------------------------------
    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if func is aten.index_put.default and _has_bool_index(func, args):
            out = self._masked_assign(*args)
            if out is not None:
                return out
        if func in unbacked.RULES or (
            # an in-place write through a mask is functionalized first (then this again)
            func is not aten.index_put_.default and unbacked.is_mask_index(func, args)
        ):
            return self.data_dependent(func, args, kwargs)
        if func in core_ops.DATA_DEPENDENT_OPS or (
            func is not aten.index_put_.default and _has_bool_index(func, args)
        ):
            raise self.unsupported(
                func, "its output shape (or a Python value it returns) depends on tensor data"
            )
        if func.namespace == "profiler":  # record_function markers: no data, no graph node
            return func(*args, **kwargs)
        if func in _IDENTITY_OPS:
            return self._identity(args[0])
        if func in COPIED_VIEWS:
            out = self._copied_view(func, args, kwargs)
            if out is not None:
                return out
        if func is aten.lift_fresh_copy.default:
            return self.dispatch(aten.clone.default, (args[0],), {})
        if func._schema.is_mutable:
            return functionalize.functionalize_call(self, func, args, kwargs)
        if func is aten._fused_sdp_choice.default and config.current().fused_attention:
            return attention.dispatcher_sdp_choice(*args, **kwargs)
        if core_ops.is_allowed(func) and not _decomposed_by_config(func):
            return self.emit_call(func, args, kwargs)
        return self.decompose(func, args, kwargs)

    def data_dependent(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A data-dependent op (step 1): a library call whose outputs' sizes (or value) are
        new unbacked symbols, each bound to the node that reads it from the result."""
        env = self._unbacked_env(args, kwargs)
        with unbacked.unbacked_env(env):
            if unbacked.is_mask_index(func, args):
                # x[mask] is x[mask.nonzero().unbind(1)]; x[mask] = values (one per selected
                # element; the backward of x[mask]) an index_put by those columns
                with self.mode:
                    indices = unbacked.mask_indices(args[1])
                    if func is not aten.index.Tensor:
                        _check_put_values(args[0], args[1], indices, args[2])
                    return func(args[0], indices, *args[2:], **kwargs)
            if func in _SCALAR_RESULTS:  # .item(), bool(t), equal: a number, not a tensor
                node = self.emit_node(func, self.graph_args(args), self.graph_args(kwargs))
                node.meta["kiln_library_op"] = True
                expr = kiln_shapes.expr_of(node.meta["val"])
                self.sizes.cache[expr] = node
                if isinstance(expr, sympy.Eq):  # a truth value: Eq(s, 1), s is the bool too
                    self.sizes.cache[expr.lhs] = node
                return node.meta["val"]
            out = self.emit_library_call(func, args, kwargs)
        for o in out if isinstance(out, tuple) else (out,):
            if not isinstance(o, FakeTensor):
                continue
            for d, n in enumerate(o.shape):
                e = kiln_shapes.expr_of(n)
                if isinstance(e, sympy.Symbol) and env.is_unbacked(e) and e not in self.sizes.cache:
                    size = self.graph.call_function(aten.sym_size.int, (self.node_of(o), d))
                    size.meta["val"] = n
                    self.sizes.cache[e] = size
        pending, self._pending_facts = self._pending_facts, []
        for fact in pending:
            self._assert_fact(fact)
        return out

    def _unbacked_env(self, args: tuple, kwargs: dict) -> Any:
        """The env new unbacked symbols go in: the inputs' (symbolic sizes), else the
        trace's own."""
        env = kiln_shapes.env_of([*iter_leaves((args, kwargs))])
        if env is None:
            env = self.shape_env
        if env is None:
            env = self.shape_env = kiln_shapes.ShapeEnv()
        self.shape_env = self.shape_env or env
        self.sizes.env = self.sizes.env or env
        if env.speculate is None and id(env) not in self._speculating:
            # a branch inside an op on a value of the data takes its no-op side, asserted
            # at run time (ShapeEnv.speculating); undone when the trace ends
            ctx = env.speculating(self._assert_fact, self._choose)
            ctx.__enter__()
            self._speculating[id(env)] = ctx
        return env

    def _choose(self) -> bool:
        """The side of a data branch inside the op being traced: the capture's choice for
        its node (``meta["kiln_speculation"]``), in order, else False."""
        return self.speculation.pop(0) if self.speculation else False

    def _assert_fact(self, fact: Any) -> None:
        """``aten._assert_scalar(fact)``: what a speculation relied on, checked when the
        graph runs (a library call that raises where the data takes the other side)."""
        try:
            cond = self.sizes.emit(fact)
        except Unsupported:  # about a size of an op's result not yet read: after it
            self._pending_facts.append(fact)
            return
        where = self.source or user_source_line() or "an op of the graph"
        msg = (
            f"kiln: compiled assuming {kiln_shapes.python_expr(fact)} (a branch on tensor "
            f"data inside the op at {where}); this call's data takes the other side"
        )
        node = self.graph.call_function(aten._assert_scalar.default, (cond, msg))
        node.meta["val"] = None
        node.meta["kiln_library_op"] = True

    def replay_view(self, step: ViewStep, base: fx.Node) -> fx.Node:
        """The node of ``step`` applied to ``base`` (a copy form stays a library call)."""
        node = self.emit_node(step.op, (base, *step.args), {})
        if step.op in LIBRARY_VIEW_COPIES:
            node.meta["kiln_library_op"] = True
        return node

    def _copied_view(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``view_as_real``/``view_as_complex``: the library's copy form in the graph
        (kernels do not compute complex numbers, and a library call's result must not
        alias its input), a view for the functionalization. Of a graph input's storage, an
        output that is such a view is rebuilt at run time by replaying the real view ops
        on the caller's tensor (graph_trace.collect_outputs: ``OutputInfo.replay``)."""
        x = args[0]
        st = getattr(x, "trace_state", None)
        if not isinstance(x, FakeTensor) or st is None:
            return None
        copy = COPIED_VIEWS[func]
        out = self.emit_library_call(copy, args, kwargs)
        # a view of x for the functionalization: writes through it are carried back by
        # the inverse copy (functionalize._inverse_view), stale reads replay the copy
        return self.wrap(self.node_of(out), x, ViewStep(copy, ()))

    def _masked_assign(self, x: Any, indices: Any, values: Any, accumulate: bool = False) -> Any:
        """``x[mask] = value`` (one bool mask over leading dims, a value every selected
        element or row gets alike: ``kiln_shapes.indexing.uniform_masked_write``) has a
        data-independent shape: it is ``where(mask, value, x)``. None when not of that
        form (values per selected row)."""
        if accumulate or len(indices) != 1 or not isinstance(values, torch.Tensor):
            return None
        (mask,) = indices
        if mask.dtype != torch.bool:
            return None
        row = uniform_masked_write(x.shape, mask.shape, values.shape)
        if row is None:
            return None
        with self.mode:
            mask = aten.view.default(mask, [*mask.shape, *[1] * (x.dim() - mask.dim())])
            value = aten._to_copy.default(aten.view.default(values, list(row)), dtype=x.dtype)
            return aten.where.self(mask, value, x)

    def decompose(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if (
            core_ops.is_random(func)
            and core_ops.is_library_callable(func)
            and all(isinstance(r.type, torch.TensorType) for r in func._schema.returns)
        ):
            # a random op outside the core set (cauchy, exponential, geometric,
            # log_normal, ...): its decomposition draws other numbers than eager's kernel
            # (rand_like and arithmetic), so it stays whole and draws from ATen's
            # generator in program order, as eager does
            return self.emit_library_call(func, args, kwargs)
        decomp = self.decompositions.get(func)
        out: Any = NotImplemented
        with self.mode:
            if decomp is not None:
                out = decomp(*args, **kwargs)
            if out is NotImplemented:
                out = func.decompose(*args, **kwargs)
        if out is NotImplemented and core_ops.is_allowed(func):
            return self.emit_call(func, args, kwargs)  # a kept op no decomposition serves
        if out is NotImplemented and core_ops.is_library_callable(func):
            return self.emit_library_call(func, args, kwargs)
        if out is NotImplemented:
            raise self.unsupported(
                func,
                "it is outside kiln's core ATen set, has no decomposition, and its outputs "
                "alias its inputs",
                fix="add a decomposition to kiln_aot.decompositions (or list it in KEPT_OPS if kiln-inductor lowers it); the graph runs eagerly meanwhile",
            )
        if func not in core_ops.VIEW_OPS and not _is_view_schema(func):
            out = self._unalias_outputs(out, args)
        return out

    def alias_of(self, x: FakeTensor) -> FakeTensor:
        """A new tensor object with ``x``'s value and storage (no op recorded)."""
        return self._identity(x)

    def _identity(self, x: Any) -> Any:
        if not isinstance(x, FakeTensor) or x.trace_state is None:
            return self.wrap(self.node_of(x))
        st = x.trace_state
        node = self.node_of(x)
        fake = FakeTensor(node.meta["val"].meta, node.meta["val"].device)
        fake.trace_state = TensorState(self, node, st.storage, st.views, st.version)
        return fake

    def _unalias_outputs(self, out: Any, args: tuple) -> Any:
        """A decomposition of a non-view op may hand back one of its inputs: give the
        result its own storage so later writes to it do not reach the input."""
        inputs = {id(a) for a in iter_leaves(args) if isinstance(a, FakeTensor)}

        def fresh(o: Any) -> Any:
            if isinstance(o, FakeTensor) and id(o) in inputs:
                return self.wrap(self.node_of(o))
            return o

        return map_args(fresh, out)

    def next_mutation_order(self) -> int:
        self._mutations += 1
        return self._mutations


# data-dependent ops whose result is a Python number (Tracer.data_dependent)
_SCALAR_RESULTS = frozenset(
    {
        aten._local_scalar_dense.default,
        aten.is_nonzero.default,
        aten.equal.default,
        aten.allclose.default,
    }
)

# views between real and complex dtypes -> their copy forms (Tracer._copied_view)
COPIED_VIEWS = {
    aten.view_as_real.default: aten.view_as_real_copy.default,
    aten.view_as_complex.default: aten.view_as_complex_copy.default,
}
# a copy form -> the view it stands for (an alias output of a graph input replays it)
VIEW_OF_COPY = {copy: view for view, copy in COPIED_VIEWS.items()}
# a copy form -> the one that undoes it (writes carried back through it)
LIBRARY_VIEW_COPIES = {
    aten.view_as_real_copy.default: aten.view_as_complex_copy.default,
    aten.view_as_complex_copy.default: aten.view_as_real_copy.default,
}


def _check_put_values(x: Any, masks: Any, indices: list, values: Any) -> None:
    """``x[mask] = values``: the values must broadcast to the selected elements, whose count
    is a value of the data; eager's kernel checks it, a generated scatter would not, so
    each relation is a ``torch._check`` (asserted when the graph runs)."""
    covered = sum(
        m.dim() if m is not None and m.dtype in (torch.bool, torch.uint8) else 1 for m in masks
    )
    if len(masks) != 1 or not indices:
        return
    target = [indices[0].shape[0], *x.shape[covered:]]
    for v, t in zip(reversed(values.shape), reversed(target)):
        torch._check(
            v == 1 or v == t,
            lambda: "shape mismatch: values cannot be broadcast to the indexing result",
        )


def _decomposed_by_config(func: Any) -> bool:
    """Kept ops the settings ask to decompose (where a decomposition serves the call)."""
    if func is aten.native_dropout.default:  # one setting read, only where it decides
        return config.settings.decompose_dropout
    return func in core_ops.ATTENTION_OPS and not config.settings.fused_attention


def _node_val(a: Any) -> Any:
    return a.meta["val"] if isinstance(a, fx.Node) else a


def _is_view_schema(func: Any) -> bool:
    rets = func._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def _viewable(val: torch.Tensor, size: Any) -> bool:
    try:
        run_on_meta(aten.view.default, (val, size), {})
        return True
    except RuntimeError:
        return False


def _has_bool_index(func: Any, args: tuple) -> bool:
    if func not in (
        aten.index.Tensor,
        aten.index_put.default,
        aten.index_put_.default,
        aten._unsafe_index_put.default,
    ):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()
    )
