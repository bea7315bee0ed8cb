"""Functions: user functions (inlined), bound methods, closures made inside the trace,
and torch functions (graph nodes, or constants when no tensor is involved)."""

from __future__ import annotations

import collections
import copy
import inspect
import itertools
import sys
import types

import torch

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.sources import AttrSource, CellSource, ClosureSource, ItemSource
from kiln_capture.variables.base import CellObjectVar, CellVar, Var
from kiln_capture.variables.constants import ConstVar, is_constant_value
from kiln_capture.variables.containers import DictVar, TupleVar
from kiln_capture.variables.generators import make_generator_cm
from kiln_capture.variables.rng import call_rng_function, rng_function
from kiln_capture.variables.sizes import SymIntVar
from kiln_capture.variables.tensors import DATA_DEPENDENT_FUNCTIONS, TensorVar


def bind_args(
    code: types.CodeType,
    name: str,
    args: list[Var],
    kwargs: dict[str, Var],
    defaults: list[Var],
    kwdefaults: dict[str, Var],
) -> dict[str, Var]:
    """Map a call's arguments onto ``code``'s parameters, as CPython does."""
    nargs, nkw = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    pos_names, kwonly = names[:nargs], names[nargs : nargs + nkw]
    idx = nargs + nkw
    varargs = names[idx] if code.co_flags & inspect.CO_VARARGS else None
    if varargs:
        idx += 1
    varkw = names[idx] if code.co_flags & inspect.CO_VARKEYWORDS else None
    bound: dict[str, Var] = dict(zip(pos_names, args))
    if len(args) > nargs:
        if varargs is None:
            raise Unsupported(
                breaks.EXCEPTION,
                f"{name}() takes {nargs} positional arguments but {len(args)} were given",
            )
        bound[varargs] = TupleVar(args[nargs:])
    elif varargs:
        bound[varargs] = TupleVar([])
    rest: dict[str, Var] = {}
    for k, v in kwargs.items():
        if k in pos_names[code.co_posonlyargcount :] or k in kwonly:
            if k in bound:
                raise Unsupported(
                    breaks.EXCEPTION, f"{name}() got multiple values for argument {k!r}"
                )
            bound[k] = v
        elif varkw:
            rest[k] = v
        else:
            raise Unsupported(
                breaks.EXCEPTION, f"{name}() got an unexpected keyword argument {k!r}"
            )
    first_default = nargs - len(defaults)
    for i, p in enumerate(pos_names):
        if p not in bound:
            if i < first_default:
                raise Unsupported(breaks.EXCEPTION, f"{name}() missing required argument {p!r}")
            bound[p] = defaults[i - first_default]
    for p in kwonly:
        if p not in bound:
            if p not in kwdefaults:
                raise Unsupported(breaks.EXCEPTION, f"{name}() missing keyword-only argument {p!r}")
            bound[p] = kwdefaults[p]
    if varkw:
        bound[varkw] = DictVar(rest)
    return bound


# Standard-library helpers that only inspect their (constant) arguments: called for real
# when every argument is a known Python object, instead of inlining their internals.
_PURE_STDLIB_MODULES = frozenset(
    {"inspect", "dataclasses", "typing", "enum", "abc", "re", "string", "textwrap"}
)
_NO_VALUE = object()


def python_value(v: Var) -> object:
    """The real Python object behind a Var that stands for a known object, else _NO_VALUE."""
    if v.is_const():
        return v.as_const()
    if isinstance(v, BoundMethodVar):
        fn, obj = python_value(v.fn), python_value(v.obj)
        if fn is _NO_VALUE or obj is _NO_VALUE:
            return _NO_VALUE
        return types.MethodType(fn, obj)
    for attr in ("value", "fn"):
        obj = getattr(v, attr, _NO_VALUE)
        if obj is not _NO_VALUE and not isinstance(obj, Var):
            return obj
    return _NO_VALUE


_FUNCTION_ATTRS = frozenset(
    {
        "__name__",
        "__qualname__",
        "__module__",
        "__doc__",
        "__code__",
        "__defaults__",
        "__kwdefaults__",
        "__wrapped__",
        "__globals__",
        "__annotations__",
    }
)


def _const_sequence(v: Var) -> Var:
    """A list or tuple of constants as one constant (namedtuple's field names)."""
    items = getattr(v, "items", None)
    if isinstance(items, list) and all(i.is_const() for i in items):
        return ConstVar(tuple(i.as_const() for i in items))
    return v


class UserFunctionVar(Var):
    """A Python function defined outside torch: calls are inlined."""

    def __init__(self, fn: types.FunctionType, source=None) -> None:
        self.fn = fn
        self.source = source

    def __repr__(self) -> str:
        return f"UserFunction({self.fn.__qualname__})"

    def python_type(self) -> type:
        return types.FunctionType

    def as_const(self) -> object:
        return self.fn

    def getattr(self, tx, name):
        fn = self.fn
        if name == "__get__":  # fn.__get__(obj, cls): the bound method
            return _FunctionGetVar(self)
        if name in _FUNCTION_ATTRS or name in getattr(fn, "__dict__", {}):
            try:
                value = getattr(fn, name)
            except AttributeError:
                raise
            if self.source is not None:
                return tx.out.wrap(value, AttrSource(self.source, name))
            return tx.out.wrap_value(value)
        raise AttributeError(name)

    def call(self, tx, args, kwargs) -> Var:
        fn = self.fn
        if fn is collections.namedtuple or (fn.__module__ or "").split(".")[0] in (
            _PURE_STDLIB_MODULES
        ):
            # namedtuple(name, fields) on constants makes its class now, for the trace
            # and the compiled code alike (eager makes a new class on each call)
            if fn is collections.namedtuple:
                args = [_const_sequence(a) for a in args]
                kwargs = {k: _const_sequence(v) for k, v in kwargs.items()}
            values = [python_value(a) for a in args]
            kw = {k: python_value(v) for k, v in kwargs.items()}
            if all(v is not _NO_VALUE for v in values) and all(
                v is not _NO_VALUE for v in kw.values()
            ):
                try:
                    return tx.out.wrap_value(fn(*values, **kw))
                except Exception as e:
                    raise Unsupported(
                        breaks.EXCEPTION, f"{fn.__qualname__} raised {type(e).__name__}: {e}"
                    ) from e
        if getattr(fn, "_kiln_disabled", False):
            raise Unsupported(breaks.DISABLED, f"{fn.__qualname__} is disabled")
        from kiln_capture.variables.optimizers import unwrap_optimizer_function

        inner = unwrap_optimizer_function(fn)
        if inner is not None:
            return UserFunctionVar(inner).call(tx, args, kwargs)
        if fn is copy.deepcopy or fn is copy.copy:
            from kiln_capture.variables.objects import copy_var, deepcopy_var

            if fn is copy.copy:
                return copy_var(tx, *args)
            return deepcopy_var(tx, *args, **kwargs)
        manager = make_generator_cm(tx, fn, args, kwargs, self.source)
        if manager is not None:
            return manager
        defaults = [
            self._default(tx, d, "__defaults__", i) for i, d in enumerate(fn.__defaults__ or ())
        ]
        kwdefaults = {
            k: self._default(tx, v, "__kwdefaults__", k)
            for k, v in (fn.__kwdefaults__ or {}).items()
        }
        bound = bind_args(fn.__code__, fn.__qualname__, args, kwargs, defaults, kwdefaults)
        cells = {
            name: tx.out.real_cell(fn.__closure__[i], lambda i=i: self._cell(tx, fn, i))
            for i, name in enumerate(fn.__code__.co_freevars)
        }
        return tx.inline(fn.__code__, fn.__globals__, bound, cells, fn.__qualname__)

    def _default(self, tx, value: object, table: str, key) -> Var:
        """A default argument: a tensor is read from the function on each call (a graph
        input: ``fn.__defaults__`` may be replaced, its tensor changed in place), other
        values are taken as they are."""
        if isinstance(value, torch.Tensor) and self.source is not None:
            return tx.out.wrap(value, ItemSource(AttrSource(self.source, table), key))
        return tx.out.wrap_value(value)

    def _cell(self, tx, fn, i: int) -> CellVar:
        """The CellVar of the function's ``i``-th real cell: its contents wrapped from their
        source; a write to it (``nonlocal``) is replayed where the cell has a source, and
        breaks where it has none."""
        cell = fn.__closure__[i]
        try:
            contents = cell.cell_contents
        except ValueError:
            made = CellVar(None)
        else:
            src = ClosureSource(self.source, i) if self.source is not None else None
            made = CellVar(tx.out.wrap(contents, src) if src else tx.out.wrap_value(contents))
        made.external = True
        made.cell_object = CellObjectVar(CellSource(self.source, i)) if self.source else None
        return made


class _FunctionGetVar(Var):
    """``fn.__get__``: binding a function to an object."""

    def __init__(self, fn: Var) -> None:
        self.fn = fn

    def call(self, tx, args, kwargs) -> Var:
        if len(args) not in (1, 2) or kwargs:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "function.__get__ with these arguments")
        if args[0].is_const() and args[0].as_const() is None:
            return self.fn
        return BoundMethodVar(self.fn, args[0])


class NestedFunctionVar(Var):
    """A function created by MAKE_FUNCTION inside the trace."""

    def __init__(
        self, code, globals_dict, defaults, kwdefaults, closure: list[CellVar], qualname: str
    ) -> None:
        self.code = code
        self.globals = globals_dict
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure
        self.qualname = qualname
        self.annotations: Var | None = None  # what MAKE_FUNCTION was given, if anything
        # attributes written in the trace (functools.update_wrapper): the special ones and
        # the function's __dict__
        self.special: dict[str, Var] = {}
        self.dict = DictVar({})

    def __repr__(self) -> str:
        return f"NestedFunction({self.qualname})"

    def plain_function(self) -> types.FunctionType | None:
        """The same function as a Python object made now, where that is the function the
        code makes: no closure cells, constant defaults, no attributes written in the trace
        (the body runs later and reads the module's globals then, as the code's own would)."""
        if self.closure or self.kwdefaults or self.special or self.dict.items:
            return None
        if not all(d.is_const() for d in self.defaults) or not isinstance(self.globals, dict):
            return None
        fn = types.FunctionType(
            self.code, self.globals, self.code.co_name, tuple(d.as_const() for d in self.defaults)
        )
        fn.__qualname__ = self.qualname
        return fn

    def python_type(self) -> type:
        return types.FunctionType

    def getattr(self, tx, name):
        if name in self.special:
            return self.special[name]
        if name == "__dict__":
            return self.dict
        if name in _NESTED_ATTRS:
            value = self._default_attr(tx, name)
            if isinstance(value, DictVar):  # mutable: the same dict on every read
                self.special[name] = value
            return value
        if name in self.dict.items:
            return self.dict.items[name]
        if name in ("__code__", "__globals__", "__defaults__", "__kwdefaults__", "__closure__"):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r}.{name}")
        return super().getattr(tx, name)

    def _default_attr(self, tx, name: str) -> Var:
        code = self.code
        if name == "__name__":
            return ConstVar(code.co_name)
        if name == "__qualname__":
            return ConstVar(self.qualname)
        if name == "__module__":
            return ConstVar(self.globals.get("__name__"))
        if name == "__doc__":
            doc = code.co_consts[0] if code.co_consts and code.co_name != "<lambda>" else None
            return ConstVar(doc if isinstance(doc, str) else None)
        if name == "__type_params__":
            return ConstVar(())
        # __annotations__: 3.11/3.12 hand MAKE_FUNCTION a flat tuple (name, value, ...)
        if self.annotations is None:
            return DictVar({})
        flat = self.annotations.unpack(tx)
        return DictVar({flat[i].as_const(): flat[i + 1] for i in range(0, len(flat), 2)})

    def setattr(self, tx, name: str, value: Var) -> None:
        if name in _NESTED_ATTRS:
            self.special[name] = value
        elif name == "__dict__" or name.startswith("__") and name not in ("__wrapped__",):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"setting {name} of {self!r}")
        else:
            self.dict.items[name] = value

    def call(self, tx, args, kwargs) -> Var:
        bound = bind_args(self.code, self.qualname, args, kwargs, self.defaults, self.kwdefaults)
        cells = dict(zip(self.code.co_freevars, self.closure))
        return tx.inline(self.code, self.globals, bound, cells, self.qualname)

    def reconstruct(self, cg) -> str:
        if (
            any(c.contents is None and id(c) not in cg.frame_cells for c in self.closure)
            or self.kwdefaults
        ):
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE,
                f"a closure ({self.qualname}) escaping the captured region",
            )
        defaults = (
            "(" + "".join(cg.rebuild(d) + ", " for d in self.defaults) + ")"
            if self.defaults
            else "None"
        )
        cells = (
            "("
            + "".join(
                cg.frame_cells[id(c)] + ", "
                if id(c) in cg.frame_cells
                else f"__k_cell({cg.rebuild(c.contents)}), "
                for c in self.closure
            )
            + ")"
            if self.closure
            else "None"
        )
        made = f"__k_FunctionType({cg.const(self.code)}, {cg.const(self.globals)}, {self.code.co_name!r}, {defaults}, {cells})"
        if not self.special and not self.dict.items:
            return made
        attrs = {**self.special, **self.dict.items}
        if "__annotations__" in attrs or "__type_params__" in attrs:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r} with annotations escaping")
        items = ", ".join(f"{k!r}: {cg.rebuild(v)}" for k, v in attrs.items())
        return f"{cg.const(with_attributes)}({made}, {{{items}}})"

    def children(self) -> list[Var]:
        return (
            list(self.defaults)
            + [c.contents for c in self.closure if c.contents is not None]
            + list(self.special.values())
            + list(self.dict.items.values())
        )


# a function's attributes update_wrapper copies or any code may read
_NESTED_ATTRS = frozenset(
    {"__name__", "__qualname__", "__module__", "__doc__", "__annotations__", "__type_params__"}
)


def with_attributes(fn: types.FunctionType, attrs: dict) -> types.FunctionType:
    """A function rebuilt by generated code, with the attributes the trace gave it."""
    for k, v in attrs.items():
        setattr(fn, k, v)
    return fn


class BoundMethodVar(Var):
    def __init__(self, fn: Var, obj: Var, source=None) -> None:
        self.fn = fn
        self.obj = obj
        self.source = source

    def __repr__(self) -> str:
        return f"BoundMethod({self.fn!r}, {self.obj!r})"

    def python_type(self) -> type:
        return types.MethodType

    def call(self, tx, args, kwargs) -> Var:
        return self.fn.call(tx, [self.obj, *args], kwargs)

    def getattr(self, tx, name):
        if name == "__self__":
            return self.obj
        if name == "__func__":
            return self.fn
        return self.fn.getattr(tx, name)

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        return f"__k_MethodType({cg.rebuild(self.fn)}, {cg.rebuild(self.obj)})"


def _checkpoint_function() -> object:
    checkpoint = sys.modules.get("torch.utils.checkpoint")
    return getattr(checkpoint, "checkpoint", None)


# activation checkpointing regions traced so far (their number tags their nodes)
_REGIONS = itertools.count(1)


def checkpointed_call(tx, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=..., ...)``: ``fn`` is
    traced into the graph as if called directly (the values are the same), and every node
    it adds is tagged ``meta["recompute"]`` with the region's number, which kiln-aot's
    partitioner reads: values made inside a region are recomputed in the backward rather
    than saved, as checkpointing asks (its memory saving). A ``context_fn`` other than the
    default (selective checkpointing policies) is not modeled: the call breaks the graph."""
    if not args:
        raise Unsupported(breaks.EXCEPTION, "checkpoint() needs a function to call")
    options = dict(kwargs)
    context_fn = options.pop("context_fn", None)
    if context_fn is not None and not (
        context_fn.is_const() and context_fn.as_const() is _noop_context_fn()
    ):
        raise Unsupported(breaks.UNKNOWN_CALLABLE, "checkpoint() with a context_fn")
    for name in ("use_reentrant", "determinism_check", "debug", "preserve_rng_state"):
        options.pop(name, None)
    graph = tx.out.graph
    before = set(graph.nodes)
    result = args[0].call(tx, list(args[1:]), options)
    region = next(_REGIONS)
    for node in graph.nodes:
        if node not in before and node.op in ("call_function", "call_method"):
            node.meta["recompute"] = region
    return result


def _noop_context_fn() -> object:
    checkpoint = sys.modules.get("torch.utils.checkpoint")
    return getattr(checkpoint, "noop_context_fn", None)


def _process_group_const(tx, v: Var) -> Var:
    from kiln_capture.variables.objects import guarded_process_group

    group = guarded_process_group(tx, v)
    return v if group is None else ConstVar(group)


_FUNCTION_TRANSFORMS = frozenset({torch.vmap, torch.func.vmap})


def _value_of(v: Var) -> object:
    """The Python value of an argument a torch function reads and does not keep: constants,
    and lists of them (``torch.tensor([], dtype=...)``, as HF's cache layers call it: a
    list is mutable, so not a constant, but the call copies what it holds now)."""
    from kiln_capture.variables.containers import ListVar

    if isinstance(v, ListVar):
        return [_value_of(i) for i in v.items]
    return v.as_const()


def contains_tensor(v: Var) -> bool:
    if isinstance(v, TensorVar):
        return True
    return any(contains_tensor(c) for c in v.children())


def _needs_grad(v: Var) -> bool:
    if isinstance(v, TensorVar):
        return bool(v.meta.requires_grad)
    return any(_needs_grad(c) for c in v.children())


_FUNCTION_APPLY = torch.autograd.Function.apply.__func__


class _InlinedCtxVar(Var):
    """The ``ctx`` of an autograd.Function whose forward is traced inline (no gradient
    to compute): attributes are kept, ``save_for_backward`` and the ``mark_*`` calls do
    nothing, ``needs_input_grad`` is all False."""

    _NOOPS = frozenset(
        {
            "save_for_backward",
            "save_for_forward",
            "mark_dirty",
            "mark_non_differentiable",
            "set_materialize_grads",
        }
    )

    def __init__(self, n_inputs: int) -> None:
        self.attrs: dict[str, Var] = {}
        self.n_inputs = n_inputs

    def __repr__(self) -> str:
        return "FunctionCtx(inlined)"

    def python_type(self) -> type:
        return torch.autograd.function.FunctionCtx

    def getattr(self, tx, name: str) -> Var:
        if name in self.attrs:
            return self.attrs[name]
        if name in self._NOOPS:
            from kiln_capture.variables.objects import _NoopVar

            return _NoopVar()
        if name == "needs_input_grad":
            return TupleVar([ConstVar(False)] * self.n_inputs)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"ctx.{name} of an inlined forward")

    def setattr(self, tx, name: str, value: Var) -> None:
        self.attrs[name] = value


def inline_function_apply(tx, args: list[Var], kwargs: dict[str, Var]) -> Var | None:
    """``MyFunction.apply(...)`` where no input needs a gradient (under ``no_grad``, or
    inputs that do not require grad): eager runs ``forward`` under no_grad and its outputs
    need no grad, so its forward is traced inline, like any function (module and
    function arguments included). None where a gradient is needed (a graph call of the
    bound apply then, ``OutputGraph.tensor_op``)."""
    cls = getattr(args[0], "value", None) if args else None
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        return None
    inputs = list(args[1:])
    if tx.out.grad_enabled and (
        any(_needs_grad(a) for a in inputs) or any(_needs_grad(v) for v in kwargs.values())
    ):
        return None
    forward = inspect.getattr_static(cls, "forward", None)
    forward = getattr(forward, "__func__", forward)
    if not isinstance(forward, types.FunctionType):
        return None
    own_setup = inspect.getattr_static(cls, "setup_context", None)
    base_setup = inspect.getattr_static(torch.autograd.Function, "setup_context", None)
    fwd_args = inputs if own_setup is not base_setup else [_InlinedCtxVar(len(inputs)), *inputs]
    prev = tx.out.set_grad(False)
    try:
        return tx.out.wrap_value(forward).call(tx, fwd_args, kwargs)
    finally:
        tx.out.set_grad(prev)


def contains_symbolic(v: Var) -> bool:
    if isinstance(v, SymIntVar):
        return True
    return any(contains_symbolic(c) for c in v.children())


_COMPILING_QUERIES = tuple(
    f
    for f in (
        getattr(torch.compiler, "is_compiling", None),
        getattr(torch.compiler, "is_dynamo_compiling", None),
    )
    if f
)


def _autocast_query(tx, fn, args: list[Var]) -> Var | None:
    """``torch.is_autocast_enabled(dev)`` / ``get_autocast_dtype(dev)`` answered from the
    trace's autocast state (the real state is the caller's, not the traced block's)."""
    if fn is torch.is_autocast_enabled or fn is torch.get_autocast_dtype:
        if args and not args[0].is_const():
            return None
        device = args[0].as_const() if args else "cuda"
        state = dict(tx.out.autocast)
        if fn is torch.is_autocast_enabled:
            return ConstVar(device in state)
        return ConstVar(state.get(device, torch.get_autocast_dtype(device)))
    if fn is getattr(torch, "is_autocast_cpu_enabled", None):
        return ConstVar("cpu" in dict(tx.out.autocast))
    return None


_CUDA_QUERIES = {
    "is_available",
    "device_count",
    "current_device",
    "get_device_capability",
    "get_device_name",
}


def _record_index_value(made: Var, fn, consts: list, probe) -> None:
    """``torch.tensor(3)``/``torch.as_tensor([3])``: a one-element int64 tensor of a
    Python int whose value the trace knows, recorded as ``index_value`` for indexing a
    list with it (containers.known_index; eager reads it through ``__index__``)."""
    if fn not in (torch.tensor, torch.as_tensor) or not consts or not isinstance(made, TensorVar):
        return
    if not isinstance(probe, torch.Tensor) or probe.dtype != torch.int64 or probe.numel() != 1:
        return
    data = consts[0]
    while isinstance(data, list | tuple) and len(data) == 1:
        data = data[0]
    if type(data) is int:
        made.index_value = data


_HAS_TORCH_FUNCTION = (
    torch._C._has_torch_function,
    torch._C._has_torch_function_unary,
    torch._C._has_torch_function_variadic,
)


def _has_torch_function(tx, fn, args: list[Var]) -> bool:
    """``has_torch_function*`` of the traced values (torch's functions ask it first, which
    a frame compiled directly from torch's code evaluates): False for the tensors the trace
    holds (plain tensors and parameters, whose override is disabled), the real answer for
    known Python values."""
    values = args[0].unpack(tx) if fn is torch._C._has_torch_function and args else args
    for v in values:
        if isinstance(v, TensorVar):
            if v.python_type() not in (torch.Tensor, torch.nn.Parameter):
                raise Unsupported(breaks.UNKNOWN_CALLABLE, "a tensor subclass's __torch_function__")
            continue
        value = python_value(v)
        if value is _NO_VALUE:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"has_torch_function of {v!r}")
        if torch._C._has_torch_function_unary(value):
            return True
    return False


def _state_query(tx, fn) -> Var:
    """A torch function called without arguments that returns a plain value reads global
    state (``torch.autograd._profiler_enabled()``, ``torch.get_default_dtype()``,
    ``torch.are_deterministic_algorithms_enabled()``): its answer now, outside the meta
    device the probe ran under, guarded by calling it again, so that another state
    recompiles instead of running code that took the other branch."""
    value = fn()
    if not is_constant_value(value):
        return tx.out.wrap_value(value)
    g = tx.out.guards
    name = getattr(fn, "__qualname__", repr(fn))
    g.add(f"{g.const(fn)}() == {g.const(value)}", f"{name}() == {value!r}")
    return ConstVar(value)


class TransformedFunctionVar(Var):
    """``torch.vmap(g)`` of a function made in the frame (``NestedFunctionVar.plain_function``):
    a call on tensors is one graph op calling the transformed function."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __repr__(self) -> str:
        return f"Transformed({getattr(self.fn, '__qualname__', self.fn)})"

    def python_type(self) -> type:
        return type(self.fn)

    def call(self, tx, args, kwargs) -> Var:
        if any(contains_tensor(a) for a in args) or any(
            contains_tensor(v) for v in kwargs.values()
        ):
            return tx.out.tensor_op("call_function", self.fn, list(args), kwargs)
        raise Unsupported(breaks.UNKNOWN_CALLABLE, f"{self!r} called without tensors")


class TorchFnVar(Var):
    """A function of the torch namespace, torch.nn.functional or a Tensor method descriptor."""

    def __init__(self, fn, source=None) -> None:
        self.fn = fn
        self.source = source

    def __repr__(self) -> str:
        return f"TorchFn({getattr(self.fn, '__qualname__', self.fn)})"

    def python_type(self) -> type:
        return type(self.fn)

    def as_const(self) -> object:
        return self.fn

    def getattr(self, tx, name):
        return tx.out.wrap_value(getattr(self.fn, name))

    def call(self, tx, args, kwargs) -> Var:
        fn = self.fn
        name = getattr(fn, "__name__", "")
        mod = getattr(fn, "__module__", "") or ""
        manager = make_generator_cm(tx, fn, args, kwargs, self.source)
        if manager is not None:  # torch.random.fork_rng(), ...
            return manager
        if rng_function(fn) is not None:  # the generator's state (variables/rng.py)
            return call_rng_function(tx, rng_function(fn), args, kwargs)
        if fn in DATA_DEPENDENT_FUNCTIONS or (fn is torch.where and len(args) == 1):
            raise Unsupported(breaks.DATA_DEPENDENT, f"torch.{name}")
        if fn is torch.is_grad_enabled:
            return ConstVar(tx.out.grad_enabled)
        if fn is torch.from_numpy and len(args) == 1 and type(args[0]).__name__ == "ArrayVar":
            if args[0].scalar:
                raise Unsupported(breaks.UNSUPPORTED_VALUE, "torch.from_numpy of a numpy scalar")
            t = args[0].tensor  # the tensor the array views: a new tensor object on it
            return tx.out.tensor_op("call_method", "view_as", [t, t], {})
        if fn is torch.jit.annotate and len(args) == 2 and not kwargs:
            return args[1]  # a type hint for TorchScript; the value itself in Python
        if fn in _HAS_TORCH_FUNCTION:
            return ConstVar(_has_torch_function(tx, fn, args))
        if fn is torch.is_inference_mode_enabled:  # the real mode, which the trace keeps
            value = fn()
            f = tx.out.guards.const(fn)
            tx.out.guards.add(f"{f}() is {value}", f"inference mode is {'on' if value else 'off'}")
            return ConstVar(value)
        if fn is torch._C._set_grad_enabled and len(args) == 1 and args[0].is_const():
            tx.out.set_grad(bool(args[0].as_const()))
            return ConstVar(None)
        answer = _autocast_query(tx, fn, args)
        if answer is not None:
            return answer
        if fn is _checkpoint_function():
            return checkpointed_call(tx, args, kwargs)
        if fn in _COMPILING_QUERIES:
            # like torch.compile, captured code takes the "compiling" path of libraries
            return ConstVar(True)
        if name.startswith(("set_", "_set_", "manual_seed")) or (
            mod.startswith("torch.cuda") and name not in _CUDA_QUERIES
        ):
            raise Unsupported(breaks.UNKNOWN_CALLABLE, f"{mod}.{name} changes global state")
        if (
            isinstance(fn, types.MethodDescriptorType | types.WrapperDescriptorType)
            and args
            and isinstance(args[0], TensorVar)
        ):
            return args[0].call_method(tx, name, list(args[1:]), kwargs)
        if fn is _FUNCTION_APPLY:
            inlined = inline_function_apply(tx, list(args), kwargs)
            if inlined is not None:
                return inlined
        if any(contains_tensor(a) for a in args) or any(
            contains_tensor(v) for v in kwargs.values()
        ):
            from kiln_capture.variables.optimizers import foreach_scalars_tensor_call

            per_tensor = foreach_scalars_tensor_call(tx, fn, args, kwargs)
            if per_tensor is not None:
                return per_tensor
            return tx.out.tensor_op("call_function", fn, list(args), kwargs)
        if any(contains_symbolic(a) for a in args) or any(
            contains_symbolic(v) for v in kwargs.values()
        ):  # torch.arange(t), torch.ones(t, t), torch.sym_max(t, 4): sizes stay symbolic
            tx.out.guard_factory_defaults()
            return tx.out.tensor_op("call_function", fn, list(args), kwargs)
        # a ProcessGroup is a guarded constant to queries such as c10d's group size
        args = [_process_group_const(tx, a) for a in args]
        if fn in _FUNCTION_TRANSFORMS and args and isinstance(args[0], NestedFunctionVar):
            # torch.vmap(g) of a function defined in the frame: the transform of g as made
            # now (no cells: the same function), called by the graph as torch.vmap(torch.sum)
            plain = args[0].plain_function()
            if plain is not None:
                rest = [_value_of(a) for a in args[1:]]
                kw = {k: _value_of(v) for k, v in kwargs.items()}
                return TransformedFunctionVar(fn(plain, *rest, **kw))
        try:
            consts = [_value_of(a) for a in args]
            kw = {k: _value_of(v) for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported(
                breaks.UNKNOWN_CALLABLE, f"torch function {name} on non-constant Python values"
            ) from None
        with torch.device("meta"):
            try:
                probe = fn(*consts, **kw)
            except Exception as e:
                raise Unsupported(breaks.EXCEPTION, f"{name} raised {type(e).__name__}: {e}") from e
        if isinstance(probe, torch.Tensor) or (
            isinstance(probe, tuple | list) and any(isinstance(p, torch.Tensor) for p in probe)
        ):
            tx.out.guard_factory_defaults()
            made = tx.out.tensor_op("call_function", fn, list(args), kwargs)
            _record_index_value(made, fn, consts, probe)
            return made
        if not consts and not kw:
            return _state_query(tx, fn)
        return tx.out.wrap_value(probe)
