"""GraphLowering: run an ATen FX graph over IR values, producing ``GraphIR``.

Before: an ATen-level FX graph with ``meta['val']`` on every node (missing metadata is
filled by running the graph on the meta device). After: ``GraphIR`` whose nodes are
``ComputedBuffer``s and ``ExternKernel``s in program order, and whose outputs are
realized ``StorageView``s (or constants).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sympy
import torch
import torch.fx
from kiln_shapes import env_of, expr_of

from . import log
from .config import read_config
from .errors import LoweringError, LoweringUnsupported, source_line
from .ir.nodes import (
    ComputedBuffer,
    ConstantBuffer,
    ExternKernel,
    ExternOutput,
    GraphIR,
    InputBuffer,
    Layout,
    Pointwise,
    Reduction,
    Scan,
    StorageView,
    TensorValue,
    View,
)
from .ir.ops import CountingHandler, ops_handler
from .ir.symbols import coefficients, index_vars, is_size_symbol, size_hint, sym
from .lowering.context import lowering_context
from .lowering.extern import DATA_DEPENDENT_EXTERNS
from .lowering.registry import EXTERN_OPS, FALLBACK_OPS, LOWERINGS
from .passes import is_channels_last, run_passes
from .passes.readers import has_extern_reader


def _layout_of(val: torch.Tensor, device: torch.device | None = None) -> Layout:
    return Layout(
        device or val.device,
        val.dtype,
        tuple(sym(s) for s in val.shape),
        tuple(sym(s) for s in val.stride()),
        sym(val.storage_offset()),
    )


def _dense_layout(val: torch.Tensor, device: torch.device) -> Layout:
    """meta's strides when they are a dense permutation (eager's output strides), else
    contiguous."""
    shape, stride = [sym(s) for s in val.shape], [sym(s) for s in val.stride()]
    hints = [size_hint(s) for s in stride]
    order = sorted(range(len(shape)), key=lambda d: (hints[d], -d))
    expected: Any = sympy.Integer(1)
    dense = True
    for d in order:
        if shape[d] == 1:
            continue
        if sympy.expand(stride[d] - expected) != 0:
            dense = False
            break
        expected = expected * shape[d]
    if dense and size_hint(sym(val.numel())) > 0:
        strides: list[Any] = [0] * len(shape)
        acc: Any = sympy.Integer(1)
        for d in order:
            strides[d] = acc
            acc = acc * (shape[d] if not shape[d].is_Integer else max(int(shape[d]), 1))
        return Layout(
            device, val.dtype, tuple(sym(s) for s in shape), tuple(sym(s) for s in strides)
        )
    return Layout.contiguous(device, val.dtype, [sym(s) for s in shape])


def _channels_last_layout(layout: Layout) -> bool:
    """A 4-D layout whose channels are innermost (N, H, W, C in memory)."""
    size, stride = layout.size, layout.stride
    return (
        len(size) == 4
        and all(getattr(v, "is_Integer", False) for v in (*size, *stride))
        and is_channels_last(
            torch.empty_strided([int(v) for v in size], [int(v) for v in stride], device="meta")
        )
    )


# library matmuls take either operand transposed for free (GraphLowering.realize_transposed)
_MATMULS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.baddbmm.default,
}


# the dtypes generated kernels compute in (complex, float8 and wide unsigned ints are
# left to the library op)
KERNEL_DTYPES = frozenset(
    {
        torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
        torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    }
)  # fmt: skip


def _kernel_unsupported_dtype(args: Any, kwargs: Any, val: Any) -> torch.dtype | None:
    found: list[torch.dtype] = []

    def visit(x: Any) -> None:
        if isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
        elif isinstance(x, (TensorValue, torch.Tensor)) and x.dtype not in KERNEL_DTYPES:
            found.append(x.dtype)

    visit((args, tuple(kwargs.values()), val))
    return found[0] if found else None


class GraphLowering:
    def __init__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        debug_dir: Path | None = None,
    ):
        self.gm = gm
        self.debug_dir = debug_dir  # where run_passes writes the graph after each pass
        self.example_inputs = list(example_inputs)
        self.ir = GraphIR()
        self.current_node: torch.fx.Node | None = None
        self.config = read_config()
        self._count = 0
        self.device = self._find_device()
        self.fallback_ops: list[str] = []
        # values already computed into a buffer: later consumers read it, not recompute it
        self._realized: dict[tuple[int, Layout | None], tuple[Any, StorageView]] = {}
        # layouts values are realized in when not contiguous (channels-last, layout.py)
        self._preferred: dict[int, tuple[Any, Layout]] = {}
        self.channels_last = False
        self._item_sources: dict[torch.fx.Node, Any] = {}  # .item() node -> its tensor
        self._bound: set[Any] = set()
        self.shape_env: Any = None

    def _find_device(self) -> torch.device:
        for x in self.example_inputs:
            if isinstance(x, torch.Tensor):
                return torch.device(x.device.type if x.device.type != "meta" else "cpu")
        for n in self.gm.graph.nodes:
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor) and val.device.type != "meta":
                return val.device
        return torch.device("cpu")

    # -- buffers ---------------------------------------------------------------------------
    def new_name(self, prefix: str = "buf") -> str:
        self._count += 1
        return f"{prefix}{self._count - 1}"

    def add_node(self, node: ComputedBuffer | ExternKernel) -> None:
        self.ir.nodes.append(node)
        if isinstance(node, ComputedBuffer):
            self.ir.buffers[node.name] = node
        else:
            for out in node.outputs:
                self.ir.buffers[out.name] = out

    def origin(self) -> str:
        n = self.current_node
        return str(n.target) if n is not None else ""

    def realize(self, value: Any, layout: Layout | None = None) -> StorageView:
        """A StorageView reading ``value`` from memory, computing it into a buffer if needed."""
        if isinstance(value, StorageView) and (layout is None or value.layout == layout):
            return value
        key = (id(value), layout)  # one buffer per value and layout asked for
        if key in self._realized:
            return self._realized[key][1]
        view = self._realize(value, layout)
        self._realized[key] = (value, view)
        return view

    def _realize(self, value: Any, layout: Layout | None) -> StorageView:
        if layout is None and isinstance(value, View):
            strided = self.as_strided_view(value)
            if strided is not None:
                return strided
        if layout is None and id(value) in self._preferred:
            layout = self._preferred[id(value)][1]
        if layout is None:
            layout = Layout.contiguous(value.device, value.dtype, value.size)
        body = Pointwise(value.device, value.dtype, tuple(value.size), value.make_loader())
        buf = ComputedBuffer(self.new_name(), layout, body, self.origin())
        self.add_node(buf)
        return StorageView(buf, layout)

    def realize_reduction(self, red: Reduction | Scan) -> StorageView:
        """A reduction's or a scan's result as a contiguous buffer."""
        layout = Layout.contiguous(red.device, red.dtype, red.size)
        buf = ComputedBuffer(self.new_name(), layout, red, self.origin())
        self.add_node(buf)
        return StorageView(buf, layout)

    def as_strided_view(self, value: TensorValue) -> StorageView | None:
        """If ``value`` is one affine load of a buffer, the StorageView that says so."""
        rec = _LoadRecorder()
        idx = index_vars("q", len(value.size))
        with ops_handler(rec):
            out = value.make_loader()(idx)
        if len(rec.loads) != 1 or out is not rec.loads[0]:
            return None
        name, expr = rec.loads[0].name, rec.loads[0].index
        co = coefficients(expr, idx)
        if co is None or co[1].free_symbols:
            return None
        strides = [c if s != 1 else sympy.Integer(c) for c, s in zip(co[0], value.size)]
        if any(c.free_symbols for c in strides) or any(c < 0 for c in strides) or co[1] < 0:
            return None
        buf = self.ir.buffers[name]
        layout = Layout(buf.device, buf.dtype, tuple(value.size), tuple(strides), co[1])
        return StorageView(buf, layout)

    def realize_transposed(self, value: Any) -> StorageView | None:
        """A matmul operand that is a computed value with its last two dimensions swapped
        (a weight gradient's ``x.T``): the value realized in its own shape, read through
        the swap. The library takes the transposed operand as is (a BLAS transpose flag),
        where realizing the view itself wrote the value transposed, a strided gather (GPT-2's
        backward: 8 ms a step for four (256, 1024) values, one thread)."""
        if not isinstance(value, View) or len(value.size) not in (2, 3):
            return None
        base = value.base
        if isinstance(base, StorageView) or tuple(base.size) != (
            *value.size[:-2],
            value.size[-1],
            value.size[-2],
        ):
            return None
        idx = index_vars("q", len(value.size))
        if list(value.reindex(idx)) != [*idx[:-2], idx[-1], idx[-2]]:
            return None
        stored = self.realize(base)
        lay = stored.layout
        swap = lambda t: (*t[:-2], t[-1], t[-2])
        return StorageView(
            stored.buffer,
            Layout(lay.device, lay.dtype, swap(lay.size), swap(lay.stride), lay.offset),
        )

    def maybe_realize_shared(self, value: Any, n_users: int) -> Any:
        """Compute a value read by several consumers once, when recomputing it costs."""
        if not isinstance(value, (Pointwise, View)) or isinstance(value, StorageView):
            return value
        cost = CountingHandler()
        with ops_handler(cost):
            value.make_loader()(index_vars("q", len(value.size)))
        if cost.ops >= self.config.max_inline_ops or (
            n_users > 1
            and (
                cost.ops >= self.config.realize_ops_threshold
                or cost.expensive >= self.config.realize_expensive
            )
        ):
            return self.realize(value)
        return value

    # -- extern and fallback ---------------------------------------------------------------
    def extern_call(self, op: Any, args: tuple, kwargs: dict, kind: str) -> Any:
        """Call ``op`` from the wrapper; tensor arguments are realized first."""

        def conv(a: Any) -> Any:
            if isinstance(a, TensorValue):
                if op in _MATMULS:
                    transposed = self.realize_transposed(a)
                    if transposed is not None:
                        return transposed
                return self.realize(a)
            if isinstance(a, (list, tuple)):
                return type(a)(conv(x) for x in a)
            return a

        args = tuple(conv(a) for a in args)
        kwargs = {k: conv(v) for k, v in kwargs.items()}
        name = self.new_name("extern" if kind == "extern" else "fallback")
        val = self.current_node.meta["val"] if self.current_node is not None else None
        outputs: list[ExternOutput] = []
        results: list[Any] = []

        # the wrapper checks the strides an op returns where they may differ from meta's: a
        # convolution with a channels-last operand or result (the library lays its output
        # out as its input, the meta kernel does not: layout.py, depthwise_layout.py), and a
        # fallback, whose output strides may follow those of its inputs (which lowering may
        # have realized in other strides than eager's)
        conv = op is torch.ops.aten.convolution.default and (
            self.channels_last
            or is_channels_last(val)
            or any(isinstance(a, StorageView) and _channels_last_layout(a.layout) for a in args)
        )

        def make(v: Any, path: tuple[int, ...]) -> Any:
            if isinstance(v, torch.Tensor):
                layout = _layout_of(v, self.device)
                # the wrapper hands kernels data_ptr(), which already holds the offset
                layout = Layout(layout.device, layout.dtype, layout.size, layout.stride)
                check = (conv and v.dim() == 4) or (
                    (kind == "fallback" or op in DATA_DEPENDENT_EXTERNS) and v.dim() > 1
                )
                buf = ExternOutput(self.new_name(), layout, name, path, check)
                outputs.append(buf)
                return StorageView(buf, layout)
            if isinstance(v, (list, tuple)):
                return tuple(make(x, (*path, i)) for i, x in enumerate(v))
            return v

        result = make(val, ())
        binds = self._unbacked_binds(name, val, outputs)
        self.add_node(ExternKernel(name, op, args, kwargs, kind, tuple(outputs), binds))
        del results
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return expr_of(val)  # .item(): the symbol the wrapper binds from the call
        return result

    def _unbacked_binds(
        self, name: str, val: Any, outputs: list[ExternOutput]
    ) -> tuple[tuple[str, str], ...]:
        """How the wrapper binds the unbacked symbols a library call's result gives
        (kiln_shapes' "unbacked symbols"): ``s3 = buf7.size(0)`` for a size first seen
        here, ``s4 = fallback2`` for the number ``.item()`` returns (``int(...)`` for a
        truth value, whose symbol is 0 or 1)."""
        env = self.shape_env
        if env is None:
            return ()
        binds: list[tuple[str, str]] = []
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            e = expr_of(val)
            if isinstance(val, torch.SymBool) and isinstance(e, sympy.Eq):
                e = e.lhs if isinstance(e.lhs, sympy.Symbol) else e.rhs
                binds.append((str(e), f"int({name})"))
            elif isinstance(e, sympy.Symbol):
                binds.append((str(e), name))
        for o in outputs:
            for d, n in enumerate(o.layout.size):
                if isinstance(n, sympy.Symbol) and env.is_unbacked(n) and n not in self._bound:
                    binds.append((str(n), f"{o.name}.size({d})"))
        for sym_name, _ in binds:
            self._bound.add(sympy.Symbol(sym_name))
        return tuple(binds)

    def fallback(self, node: torch.fx.Node, args: tuple, kwargs: dict, why: str) -> Any:
        op = node.target
        if not self.config.fallback_unlowered:
            raise LoweringError(op, why, "write a lowering, or set KILN_FALLBACK=1", node)
        where = source_line(node)
        log.warn_once(
            f"fallback:{op}",
            f"kiln: {op} runs eagerly (fallback kernel): {why}"
            + (f"\n  at {where}" if where else ""),
        )
        self.fallback_ops.append(str(op))
        return self.extern_call(op, args, kwargs, "fallback")

    # -- the graph -------------------------------------------------------------------------
    def run(self) -> GraphIR:
        # placeholders of a graph from another capture may carry their example only as
        # the inputs given (torch's Dynamo puts it in meta["example_value"])
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for n, x in zip(placeholders, self.example_inputs):
            if "val" not in n.meta and isinstance(x, torch.Tensor):
                n.meta["val"] = x
        # the graph passes (passes/__init__.py's registry), then lowering alone
        self.channels_last = bool(run_passes(self.gm, self.device, self.debug_dir)["layout"])
        env: dict[torch.fx.Node, Any] = {}
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        # the size symbols' ranges, for lowerings to simplify sizes (lowering.context.refine);
        # a graph of static inputs has one where a data-dependent op made unbacked symbols
        self.shape_env = env_of([n.meta.get("val") for n in placeholders]) or env_of(
            [v for n in self.gm.graph.nodes for v in _vals(n.meta.get("val"))]
        )
        self._bound: set[Any] = set()  # unbacked symbols some extern call binds
        with lowering_context(self):
            for i, n in enumerate(placeholders):
                val = n.meta.get("val")
                if isinstance(val, torch.Tensor):
                    layout = _layout_of(val, self.device)
                    layout = Layout(layout.device, layout.dtype, layout.size, layout.stride)
                    buf = InputBuffer(f"arg{i}", layout)
                    self.ir.inputs.append(buf)
                    self.ir.buffers[buf.name] = buf
                    env[n] = StorageView(buf, layout)
                elif isinstance(val, torch.SymInt) and is_size_symbol(sym(val)):
                    # an int input that is a size symbol: the wrapper binds it from the call
                    self.ir.inputs.append(None)  # type: ignore[arg-type]
                    self.ir.symbol_inputs[i] = sym(val)
                    env[n] = sym(val)
                else:
                    self.ir.inputs.append(None)  # type: ignore[arg-type]
                    env[n] = self.example_inputs[i] if i < len(self.example_inputs) else val
            for n in self.gm.graph.nodes:
                self.current_node = n
                if n.op == "get_attr":
                    t = getattr(self.gm, n.target)
                    layout = _layout_of(t, self.device)
                    layout = Layout(layout.device, layout.dtype, layout.size, layout.stride)
                    buf = ConstantBuffer(f"const{len(self.ir.constants)}", layout, t)
                    self.ir.constants.append(buf)
                    self.ir.buffers[buf.name] = buf
                    env[n] = StorageView(buf, layout)
                elif n.op == "call_function":
                    env[n] = self.lower_node(n, env)
                elif n.op == "output":
                    self.lower_outputs(n, env)
            self.current_node = None
        return self.ir

    def prefer_meta_layout(self, value: Any, val: Any) -> None:
        """Realize ``value`` with eager's channels-last strides (``val``) when it must be."""
        if isinstance(value, (tuple, list)) and isinstance(val, (tuple, list)):
            for v, m in zip(value, val):
                self.prefer_meta_layout(v, m)
            return
        if (
            isinstance(value, TensorValue)
            and not isinstance(value, (StorageView, View))
            and is_channels_last(val)
            and tuple(value.size) == tuple(sym(s) for s in val.shape)
            and value.dtype == val.dtype
        ):
            self._preferred[id(value)] = (value, _dense_layout(val, self.device))

    def _current(self, value: Any) -> Any:
        """The value as a consumer should read it now (its buffer, once realized)."""
        if isinstance(value, TensorValue) and (id(value), None) in self._realized:
            return self._realized[id(value), None][1]
        return value

    def lower_node(self, n: torch.fx.Node, env: dict) -> Any:
        if n.target is torch.ops.aten._local_scalar_dense.default:
            # .item(): a library call whose number the wrapper binds to its symbol; a
            # pointwise consumer reads the 0-d tensor instead (item_operand)
            self._item_sources[n] = env[n.args[0]]
            return self.extern_call(n.target, (self._current(env[n.args[0]]),), {}, "extern")
        if isinstance(n.meta.get("val"), torch.SymInt):
            # a size computed from the inputs' sizes (aten.sym_size.int, Python arithmetic):
            # its value is its expression over the size symbols, which the wrapper binds
            return sym(n.meta["val"])
        if not isinstance(n.target, torch._ops.OpOverload) and isinstance(
            n.meta.get("val"), (torch.SymFloat, torch.SymBool)
        ):
            # arithmetic on .item()'s numbers: the wrapper computes it over the symbols
            return expr_of(n.meta["val"])
        item_args = {a for a in n.all_input_nodes if a in self._item_sources and _as_scalar(n, a)}
        args = torch.fx.node.map_arg(
            n.args, lambda a: self._item_operand(a, n) if a in item_args else self._current(env[a])
        )
        kwargs = torch.fx.node.map_arg(
            n.kwargs,
            lambda a: self._item_operand(a, n) if a in item_args else self._current(env[a]),
        )
        if any(_float_unbacked(a, self.shape_env) for a in _leaves((args, kwargs))):
            # a number computed from .item()'s value: only the wrapper's Python has it
            return self.fallback(
                n, tuple(args), dict(kwargs), "an argument is computed from a tensor's value"
            )
        if n.target is operator.getitem:
            return args[0][args[1]]
        target = n.target
        if target in EXTERN_OPS:
            return self.extern_call(target, tuple(args), dict(kwargs), "extern")
        if target in FALLBACK_OPS:
            return self.fallback(n, tuple(args), dict(kwargs), FALLBACK_OPS[target])
        lowering = LOWERINGS.get(target)
        if lowering is None:
            return self.fallback(n, tuple(args), dict(kwargs), "kiln has no lowering for it")
        odd = _kernel_unsupported_dtype(args, kwargs, n.meta.get("val"))
        if odd is not None:
            return self.fallback(n, tuple(args), dict(kwargs), f"kernels do not compute {odd}")
        try:
            out = lowering(*args, **kwargs)
        except LoweringUnsupported as e:
            return self.fallback(n, tuple(args), dict(kwargs), str(e))
        except TypeError as e:
            if "convert symbols" not in str(e) and "expression to" not in str(e):
                raise
            # the lowering needs a concrete size and this one is symbolic: the op runs as a
            # library call inside the graph (sizes bound at call time), not the graph eagerly
            return self.fallback(
                n,
                tuple(args),
                dict(kwargs),
                "its lowering needs concrete sizes, these are symbolic",
            )
        # an explicit clone to channels-last (depthwise_layout.py) is realized so
        if self.channels_last or (
            target is torch.ops.aten.clone.default
            and n.kwargs.get("memory_format") is torch.channels_last
        ):
            self.prefer_meta_layout(out, n.meta.get("val"))
        if len(n.users) > 1 and has_extern_reader(n):
            # a library call (mm) will read it from memory anyway: the other consumers (a
            # bias gradient's sum) read that buffer instead of recomputing the value
            out = self.realize(out) if isinstance(out, (Pointwise, View)) else out
        return self.maybe_realize_shared(out, len(n.users))

    def _item_operand(self, item: torch.fx.Node, user: torch.fx.Node) -> Any:
        """``t.item()`` as an operand of a tensor op: the 0-d tensor ``t`` itself, read by
        the kernel (no host round trip, and the kernel needs no float argument), in the
        dtype that keeps the op's type promotion: the op's result dtype when it is
        floating (a float scalar does not raise a float tensor's precision), else ``t``'s."""
        from .lowering.registry import LOWERINGS as _L

        src = self._current(self._item_sources[item])
        val = user.meta.get("val")
        dtype = src.dtype
        if (
            isinstance(val, torch.Tensor)
            and val.dtype.is_floating_point
            and dtype.is_floating_point
        ):
            dtype = val.dtype
        if dtype != src.dtype:
            src = _L[torch.ops.aten._to_copy.default](src, dtype=dtype)
        return src

    def lower_outputs(self, n: torch.fx.Node, env: dict) -> None:
        outs = n.args[0]
        if not isinstance(outs, (list, tuple)):
            outs = (outs,)
        for o in outs:
            if not isinstance(o, torch.fx.Node):
                self.ir.outputs.append(o)
                continue
            self.add_output(self._current(env[o]), o.meta.get("val"))

    def add_output(self, value: Any, val: Any) -> None:
        if isinstance(value, (list, tuple)):
            vals = val if isinstance(val, (list, tuple)) else [None] * len(value)
            for v, m in zip(value, vals):
                self.add_output(v, m)
            return
        if not isinstance(value, TensorValue):
            self.ir.outputs.append(value)
            return
        if isinstance(value, StorageView):
            self.ir.outputs.append(value)
            return
        layout = _dense_layout(val, self.device) if isinstance(val, torch.Tensor) else None
        if layout is not None and (layout.dtype != value.dtype or layout.size != tuple(value.size)):
            layout = None
        strided = self.as_strided_view(value) if isinstance(value, View) else None
        self.ir.outputs.append(strided or self.realize(value, layout))


def _as_scalar(n: torch.fx.Node, item: torch.fx.Node) -> bool:
    """Whether ``n`` reads ``.item()``'s value as a Scalar or Tensor operand (``x * v``: the
    kernel reads the 0-d tensor), not as a size or index (``slice(x, 0, v)``: its symbol)."""
    schema = getattr(n.target, "_schema", None)
    if schema is None:
        return True
    for i, arg in enumerate(schema.arguments):
        value = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
        if value is item and "int" in str(arg.type).lower():
            return False
    return True


def _vals(val: Any) -> list[Any]:
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, (tuple, list)):
        return [x for t in tree for x in _leaves(t)]
    if isinstance(tree, dict):
        return [x for t in tree.values() for x in _leaves(t)]
    return [tree]


def _float_unbacked(a: Any, env: Any) -> bool:
    """A sympy number over a real (float) unbacked symbol: kernels take only int sizes."""
    if env is None or not isinstance(a, sympy.Basic) or not a.free_symbols:
        return False
    return any(env.is_unbacked(s) and env.symbols[s].pytype is float for s in a.free_symbols)


class _Load:
    def __init__(self, name: str, index: Any):
        self.name, self.index = name, index


class _LoadRecorder:
    def __init__(self) -> None:
        self.loads: list[_Load] = []

    def load(self, name: str, index: Any) -> _Load:
        ld = _Load(name, index)
        self.loads.append(ld)
        return ld

    def indirect_indexing(self, *a: Any, **k: Any) -> Any:
        return sympy.Symbol("indirect", integer=True)

    def masked(self, mask: Any, body: Any, other: Any) -> Any:
        body()
        return object()

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: object()
