"""generate_wrapper: the host Python function of a compiled graph.

Before: ordered steps, a memory plan and one loaded kernel per group. After: Python source
of ``call(args) -> tuple`` that allocates buffers with their strides (or reuses dead
storage), launches kernels through the backend's call line, calls extern and fallback ATen
ops, frees intermediates after their last use, and returns the outputs (views of buffers
where an output is a view). The same wrapper serves every backend.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import sympy
import torch
from kiln_shapes import python_expr

from .backend import KernelBackend, KernelSource
from .config import read_config
from .errors import LoweringError
from .index_check import (
    DeviceIndexErrors,
    check_library_indices,
    library_op_checks_indices,
    raise_index_error,
)
from .ir.nodes import Buffer, ExternKernel, GraphIR, InputBuffer, Layout, StorageView
from .ir.symbols import is_size_symbol
from .log import log
from .lowering.extern import ATTENTION_OPS
from .lowering.registry import EXTERN_OPS
from .runtime.layout_copies import record_layout_copy
from .scheduler.fuse import FusedGroup, Step
from .scheduler.memory import MemoryPlan


@functools.cache
def _bindings() -> dict[Any, Any]:
    """The library ops the wrapper calls (the lowering registry's extern ops and the fused
    attention kernels) that torch exposes as a generated binding of their default
    overload, e.g. ``aten.convolution.default`` -> ``torch.convolution``."""
    out = {}
    for op in (*EXTERN_OPS, *ATTENTION_OPS):
        binding = getattr(torch, op._schema.name.split("::")[-1], None)
        # only a generated binding (torch.unique_consecutive is a Python function with
        # another signature and other returns than its ATen op)
        if op._overloadname == "default" and isinstance(binding, types.BuiltinFunctionType):
            out[op] = binding
    return out


def call_target(op: Any) -> Any:
    """What the wrapper calls for ``op``. For the library ops every graph calls, torch's
    generated binding of that overload (``torch.convolution``: arguments parsed straight
    to C++ types, 5 us a call on CPU); for other ATen overloads their dispatcher entry
    (``OpOverload._op``: no Python frame, but arguments converted through the boxed
    calling convention, 11 us for a convolution: int lists are slow to box). Both reach
    the dispatcher, so dispatch modes see the same op."""
    binding = _bindings().get(op)
    if binding is not None:
        return binding
    return op._op if isinstance(op, torch._ops.OpOverload) else op


def _size(v: Any) -> str:
    """Python source for a size: an int, or an expression over the bound size symbols."""
    if getattr(v, "is_Integer", False):
        return str(int(v))
    if isinstance(v, sympy.Basic):
        return python_expr(v)
    return str(v)


def _tuple(values: Any) -> str:
    items = [_size(v) for v in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


class WrapperCodegen:
    def __init__(
        self, ir: GraphIR, steps: list[Step], plan: MemoryPlan, backend: KernelBackend | None
    ):
        self.ir, self.steps, self.plan, self.backend = ir, steps, plan, backend
        self.globals: dict[str, Any] = {"torch": torch, "empty_strided": torch.empty_strided}
        # global name -> the op whose call_target it holds (the artifact cache stores the op)
        self.call_targets: dict[str, Any] = {}
        self.lines: list[str] = []
        # buffers something other than a generated kernel sees (extern and fallback ops, the
        # caller): these need tensors of their own size and strides
        self.seen_as_tensors = {o.buffer.name for o in ir.outputs if isinstance(o, StorageView)}
        for step in steps:
            if isinstance(step, ExternKernel):
                self.seen_as_tensors.update(step.input_buffers())

    def _global(self, prefix: str, value: Any) -> str:
        for k, v in self.globals.items():
            if v is value and k.startswith(prefix):
                return k
        name = f"{prefix}{len(self.globals)}"
        self.globals[name] = value
        return name

    def view_expr(self, view: StorageView) -> str:
        """The wrapper expression for a StorageView (the buffer itself or a strided view)."""
        buf: Buffer = view.buffer
        if view.layout == buf.layout:
            return buf.name
        lay = view.layout
        return f"{buf.name}.as_strided({_tuple(lay.size)}, {_tuple(lay.stride)}, {buf.name}.storage_offset() + {_size(lay.offset)})"

    def _alloc(self, name: str, reuse: str | None, kind: str) -> str:
        lay: Layout = self.ir.buffers[name].layout
        if reuse is not None and isinstance(self.ir.buffers.get(reuse), InputBuffer):
            # a graph input donated to its new value (plan_memory): of the same layout, and
            # maybe at a storage offset of the caller's, so the input itself, never a view
            # rebuilt from offset 0
            return f"{name} = {reuse}  # in place"
        if reuse is not None and name not in self.seen_as_tensors:
            # only kernels read it, by their own indexing from its first element: the reused
            # tensor itself will do (an as_strided view costs microseconds per call)
            line = f"{name} = {reuse}"
            return line + (f"; del {reuse}" if kind == "pool" else "  # in place")
        if reuse is not None:
            line = f"{name} = {reuse}.as_strided({_tuple(lay.size)}, {_tuple(lay.stride)}, 0)"
            return line + (f"; del {reuse}" if kind == "pool" else "  # in place")
        dtype = self._global("dtype_", lay.dtype)
        return f"{name} = empty_strided({_tuple(lay.size)}, {_tuple(lay.stride)}, dtype={dtype}, device='{lay.device}')"

    def _arg(self, a: Any) -> str:
        if isinstance(a, StorageView):
            return self.view_expr(a)
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self._arg(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return self._global("c_", a)
        if isinstance(a, float) and (a != a or a in (float("inf"), float("-inf"))):
            return f"float('{a}')"
        if isinstance(a, sympy.Basic):
            return _size(a)
        return repr(a)

    def _device_errors(self, rows: list[tuple[str, KernelSource]]) -> DeviceIndexErrors | None:
        """The error rows of the kernels that report failed index checks into a tensor."""
        if not rows:
            return None
        device = self.ir.buffers[rows[0][1].arg_names[0]].layout.device
        errors = DeviceIndexErrors(
            device, [(src.meta["index_checks"], self._written(src)) for _, src in rows]
        )
        self.globals["index_errors"] = errors
        # the wrapper reaches each kernel's row through ``index_errors`` (not a global of its
        # own), so a graph loaded from the artifact cache writes the rows its reader reads
        self.error_row = {name: k for k, (name, _) in enumerate(rows)}
        return errors

    def _written(self, src: KernelSource) -> tuple[str, ...]:
        """Graph inputs a kernel writes in place (named as the caller's argument positions)."""
        inputs = {b.name: k for k, b in enumerate(self.ir.inputs) if b is not None}
        return tuple(f"#{inputs[n]}" for n in src.arg_names if n in inputs and self._writes(n))

    def _writes(self, name: str) -> bool:
        return any(isinstance(step, FusedGroup) and name in step.outputs for step in self.steps)

    def _kernel_call(self, step: FusedGroup, kernel: str, src: KernelSource | None) -> list[str]:
        assert self.backend is not None
        args = [*step.inputs, *step.outputs]
        sizes = src.size_args if src is not None else ()
        self._need_symbols(sizes, step.name)
        checks = src.meta.get("index_checks") if src is not None else None
        if not checks:
            return [self.backend.call_line(kernel, args, sizes) + f"  # {step.name}"]
        if src.meta.get("index_report") == "tensor":
            # the kernel's error row is its last argument; index_errors.finish() reads them
            row = f"index_errors.rows[{self.error_row[step.name]}]"
            return [self.backend.call_line(kernel, [*args, row], sizes)]
        self.globals["raise_index_error"] = raise_index_error
        sites = self._global("checks_", tuple(checks))
        written = self._written(src)
        raise_call = f"raise_index_error({sites}, {{code}}, {{index}}, {written!r})"
        lines = self.backend.checked_call_lines(kernel, args, raise_call, sizes)
        return [lines[0] + f"  # {step.name}", *lines[1:]]

    def generate(
        self, kernels: dict[str, str], sources: dict[str, KernelSource] | None = None
    ) -> str:
        sources = sources or {}
        rows = [
            (name, src)
            for name, src in sources.items()
            if src.meta.get("index_checks") and src.meta.get("index_report") == "tensor"
        ]
        self.device_errors = self._device_errors(rows)
        with_rows = {name for name, _ in rows}
        symbols = self.ir.symbol_inputs  # int inputs that are size symbols bind them here
        ins = [
            b.name if b is not None else symbols[k].name if k in symbols else f"_unused{k}"
            for k, b in enumerate(self.ir.inputs)
        ]
        # checked=False: the caller guarantees the inputs' layouts (CompiledGraph.guarded)
        out = ["def call(args, checked=True):"]
        body: list[str] = []
        if ins:
            body.append(f"{', '.join(ins)}{',' if len(ins) == 1 else ''} = args")
            # a list is the caller's to give up (CompiledGraph.call_stealing): emptied, each
            # input is freed at its last use here, not when the call returns
            body.append("if args.__class__ is list: args.clear()")
        body.extend(self._bind_symbols())
        for c in self.ir.constants:
            body.append(f"{c.name} = {self._global('const_', c.value)}")
        # the error rows are copied to the host right after the last kernel that writes one
        # (an embedding is a graph's first kernel) and read just before the return: the host
        # waits for that copy only, with the rest of the graph already queued behind it
        last_checked = max((k for k, s in enumerate(self.steps) if s.name in with_rows), default=-1)
        for k, step in enumerate(self.steps):
            for name, reuse, kind in self.plan.allocations.get(k, []):
                body.append(self._alloc(name, reuse, kind))
            if isinstance(step, FusedGroup):
                body.extend(self._kernel_call(step, kernels[step.name], sources.get(step.name)))
            else:
                body.extend(self._extern(step))
            freed = self.plan.frees.get(k, [])
            if freed:
                body.append(f"del {', '.join(freed)}")
            if k == last_checked:
                body.append("index_errors.start()")
        if last_checked >= 0:
            body.append("index_errors.finish()")
        outs = []
        for o in self.ir.outputs:
            outs.append(self.view_expr(o) if isinstance(o, StorageView) else self._arg(o))
        body.append(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        out.extend("    " + line for line in body)
        return "\n".join(out) + "\n"

    def _bind_symbols(self) -> list[str]:
        """``s0 = arg0.size(1)`` for every size symbol not passed as an int input, read from
        the first input that has it as a dimension; then a restride of each input whose strides are symbolic and
        differ from the ones kernels index it with (``CompiledGraph`` checks static ones)."""
        lines: list[str] = []
        self.bound: set[str] = {s.name for s in self.ir.symbol_inputs.values()}
        for b in self.ir.inputs:
            if b is None:
                continue
            names = []
            for s in b.layout.size:
                if is_size_symbol(s) and s.name not in self.bound:
                    self.bound.add(s.name)
                    names.append(s.name)
                else:
                    names.append("_")
            if any(n != "_" for n in names):  # one unpack of the shape: cheaper than size(d)s
                lines.append(f"{', '.join(names)}{',' if len(names) == 1 else ''} = {b.name}.shape")
        for b in self.ir.inputs:
            if b is None:
                continue
            lay = b.layout
            if all(getattr(v, "is_Integer", False) for v in lay.stride):
                continue
            self.globals["restride"] = _restride
            want = _tuple(lay.stride)
            # strides of size-1 dimensions are never read (and eager leaves them arbitrary)
            kept = [d for d, n in enumerate(lay.size) if n != 1]
            if len(kept) == len(lay.size):
                have, need = f"{b.name}.stride()", want
            else:
                have = f"{b.name}.stride()"
                have = "(" + "".join(f"{have}[{d}], " for d in kept) + ")"
                need = _tuple([lay.stride[d] for d in kept])
            lines.append(
                f"if checked and {have} != {need}: "
                f"{b.name} = restride({b.name}, {want}, 'input {b.name}')"
            )
        return lines

    def _need_symbols(self, names: Any, where: str) -> None:
        missing = [n for n in names if n not in getattr(self, "bound", set())]
        if missing:
            raise LoweringError(
                where,
                f"the size symbols {', '.join(missing)} are not sizes of any graph input, so "
                "the wrapper cannot bind them",
                "report it; meanwhile mark the dimensions static (kiln.mark_static)",
            )

    def _extern(self, step: ExternKernel) -> list[str]:
        if step.op is torch.ops.aten._assert_scalar.default:
            # what kiln-aot assumed about a value of the data inside an op: checked here,
            # over the bound symbols; a failure makes the caller run the graph eagerly
            self.globals["assumption_failed"] = _assumption_failed
            cond, msg = (self._arg(a) for a in step.args[:2])
            return [f"if not ({cond}): assumption_failed({msg})"]
        target = call_target(step.op)
        op = self._global("aten_", target)
        self.call_targets[op] = step.op
        args = ", ".join(
            [self._arg(a) for a in step.args]
            + [f"{k}={self._arg(v)}" for k, v in step.kwargs.items()]
        )
        lines = [f"{step.name} = {op}({args})  # {step.kind} {step.op}"]
        device = next((a.layout.device for a in step.args if isinstance(a, StorageView)), None)
        if (
            device is not None
            and read_config().check_indices
            and library_op_checks_indices(step.op, device)
        ):
            # the library kernel would assert on the device: check its indices first
            self.globals["check_library_indices"] = check_library_indices
            raw = self._global("aten_", step.op)
            pos = ", ".join(self._arg(a) for a in step.args)
            kw = ", ".join(f"{k!r}: {self._arg(v)}" for k, v in step.kwargs.items())
            lines.insert(0, f"check_library_indices({raw}, ({pos},), {{{kw}}})")
        for o in step.outputs:
            path = "".join(f"[{i}]" for i in o.path)
            lines.append(f"{o.name} = {step.name}{path}")
        for symbol, source in step.binds:  # unbacked symbols the result gives
            lines.append(f"{symbol} = {source}")
            self.bound.add(symbol)
        for o in step.outputs:
            if step.kind == "fallback":
                # a library op's meta kernel may say another dtype than its kernel returns
                # (prims.signbit: float32 on meta, bool eagerly): kernels read the meta's
                self.globals["redtype"] = _redtype
                dtype = self._global("dtype_", o.layout.dtype)
                lines.append(f"{o.name} = redtype({o.name}, {dtype}, {str(step.op)!r})")
            if o.check_strides:
                self.globals["restride"] = _restride
                lay = o.layout
                op_name = step.op.name() if hasattr(step.op, "name") else str(step.op)
                site = f"{op_name} -> {o.name}"
                lines.append(f"{o.name} = restride({o.name}, {_tuple(lay.stride)}, {site!r})")
        lines.append(f"del {step.name}")
        return lines


def _assumption_failed(message: str) -> None:
    from kiln_shapes import AssumptionFailed

    raise AssumptionFailed(message)


_copied: set[str] = set()  # restride sites already logged


def _redtype(t: torch.Tensor, dtype: torch.dtype, op: str) -> torch.Tensor:
    """``t`` in the dtype kernels read it in (a cast where the library op's result and its
    meta kernel disagree, logged once per op)."""
    if t.dtype == dtype:
        return t
    if op not in _copied:
        _copied.add(op)
        log("fallbacks", f"{op} returned {t.dtype} where its meta kernel says {dtype}: cast")
    return t.to(dtype)


def _restride(t: torch.Tensor, stride: tuple[int, ...], site: str = "") -> torch.Tensor:
    """``t`` with the strides kernels index it by (a copy when the op chose others; the
    stride of a dimension of size 1 is never read). The first copy at each ``site`` (op and
    buffer) is logged under KILN_LOG=layouts: it is a copy on every call."""
    if all(n <= 1 or a == b for n, a, b in zip(t.shape, t.stride(), stride)):
        return t
    if site not in _copied:
        _copied.add(site)
        log(
            "layouts",
            f"{site}: the op returned strides {tuple(t.stride())} for shape {tuple(t.shape)}, "
            f"kernels index {stride}: copied on every call",
        )
    record_layout_copy(site, t, stride)
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)
