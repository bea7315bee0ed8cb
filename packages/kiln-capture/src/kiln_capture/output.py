"""The output of one trace: the FX graph being built, its inputs, guards and side effects.

Values read from the frame are "wrapped" here into Vars with guards (``wrap``); tensor
operations become FX nodes whose ``meta["val"]`` is computed on the meta device
(``tensor_op``). ``meta["device"]`` holds the real device, which a meta tensor lacks.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import functools
import os
import re
import sys
import types
from operator import getitem as _getitem
from operator import setitem as _setitem
from typing import Any

import torch
from torch import fx, nn

from kiln_capture import autocast_state, breaks
from kiln_capture.dynamic import FrameShapes, from_frame_arguments, symbolic_dims
from kiln_capture.errors import DynamicShapeError, Unsupported
from kiln_capture.guards import GuardSet, default_device_name
from kiln_capture.log import log
from kiln_capture.meta_reuse import MetaResults
from kiln_capture.shape_guards import ShapeGuards
from kiln_capture.side_effects import SideEffects
from kiln_capture.sources import (
    AttrSource,
    ConstRef,
    DictKeySource,
    ItemSource,
    Source,
    TensorKeySource,
)
from kiln_capture.variables.base import MethodCallVar, Var
from kiln_capture.variables.builtins import BuiltinVar, is_builtin_callable
from kiln_capture.variables.constants import LITERAL_TYPES, ConstVar, is_constant_value
from kiln_capture.variables.containers import (
    LIST_ITERATOR_TYPES,
    DefaultDictVar,
    DictVar,
    ListVar,
    NamedTupleVar,
    SourcedIteratorVar,
    TupleVar,
    key_of,
    wrap_collection,
)
from kiln_capture.variables.contexts import (
    GRAD_MODE_CLASSES,
    AutocastVar,
    ContextMethodVar,
    EnteredAutocastVar,
    EnteredGradModeVar,
)
from kiln_capture.variables.functions import BoundMethodVar, TorchFnVar, UserFunctionVar
from kiln_capture.variables.modules import ModuleVar
from kiln_capture.variables.objects import ObjectVar, RecordVar, is_record_type
from kiln_capture.variables.optimizers import (
    TensorKeyedDictVar,
    group_value,
    is_tensor_keyed_dict,
)
from kiln_capture.variables.rng import check_op as check_rng_order
from kiln_capture.variables.sizes import SYM_TYPES, SymIntVar, expr_value
from kiln_capture.variables.tensors import SizeVar, TensorVar

_DEVICE_LIKE_METHODS = frozenset({"to", "cuda", "cpu", "type_as"})
_TORCH_DIRS = tuple(
    {os.path.dirname(p) + os.sep for p in (torch.__file__, os.path.realpath(torch.__file__))}
)


# torch modules whose Python functions are inlined rather than recorded as graph calls:
# module forwards, and the decorator/context-manager plumbing of grad modes and autocast.
_INLINED_TORCH_MODULES = (
    "torch.nn.modules",
    "torch.testing",
    # pytree helpers (tree_flatten/tree_unflatten/tree_map over containers, TreeSpec
    # methods): pure Python over lists, tuples and dicts, traced as user code
    "torch.utils._pytree",
    "torch.utils._contextlib",
    "torch.autograd.grad_mode",
    "torch.amp.autocast_mode",
    # functional collectives: Python over torch.ops._c10d_functional (a collective, then
    # wait_tensor where a compiler traces it), which the graph records as ops
    "torch.distributed._functional_collectives",
    # checkpoint_wrapper's forward: Python around torch.utils.checkpoint (traced as such)
    "torch.distributed.algorithms._checkpoint",
    # optimizers: step() and zero_grad() (variables/optimizers.py, "optimizer steps")
    "torch.optim",
    # distributions: Python objects over tensor ops (Normal(loc, scale).log_prob(x)); their
    # argument checks read tensor values and break where validation is on
    "torch.distributions",
)


def is_torch_callable(value: object) -> bool:
    if isinstance(value, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return True
    if isinstance(
        value,
        types.BuiltinFunctionType
        | types.MethodDescriptorType
        | types.WrapperDescriptorType
        | types.MethodWrapperType,
    ):
        mod = (
            getattr(value, "__module__", None)
            or getattr(getattr(value, "__objclass__", None), "__module__", "")
            or ""
        )
        if isinstance(getattr(value, "__self__", None), types.ModuleType):
            mod = mod or value.__self__.__name__
        return is_torch_module_name(mod)
    if isinstance(value, types.FunctionType):
        mod = value.__module__ or ""
        return is_torch_module_name(mod) and not mod.startswith(_INLINED_TORCH_MODULES)
    return False


def is_torch_module_name(mod: str) -> bool:
    """``torch`` or one of its submodules; a user's module named ``torch_utils`` is not."""
    return mod == "torch" or mod.startswith("torch.")


_FLAT_LITERALS = frozenset({int, float, bool, str, type(None)})


def _is_numpy_type_info(value: object) -> bool:
    """A numpy dtype, or the finfo/iinfo of one (all determined by the dtype)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.dtype | numpy.finfo | numpy.iinfo)


def _is_numpy_scalar(value: object) -> bool:
    """A numpy number (not an array, nor a NaN: it equals nothing a guard could check)."""
    kind = type(value)
    if kind.__module__ != "numpy" or kind.__name__ == "ndarray":
        return False
    if getattr(value, "shape", None) != () or not hasattr(value, "item"):
        return False
    item = value.item()
    return isinstance(item, bool | int | float) and item == item


class CalledAsItself:
    """A graph call of a function whose name leads elsewhere (see ``tensor_op``)."""

    def __init__(self, fn) -> None:
        self.fn = fn
        name = fn.__name__
        if not name.isidentifier():  # torch.vmap(lambda q: ...): FX cannot name "<lambda>"
            name = "fn_" + "".join(c for c in name if c.isalnum() or c == "_")
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"CalledAsItself({self.fn!r})"


_FUNCTION_APPLY = torch.autograd.Function.apply.__func__


# builtins whose effect a graph would not repeat on every call (it runs forward and
# backward once, when kiln-aot traces it)
_EFFECT_BUILTINS = frozenset(
    {"print", "open", "input", "exec", "eval", "setattr", "delattr", "globals", "__import__"}
)
_STATIC_GLOBALS = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)


def _autograd_function(kind: str, target: object, args: list[Var], literals: list) -> type | None:
    """The ``torch.autograd.Function`` subclass a call of ``Function.apply`` is for, when
    its methods are plain tensor code: the graph runs them once, at trace time, so a
    method that reads a closure, a global value other than a module, class, function or
    literal (the literals, ``(globals, name, value)``, are added to ``literals`` for the
    caller to guard), or calls a builtin with an effect (``print``) is left to run eagerly
    (a break), as before."""
    if kind != "call_function" or target is not _FUNCTION_APPLY or not args:
        return None
    cls = getattr(args[0], "value", None)
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        return None
    for name in ("forward", "setup_context", "backward"):
        fn = getattr(cls, name, None)
        fn = getattr(fn, "__func__", fn)
        if not isinstance(fn, types.FunctionType) or fn.__module__ == "torch.autograd.function":
            continue  # the base class's (setup_context unused) or a C implementation
        if fn.__closure__ or not _plain_globals(fn.__code__, fn.__globals__, literals):
            return None
    return cls


def _plain_globals(code: types.CodeType, globals_: dict, literals: list) -> bool:
    for name in code.co_names:
        if name in globals_:
            value = globals_[name]
            if type(value) in _FLAT_LITERALS:
                literals.append((globals_, name, value))
            elif not isinstance(value, _STATIC_GLOBALS):
                return False
        elif name in _EFFECT_BUILTINS:
            return False
    return all(
        _plain_globals(c, globals_, literals)
        for c in code.co_consts
        if isinstance(c, types.CodeType)
    )


def _named_as_itself(fn: object) -> bool:
    """Whether a Python function is what its module and qualified name say (FX's
    generated code calls a torch function by that name)."""
    if not isinstance(fn, types.FunctionType):
        return True
    found: object = sys.modules.get(fn.__module__ or "")
    for part in (fn.__qualname__ or "").split("."):
        found = getattr(found, part, None)
    return found is fn


def _empty_cell(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return True
    return False


class OutputGraph:
    def __init__(
        self,
        globals_dict: dict,
        *,
        dynamic: bool | None = False,
        frame_shapes: FrameShapes | None = None,
        fullgraph: bool = False,
    ) -> None:
        from kiln_shapes import ShapeEnv

        self.graph = fx.Graph()
        # the symbols of this trace's inputs (dynamic.py, "symbolic inputs")
        self.shape_env = ShapeEnv()
        self.shape_env.locate = self._locate
        self.dynamic = dynamic
        self.frame_shapes = frame_shapes
        self.fullgraph = fullgraph
        self.module_sources: set[Source] = set()
        # (file, name) of the code the trace evaluated (frame_store.py checks the files)
        self.traced_code: set[tuple[str, str]] = set()
        self._size_nodes: dict[tuple[fx.Node, str, int], fx.Node] = {}
        self.guards = GuardSet()
        self.guards.shapes = ShapeGuards(self.shape_env)
        self.side_effects = SideEffects()
        self.globals = globals_dict
        self.grad_enabled = torch.is_grad_enabled()
        self.initial_grad = self.grad_enabled
        # metadata (requires_grad) depends on the grad mode the frame starts in
        self.guards.add(
            f"{self.guards.const(torch.is_grad_enabled)}() is {self.grad_enabled}",
            f"grad mode is {'enabled' if self.grad_enabled else 'disabled'}",
        )
        # so do dtypes under autocast (the caller's autocast applies to the frame)
        self.autocast = autocast_state.current()
        self.initial_autocast = self.autocast
        self.autocast_open: list[fx.Node] = []  # _enter_autocast nodes not yet exited
        self.guards.add(
            f"{self.guards.const(autocast_state.current)}() == {self.guards.const(self.autocast)}",
            f"autocast state is {self.autocast or 'off'}",
        )
        self.example_inputs: list[torch.Tensor] = []
        self.input_sources: dict[fx.Node, Source] = {}
        self._input_values: dict[fx.Node, object] = {}
        self._wrapped: dict[int, Var] = {}
        self._int_inputs: dict[str, SymIntVar] = {}  # symbolic int inputs, by source
        self.lifted_floats: dict[str, Var] = {}  # floats read as tensor inputs, by source
        self._keepalive: list[object] = []
        # real closure cells the trace reads, one CellVar each (by the cell's id): a
        # continuation's own cells are also cells of the closures made before the break
        self.real_cells: dict[int, Var] = {}
        self._frozen: set[Source] = set()
        # statements the generated code runs before the graph (building fresh modules)
        self.prelude: list[str] = []
        # a generator write replayed after the graph (variables/rng.py)
        self.rng_write_after = False
        self._placeholder_names: set[str] = set()
        self.ops = 0
        self.frame: Any = None  # the evaluator frame running now (its stack goes on nodes)
        self.meta_results = MetaResults()  # meta results of this capture's ops (meta_reuse.py)
        # module calls recorded and replayed (call_reuse.py): the recorders of the calls
        # being traced (told of reads, ops and guards), the recordings by call key
        self.recorders: list = []
        self.guards.listeners = self.recorders
        self.side_effects.listeners = self.recorders
        self.call_recordings: dict = {}
        self.call_kinds: set = set()  # (class, forward) of the module calls met so far
        self._wrap_depth = 0
        self._op_depth = 0
        self.last_meta_key = None  # of the last op (tensor_op), for a recording
        self.root_frame: Any = None  # the RootFrame (its arguments: call_reuse.py's checks)

    # -- wrapping values read from the frame ---------------------------------------------

    def const_ref(self, value: object) -> ConstRef:
        expr = self.guards.const(value)
        return ConstRef(int(expr[len("__k_C[") : -1]))

    def wrap_value(self, value: object) -> Var:
        """A value the trace computed or holds by reference (no guard on its identity)."""
        if is_constant_value(value):
            return ConstVar(value)
        if isinstance(value, torch.Size):
            return SizeVar([ConstVar(_concrete(s)) for s in value])
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            return ConstVar(_concrete(value))  # no node computes it: specialized
        return self.wrap(value, self.const_ref(value))

    def wrap(self, value: object, source: Source) -> Var:
        """A value read from ``source``; records the guards the trace relies on."""
        if not self.recorders:
            return self._wrap(value, source)
        n = len(self.graph.nodes)
        self._wrap_depth += 1
        try:
            var = self._wrap(value, source)
        finally:
            self._wrap_depth -= 1
        if not self._wrap_depth:  # the outermost read: a recorded call's event
            if self._op_depth:
                for r in self.recorders:
                    r.fail(f"a read of {source.expr()} inside an op")
            nodes = self.last_nodes(len(self.graph.nodes) - n)
            for r in self.recorders:
                r.wrapped(value, source, var, nodes)
        return var

    def last_nodes(self, k: int) -> list[fx.Node]:
        """The graph's last ``k`` nodes, in order (what one read or op just added)."""
        nodes, node = [], self.graph._root
        for _ in range(k):
            node = node.prev
            nodes.append(node)
        nodes.reverse()
        return nodes

    def _wrap(self, value: object, source: Source) -> Var:
        rooted = not isinstance(source, ConstRef) and not self._below_frozen(source)
        if type(value) is int and rooted:
            symbolic = self._dynamic_int(value, source)
            if symbolic is not None:
                return symbolic
        if type(value) is float and rooted:  # an optimizer's varying learning rate
            lifted = group_value(self, value, source)
            if lifted is not None:
                return lifted
        if isinstance(value, LITERAL_TYPES) or isinstance(
            value, torch.dtype | torch.device | torch.memory_format | torch.layout
        ):
            if rooted:
                if isinstance(value, LITERAL_TYPES):
                    self.guards.const_eq(source, value)
                else:
                    self.guards.add(
                        f"{source.expr()} == {self.guards.const(value)}",
                        f"{source.expr()} == {value}",
                    )
            return ConstVar(value, source if rooted else None)
        if _is_numpy_type_info(value):
            # np.dtype("float16"), np.finfo(np.float32): constants, guarded by the dtype
            if rooted:
                g, e = self.guards, source.expr()
                g.type_is(source, value)
                dtype = value if isinstance(value, sys.modules["numpy"].dtype) else value.dtype
                read = e if dtype is value else f"{e}.dtype"
                g.add(f"{read} == {g.const(dtype)}", f"{read} == {dtype!r}")
            return ConstVar(value, source if rooted else None)
        if _is_numpy_scalar(value):
            # np.finfo(...).max, np.int64(3): a number, guarded by type and value
            if rooted:
                g = self.guards
                g.type_is(source, value)
                g.add(f"{source.expr()} == {value.item()!r}", f"{source.expr()} == {value!r}")
            return ConstVar(value, source if rooted else None)
        if isinstance(value, enum.Enum) and type(value).__eq__ is object.__eq__:
            # an enum member (checkpoint_wrapper's CheckpointImpl): a constant, compared
            # by identity, so the guard is on identity
            if rooted:
                self.guards.id_is(source, value)
            return ConstVar(value, source if rooted else None)
        key = id(value)
        seen = self._wrapped.get(key)
        if seen is not None:
            if (
                rooted
                and seen.source is not None
                and seen.source != source
                and not isinstance(seen.source, ConstRef)
            ):
                self.guards.same_object(source, seen.source)
            return seen
        var = self._make(value, source, rooted)
        self._wrapped[key] = var
        self._keepalive.append(value)
        return var

    def _dict_entries(self, value: dict, source: Source, rooted: bool) -> dict:
        """The entries of a dict read from ``source`` whose keys are constants or tensors
        (each tensor key read at its position, ``list(d)[i]``, as a graph input)."""
        if rooted:
            kinds = tuple(isinstance(k, torch.Tensor) for k in value)
            consts = tuple(k for k in value if not isinstance(k, torch.Tensor))
            e = source.expr()
            self.guards.add(
                f"tuple(isinstance(k, {self.guards.const(torch.Tensor)}) for k in {e}) == "
                f"{kinds!r} and tuple(k for k, t in zip({e}, {kinds!r}) if not t) == "
                f"{consts!r}",
                f"keys of {e} are {consts!r} and tensors at {kinds!r}",
            )
        items: dict = {}
        for i, (k, v) in enumerate(value.items()):
            if isinstance(k, torch.Tensor):
                key_source = DictKeySource(source, i)
                items[key_of(None, self.wrap(k, key_source))] = self.wrap(
                    v, TensorKeySource(source, key_source)
                )
            else:
                items[k] = self.wrap(v, ItemSource(source, k))
        return items

    def wrap_rebuilt_function(self, fn: types.FunctionType, source: Source) -> Var:
        """A function that generated code rebuilds on each call (a closure live at a
        break, handed to the continuation): guarded by its code, globals and constant
        defaults instead of its identity; its closure's contents are guarded where the
        trace reads them (``ClosureSource``), its attributes where it reads those."""
        defaults = fn.__defaults__ or ()
        if (
            id(fn) in self._wrapped
            or fn.__kwdefaults__
            or fn.__dict__
            or not all(is_constant_value(d) for d in defaults)
            or any(_empty_cell(c) for c in fn.__closure__ or ())
        ):
            return self.wrap(fn, source)
        g, e = self.guards, source.expr()
        g.add(
            f"type({e}) is {g.const(types.FunctionType)} and {e}.__code__ is "
            f"{g.const(fn.__code__)} and {e}.__globals__ is {g.const(fn.__globals__)} and "
            f"{e}.__defaults__ == {fn.__defaults__!r} and {e}.__kwdefaults__ is None and "
            f"not {e}.__dict__",
            f"{e} is a function of {fn.__code__.co_qualname}'s code, rebuilt at a break",
        )
        var = UserFunctionVar(fn, source)
        self._wrapped[id(fn)] = var
        self._keepalive.append(fn)
        return var

    def real_cell(self, cell: object, make) -> Var:
        """The one CellVar of the real cell ``cell`` (``make()`` builds it on first use)."""
        known = self.real_cells.get(id(cell))
        if known is None:
            known = self.real_cells[id(cell)] = make()
            self._keepalive.append(cell)
        return known

    def freeze(self, source: Source) -> None:
        """Reads inside ``source`` need no guard from now on (see ``_below_frozen``)."""
        self._frozen.add(source)

    def guards_reads_in(self, source: Source | None) -> bool:
        """Whether what is read inside ``source`` is guarded (not below a frozen source)."""
        return source is not None and not self._below_frozen(source)

    def _below_frozen(self, source: Source) -> bool:
        """Whether ``source`` reads inside an immutable object whose identity is guarded
        (a code object), inside a module built by the generated code (FreshSource), or
        inside a private copy made while capturing (``copy.deepcopy`` of a config): what
        it reads there follows from guarded state, so it needs no guard."""
        while source is not None and self._frozen:
            if source in self._frozen:
                return True
            source = getattr(source, "base", None)
        return False

    def _make(self, value: object, source: Source, rooted: bool) -> Var:
        g = self.guards
        if isinstance(value, types.CodeType) and rooted:
            g.id_is(source, value)
            self._frozen.add(source)
            return ObjectVar(value, source)
        if isinstance(value, torch.Tensor):
            return self._placeholder(value, source)
        if isinstance(value, nn.Module):
            if rooted:
                g.id_is(source, value)
            self.module_sources.add(source)
            return ModuleVar(value, source)
        if (
            isinstance(value, tuple | list)
            and type(value) in (tuple, list)
            or (isinstance(value, tuple) and hasattr(type(value), "_fields"))
        ):
            if (
                rooted
                and type(value) is tuple
                and all(type(v) in _FLAT_LITERALS for v in value)
                and g.literal(source, value)
            ):  # an attribute like a conv's stride: one check of the whole tuple
                return TupleVar([ConstVar(v) for v in value], source)
            if rooted:
                g.type_is(source, value)
                g.length(source, len(value))
            items = [self.wrap(v, ItemSource(source, i)) for i, v in enumerate(value)]
            if type(value) is list:
                return ListVar(items, source)
            if type(value) is tuple:
                return TupleVar(items, source)
            return NamedTupleVar(type(value), items, source)
        if isinstance(value, torch.Size):
            if rooted:
                g.type_is(source, value)
                g.add(f"{source.expr()} == {tuple(value)!r}", f"{source.expr()} == {tuple(value)}")
            return SizeVar([ConstVar(s) for s in value])
        collection = wrap_collection(self, value, source, rooted)  # a Counter or deque
        if collection is not None:
            return collection
        if type(value) is dict or (
            isinstance(value, dict) and type(value).__name__ == "OrderedDict"
        ):
            if all(isinstance(k, str | int) for k in value):
                if rooted:
                    g.type_is(source, value)
                    g.dict_keys(source, tuple(value))
                items = {k: self.wrap(v, ItemSource(source, k)) for k, v in value.items()}
                return DictVar(items, source, cls=type(value))
        if (
            type(value) is collections.defaultdict
            and all(isinstance(k, str | int | torch.Tensor) for k in value)
            and not is_tensor_keyed_dict(value)  # an optimizer's state (optimizers.py)
        ):
            # read and changed like a dict (written back after the graph: clear + update
            # keep its factory); a missing key read gets the factory's value
            if rooted:
                g.type_is(source, value)
            factory = self.wrap(value.default_factory, AttrSource(source, "default_factory"))
            return DefaultDictVar(factory, self._dict_entries(value, source, rooted), source)
        if rooted and is_record_type(type(value)) and all(isinstance(k, str) for k in value):
            # a ModelOutput handed in (generate()'s encoder outputs): its fields are read
            # through the record's protocol (ModelOutput.__getitem__ -> to_tuple -> keys())
            g.type_is(source, value)
            g.dict_keys(source, tuple(value))
            fields = {
                f.name: self.wrap(value[f.name], ItemSource(source, f.name))
                if f.name in value
                else ConstVar(None)
                for f in dataclasses.fields(value)
            }
            return RecordVar(type(value), fields, source=source)
        if is_tensor_keyed_dict(value) and rooted:  # an optimizer's state
            g.type_is(source, value)
            return TensorKeyedDictVar(value, source)
        if type(value) in LIST_ITERATOR_TYPES and rooted:  # a continuation's loop iterator
            g.type_is(source, value)
            return SourcedIteratorVar(self, value, source)
        if isinstance(value, torch.amp.autocast):
            if rooted:  # its settings, not its identity: continuations get fresh ones
                g.type_is(source, value)
                for attr in ("device", "fast_dtype", "_enabled", "_cache_enabled"):
                    self.wrap(getattr(value, attr), AttrSource(source, attr))
            return AutocastVar(value, source)
        if (
            isinstance(value, types.MethodType)
            and value.__name__ == "__exit__"
            and rooted
            and isinstance(value.__self__, (torch.amp.autocast, *GRAD_MODE_CLASSES))
            and hasattr(value.__self__, "prev")
        ):  # a continuation's with-block exit of a context its caller entered
            obj = value.__self__
            obj_source = AttrSource(source, "__self__")
            g.type_is(obj_source, obj)
            kind = EnteredAutocastVar if isinstance(obj, torch.amp.autocast) else EnteredGradModeVar
            return ContextMethodVar(kind(obj, obj_source), "exit")
        if isinstance(value, types.BuiltinMethodType) and type(
            getattr(value, "__self__", None)
        ) in (list, dict):
            obj = self.wrap(value.__self__, AttrSource(source, "__self__"))
            return MethodCallVar(obj, value.__name__)
        if is_torch_callable(value):
            if rooted:
                g.id_is(source, value)
            return TorchFnVar(value, source)
        if is_builtin_callable(value):
            if rooted:
                g.id_is(source, value)
            return BuiltinVar(value, source)
        if isinstance(value, types.FunctionType):
            if rooted:
                g.id_is(source, value)
            return UserFunctionVar(value, source)
        if isinstance(value, types.MethodType):
            fn = self.wrap(value.__func__, AttrSource(source, "__func__"))
            obj = self.wrap(value.__self__, AttrSource(source, "__self__"))
            return BoundMethodVar(fn, obj, source)
        if isinstance(value, type | types.ModuleType):
            if rooted:
                g.id_is(source, value)
            return ObjectVar(value, source)
        if rooted:
            g.type_is(source, value)
        return ObjectVar(value, source)

    def _placeholder(self, t: torch.Tensor, source: Source) -> TensorVar:
        if type(t) not in (
            torch.Tensor,
            nn.Parameter,
            nn.Buffer if hasattr(nn, "Buffer") else torch.Tensor,
        ):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"tensor subclass {type(t).__name__}")
        node = self.graph.placeholder(self._input_name(source))
        fresh = self._below_frozen(source)  # a fresh module's parameter: made as guarded
        meta = None if fresh else self._symbolic_meta(t, source)
        if meta is None:
            if not fresh:
                self.guards.tensor(source, t)
            meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            if t.requires_grad:
                meta.requires_grad_(True)
        node.meta["val"] = meta
        node.meta["device"] = t.device
        node.meta["source"] = source.expr()
        self.example_inputs.append(t)
        self.input_sources[node] = source
        self._input_values[node] = t
        return TensorVar(node, meta, t.device, source, cls=type(t))

    def input_value(self, var: Var) -> object | None:
        """The real tensor behind a tensor input of the graph (None for values the trace
        computed)."""
        node = getattr(var, "node", None)
        return self._input_values.get(node) if node is not None else None

    def _input_name(self, source: Source) -> str:
        """A placeholder name for ``source`` not used yet in this graph."""
        name = base = _input_name(source.expr())
        n = 1
        while name in self._placeholder_names:
            name = f"{base}_{n}"
            n += 1
        self._placeholder_names.add(name)
        return name

    def _symbolic_meta(self, t: torch.Tensor, source: Source) -> torch.Tensor | None:
        """A meta tensor with symbolic sizes for an input some of whose dimensions are
        symbolic (dynamic.py), its guard recorded; None when every size stays static."""
        if isinstance(source, ConstRef) or t.dim() == 0:
            return None
        dims, ranges = symbolic_dims(
            t, source, self.dynamic, self.frame_shapes, self.module_sources
        )
        if not dims:
            return None
        e = source.expr()
        for d, (lo, hi) in list(ranges.items()):
            size = t.shape[d]
            if (lo is not None and size < lo) or (hi is not None and size > hi):
                why = (
                    f"kiln: {e}.size({d}) is {size}, outside the range [{lo}, {hi}] that "
                    "mark_dynamic declared"
                )
                if self.fullgraph:
                    raise DynamicShapeError(
                        f"{why}; fullgraph=True does not compile a specialized graph for it "
                        "(fix: pass sizes inside the range, or widen it in mark_dynamic)"
                    )
                log("recompiles", f"{why}: this entry specializes it")
                dims.remove(d)
                del ranges[d]
        if not _strides_follow_sizes(t):
            log("guards", f"{e} is not dense: its sizes stay static")
            return None
        env = self.shape_env
        size, stride = env.symbolic_sizes(t, e, dims, ranges)
        if all(s.is_Integer for s in size):
            return None  # sizes 0 and 1 stay specialized
        meta = env.meta_tensor(size, stride, t.dtype, requires_grad=t.requires_grad)
        self.guards.symbolic_tensor(source, t, size, stride)
        return meta

    def wrap_size(self, value: object, source: Source) -> Var:
        """An int argument that was a symbolic size where this continuation's frame broke:
        a symbol (that of a tensor argument's size equal to it: duck sizing) bound
        from ``source`` by the shape guard; a plain guarded constant if it is 0 or 1, not
        an int, or ``dynamic=False``."""
        if type(value) is not int or self.dynamic is False:
            return self.wrap(value, source)
        return self._symbolic_int(value, source, duck=True) or self.wrap(value, source)

    def _dynamic_int(self, value: int, source: Source) -> SymIntVar | None:
        """An int read from the frame's arguments (a local, or an attribute or item of an
        object passed in, such as a KV cache layer's length) as a symbol: with
        ``dynamic=True`` from the first compile, automatically once its value changed
        between two compiles of the frame (dynamic.py, "symbolic ints"). None: it stays a
        guarded constant (ints held by modules, globals, 0 and 1, ``dynamic=False``)."""
        if self.dynamic is False or isinstance(source, ConstRef):
            return None
        e = source.expr()
        known = self._int_inputs.get(e)
        if known is not None:
            return known
        if not from_frame_arguments(source, self.module_sources):
            return None
        if self.dynamic is None and (
            self.frame_shapes is None or not self.frame_shapes.int_varied(e, value)
        ):
            return None
        return self._symbolic_int(value, source, duck=False)

    def _symbolic_int(self, value: int, source: Source, duck: bool) -> SymIntVar | None:
        """``value`` read from ``source`` as a symbol the shape guard binds from it (None
        for 0 and 1, which specialize). Its graph node is the size of a tensor input that
        has the symbol as a dimension, else an int input of the graph (a placeholder whose
        ``meta["val"]`` is the SymInt)."""
        e = source.expr()
        env = self.shape_env
        symbol = env.create_symbol(value, e, duck=duck)
        if symbol.is_Integer:
            return None
        self.guards.shapes.add_int(e, symbol, value)

        def make():
            found = self.guards.shapes.tensor_source(symbol)
            if found is None:
                return self._int_placeholder(var, value, source)
            expr, dim = found
            node = next(n for n, src in self.input_sources.items() if src.expr() == expr)
            return self.size_of(
                TensorVar(node, node.meta["val"], node.meta["device"]), "size", dim
            ).node

        var = SymIntVar(self, env.symint(symbol), make)
        self._int_inputs[e] = var
        return var

    def _int_placeholder(self, var: SymIntVar, value: int, source: Source) -> fx.Node:
        """A graph input for a symbolic int no tensor input has as a size."""
        node = self.graph.placeholder(self._input_name(source))
        node.meta["val"] = var.value
        node.meta["source"] = source.expr()
        self.example_inputs.append(value)
        self.input_sources[node] = source
        return node

    def _locate(self) -> str | None:
        """The line the evaluator is at (a shape guard's ``where``): of the innermost
        frame outside torch (``F.layer_norm`` inlined from a model: the model's line)."""
        frame = self.frame
        while frame is not None and frame.parent is not None:
            if not frame.code.co_filename.startswith(_TORCH_DIRS):
                break
            frame = frame.parent
        if frame is None:
            return None
        file, line, _ = frame.location()
        return f"{file}:{line}"

    # -- symbolic sizes ------------------------------------------------------------------

    def sym_value(self, value: object, make_node) -> Var:
        """A number the trace computed: a SymIntVar when it is symbolic (``make_node``
        makes its FX node on first use), else a constant."""
        if isinstance(value, torch.SymBool):
            if _unbacked(value):  # a comparison of a value only the data gives
                return SymIntVar(self, value, make_node)
            return ConstVar(bool(value))
        value = expr_value(value)
        if isinstance(value, SYM_TYPES):
            return SymIntVar(self, value, make_node)
        return self.wrap_value(value)

    def size_of(self, t: TensorVar, method: str, dim: int) -> Var:
        """``t.size(dim)`` (or ``t.stride(dim)``): a constant, or a SymIntVar whose node is
        the ``call_method`` that reads it (one per tensor and dimension)."""
        ndim = t.meta.dim()
        if not isinstance(dim, int) or not -ndim <= dim < ndim:
            raise Unsupported(breaks.EXCEPTION, f"IndexError: dimension {dim!r} out of range")
        dim %= ndim
        value = getattr(t.meta, method)(dim)

        def make() -> fx.Node:
            key = (t.node, method, dim)
            node = self._size_nodes.get(key)
            if node is None:
                node = self.graph.call_method(method, (t.node, dim))
                self._size_nodes[key] = node
            return node

        return self.sym_value(value, make)

    def size_var(self, t: TensorVar, method: str = "size") -> SizeVar | TupleVar:
        """``t.shape`` / ``t.size()``, or ``t.stride()`` (a tuple)."""
        items = [self.size_of(t, method, d) for d in range(t.meta.dim())]
        if method == "size":
            return SizeVar(items)
        if all(isinstance(i, ConstVar) for i in items):
            return ConstVar(tuple(i.value for i in items))
        return TupleVar(items)

    # -- tensor operations ---------------------------------------------------------------

    def tensor_op(
        self, kind: str, target, args: list[Var], kwargs: dict[str, Var], known=None
    ) -> Var:
        """The op's result Var and its graph node. ``known``: the meta-reuse key of the
        same op on alike arguments (a replayed call's op, call_reuse.py), whose result is
        then taken from meta_reuse.py without building the key, and without a stack
        trace (the replay sets it); the general path where nothing is kept under it."""
        if not self.recorders or self._op_depth:
            return self._op(kind, target, args, kwargs, known)
        n = len(self.graph.nodes)
        self._op_depth += 1
        try:
            result = self._op(kind, target, args, kwargs, known)
        finally:
            self._op_depth -= 1
        nodes = self.last_nodes(len(self.graph.nodes) - n)
        for r in self.recorders:
            r.op(kind, target, args, kwargs, result, nodes, self.last_meta_key)
        return result

    def _op(self, kind: str, target, args: list[Var], kwargs: dict[str, Var], known) -> Var:
        if known is not None:
            result = self._known_op(kind, target, args, kwargs, known)
            if result is not None:
                return result
        return self._tensor_op(kind, target, args, kwargs)

    def _known_op(self, kind: str, target, args: list[Var], kwargs: dict[str, Var], key):
        """``_tensor_op`` of an op whose meta-reuse key is ``key`` (``tensor_op``), or
        None (nothing kept under it: the general path runs)."""
        meta_args = [_to_meta(a) for a in args]
        meta_kwargs = {k: _to_meta(v) for k, v in kwargs.items()}
        result = self.meta_results.get_known(key, meta_args, meta_kwargs)
        if result is None:
            return None
        if kind == "call_function" and not _named_as_itself(target):
            target = CalledAsItself(target)
        name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        check_rng_order(self, name)
        node_args = tuple(_to_node(a) for a in args)
        node = self.graph.create_node(
            kind, target, node_args, {k: _to_node(v) for k, v in kwargs.items()}
        )
        self.ops += 1
        self.last_meta_key = key
        return self._wrap_result(node, result, _infer_device(kind, target, args, kwargs))

    def _tensor_op(self, kind: str, target, args: list[Var], kwargs: dict[str, Var]) -> Var:
        self.last_meta_key = None
        literals: list = []
        function = _autograd_function(kind, target, args, literals)
        if function is not None:
            # MyFunction.apply(x, ...): one graph call of the bound apply, whose forward and
            # (through autograd, when kiln-aot traces the graph) backward become graph ops
            target, args = CalledAsItself(function.apply), args[1:]
            for namespace, name, value in literals:  # module constants its methods read
                self.guards.const_eq(ItemSource(self.const_ref(namespace), name), value)
        if kind == "call_function" and not _named_as_itself(target):
            # torch.vmap(torch.sum) copies torch.sum's name: the graph's code would call
            # torch.sum. The graph's code holds this wrapper object itself instead
            target = CalledAsItself(target)
        args = [self._frozen_const(a) for a in args]
        kwargs = {k: self._frozen_const(v) for k, v in kwargs.items()}
        rewritten = _truth_op(self, kind, target, args, kwargs)
        if rewritten is not None:
            self.last_meta_key = None  # (its own ops set it)
            return rewritten
        node_args = tuple(_to_node(a) for a in args)
        node_kwargs = {k: _to_node(v) for k, v in kwargs.items()}
        under_autocast = bool(self.autocast)
        meta_args = [_to_meta(a, under_autocast) for a in args]
        meta_kwargs = {k: _to_meta(v, under_autocast) for k, v in kwargs.items()}
        device = _infer_device(kind, target, args, kwargs)
        if "device" in meta_kwargs and meta_kwargs["device"] is not None:
            meta_kwargs["device"] = "meta"
        if kind == "call_method" and target in _DEVICE_LIKE_METHODS:
            meta_args = [meta_args[0]] + ["meta" if _device_like(a) else a for a in meta_args[1:]]
        if target in (_getitem, _setitem) and len(meta_args) > 1:
            meta_args[1] = _index_for_meta(meta_args[1])
        name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        from kiln_shapes import DataDependentError

        # branches inside the op on its data (a check such as cov's "aweights cannot be
        # negative", narrow's negative tensor start): the sides taken, in order (False
        # first; a side that raises is flipped), handed to kiln-aot on the node, which
        # takes the same ones and asserts them at run time (ShapeEnv.speculating)
        choices: list[bool] = []
        taken: list[bool] = []

        def choose() -> bool:
            side = choices[len(taken)] if len(taken) < len(choices) else False
            taken.append(side)
            return side

        def evaluate(symbolic: bool):
            taken.clear()
            with (
                torch.set_grad_enabled(self.grad_enabled),
                torch.device("meta"),
                autocast_state.autocast_as(self.autocast)
                if under_autocast
                else contextlib.nullcontext(),
                autocast_state.device_meta_mode() if under_autocast else contextlib.nullcontext(),
                self._symbolic_meta_mode(force=symbolic),
                self.shape_env.speculating(choose=choose),
            ):
                if kind == "call_method":
                    if target in ("cuda", "cpu"):
                        return meta_args[0]
                    return getattr(meta_args[0], target)(*meta_args[1:], **meta_kwargs)
                return target(*meta_args, **meta_kwargs)

        def speculative(symbolic: bool):
            for _ in range(_SPECULATION_TRIES):
                try:
                    return evaluate(symbolic)
                except (Unsupported, DataDependentError):
                    raise
                except Exception:
                    if False not in taken:
                        raise
                    k = len(taken) - 1 - taken[::-1].index(False)
                    choices[:] = [*taken[:k], True]
            return evaluate(symbolic)

        # the same op on arguments of the same metadata earlier in this capture (the
        # 2nd..Nth identical layer): its result again, without a meta kernel (meta_reuse.py)
        reuse = None
        if not under_autocast and not self.shape_env.symbols:
            reuse = self.meta_results.key(kind, target, meta_args, meta_kwargs, self.grad_enabled)
        result = self.meta_results.get(reuse) if reuse is not None else None
        try:
            if result is None:
                try:
                    result = speculative(symbolic=False)
                except (NotImplementedError, RuntimeError) as e:
                    if isinstance(e, DataDependentError) or self.shape_env.symbols:
                        raise
                    # a meta kernel that refuses data-dependent work (nonzero, .item()):
                    # again with outputs sized by unbacked symbols (kiln_shapes.unbacked)
                    reuse = None
                    result = speculative(symbolic=True)
                if under_autocast:
                    result = autocast_state.to_meta(result)
                if reuse is not None and not taken:
                    self.meta_results.keep(reuse, result)
        except Unsupported:
            raise
        except DataDependentError as e:
            raise Unsupported(breaks.TENSOR_BRANCH, f"{name}: {e}") from e
        except (NotImplementedError, RuntimeError) as e:
            if (
                "meta" in str(e).lower()
                and (
                    "not implemented" in str(e).lower()
                    or "could not run" in str(e).lower()
                    or isinstance(e, NotImplementedError)
                )
            ) or "no fake impl" in str(e).lower():  # a custom op without register_fake
                raise Unsupported(breaks.NO_META, f"{name}: {str(e).splitlines()[0]}") from e
            raise Unsupported(
                breaks.EXCEPTION,
                f"{name} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            ) from e
        except Exception as e:
            raise Unsupported(breaks.EXCEPTION, f"{name} raised {type(e).__name__}: {e}") from e
        check_rng_order(self, name)
        node = self.graph.create_node(kind, target, node_args, node_kwargs)
        # the key this op's result is kept under, for a recording (call_reuse.py)
        self.last_meta_key = reuse[0] if reuse is not None and not taken else None
        if taken:
            node.meta["kiln_speculation"] = tuple(taken)
        if self.frame is not None:
            node.meta["stack_trace"] = self.frame.stack_trace()
        self.ops += 1
        return self._wrap_result(node, result, device)

    def _frozen_const(self, v: Var) -> Var:
        """An instance of a frozen dataclass read from the frame (``LinearCrossEntropyOptions``
        handed to ``F.linear_cross_entropy``) is a constant argument of the op, guarded by
        identity: its fields cannot change."""
        value = getattr(v, "value", None)
        source = getattr(v, "source", None)
        params = getattr(type(value), "__dataclass_params__", None)
        if params is None or not params.frozen or source is None or isinstance(value, type):
            return v
        if type(v).__name__ != "ObjectVar":
            return v
        fields = [getattr(value, f.name) for f in dataclasses.fields(value)]
        if not all(is_constant_value(f) or isinstance(f, torch.dtype) for f in fields):
            return v  # a field that could change inside (a list): not a constant
        self.guards.id_is(source, value)
        return ConstVar(value)

    def _symbolic_meta_mode(self, force: bool = False):
        if not self.shape_env.symbols and not force:
            return contextlib.nullcontext()
        from kiln_shapes.meta import symbolic_meta

        return symbolic_meta(self.shape_env)

    def _wrap_result(self, node: fx.Node, result, device) -> Var:
        if isinstance(result, torch.Tensor):
            node.meta["val"] = result
            node.meta["device"] = device
            return TensorVar(node, result, device)
        if isinstance(result, tuple | list) and result and _tensor_tree(result):
            return self._wrap_sequence(node, result, device)
        if result is None:
            node.meta["val"] = None
            return ConstVar(None)
        if isinstance(result, (*SYM_TYPES, torch.SymBool)) and _unbacked(result):
            # a number only the data gives (.item(), allclose): a graph op and value
            node.meta["val"] = result
            return SymIntVar(self, result, lambda: node)
        if isinstance(result, SYM_TYPES) and isinstance(expr_value(result), SYM_TYPES):
            self.ops -= 1  # a number: the node stays for the graph ops that use it
            node.meta["val"] = result
            var = SymIntVar(self, result, lambda: node)
            return var
        self.graph.erase_node(node)
        self.ops -= 1
        if is_constant_value(result):
            return ConstVar(result)
        if isinstance(result, torch.Size | torch.SymInt | torch.SymFloat | torch.SymBool):
            return self.wrap_value(result)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"op returned a {type(result).__name__}")

    def _wrap_sequence(self, node: fx.Node, result, device) -> Var:
        """A tuple/list (or namedtuple) of tensors, or of sequences of tensors
        (``histogramdd``'s hist and bin edges): one ``getitem`` node per item."""
        node.meta["val"] = tuple(result) if isinstance(result, tuple) else list(result)
        node.meta["device"] = device
        items: list[Var] = []
        for i, r in enumerate(result):
            item = self.graph.call_function(_getitem, (node, i))
            item.meta["device"] = device
            if isinstance(r, torch.Tensor):
                item.meta["val"] = r
                items.append(TensorVar(item, r, device))
            elif r is None:
                self.graph.erase_node(item)
                items.append(ConstVar(None))
            else:
                items.append(self._wrap_sequence(item, r, device))
        if isinstance(result, list):
            return ListVar(items)
        if type(result) is not tuple:
            return NamedTupleVar(type(result), items)
        return TupleVar(items)

    def guard_factory_defaults(self) -> None:
        """Tensors made from Python values take the default dtype and device."""
        g = self.guards
        g.add(
            f"{g.const(torch.get_default_dtype)}() is {g.const(torch.get_default_dtype())}",
            f"default dtype is {torch.get_default_dtype()}",
        )
        device = default_device_name()
        g.add(f"{g.const(default_device_name)}() == {device!r}", f"default device is {device}")

    def enter_autocast(self, device: str, dtype, enabled: bool, cache_enabled: bool) -> fx.Node:
        """Record ``torch.autocast(...).__enter__()``; the node's value is the mode object
        that ``exit_autocast`` hands back (both are side-effectful for FX's dead-code pass)."""
        node = self.graph.call_function(
            torch.amp._enter_autocast, (device, dtype, enabled, cache_enabled)
        )
        node.meta["val"] = None
        self.autocast = autocast_state.with_device(self.autocast, device, dtype, enabled)
        self.autocast_open.append(node)
        return node

    def exit_autocast(self, enter: fx.Node, restore) -> None:
        node = self.graph.call_function(torch.amp._exit_autocast, (enter,))
        node.meta["val"] = None
        self.autocast = restore
        self.autocast_open.remove(enter)

    def close_autocast(self) -> None:
        """At the end of a graph: exit the regions still open, innermost first, so the
        graph leaves the autocast state as it found it."""
        for enter in reversed(self.autocast_open):
            node = self.graph.call_function(torch.amp._exit_autocast, (enter,))
            node.meta["val"] = None
        self.autocast_open.clear()

    def set_grad(self, enabled: bool) -> bool:
        prev = self.grad_enabled
        if prev != enabled:
            self.graph.call_function(torch._C._set_grad_enabled, (enabled,))
            self.grad_enabled = enabled
        return prev


_SPECULATION_TRIES = 4  # sides of data branches tried inside one op (tensor_op)


def _tensor_tree(result) -> bool:
    """Tensors, or non-empty tuples/lists of them, at every leaf; a leaf may be None
    where another is a tensor (``F.multi_head_attention_forward(..., need_weights=False)``
    returns ``(out, None)``: whether it is None follows from the arguments)."""
    if isinstance(result, torch.Tensor):
        return True
    return (
        isinstance(result, tuple | list)
        and bool(result)
        and all(r is None or _tensor_tree(r) for r in result)
        and any(r is not None for r in result)
    )


def _unbacked(value: object) -> bool:
    """Whether a symbolic value depends on an unbacked symbol (a value the data gives)."""
    from kiln_shapes import expr_of

    node = getattr(value, "node", None)
    env = getattr(node, "env", None)
    return env is not None and bool(env.unbacked_in(expr_of(value)))


# torch functions and Tensor methods that return a Python bool computed from the data:
# their bool return would be made concrete on the way out of C++, so the trace records
# the tensor computation they stand for and reads its truth with ``.item()``
_TRUTH_OPS = {torch.allclose: "allclose", torch.equal: "equal"}


def _split_by_tensor(
    out: OutputGraph, kind: str, target, args: list[Var], kwargs: dict
) -> Var | None:
    """``tensor_split(x, t)`` with a 1-d CPU tensor of indices: split at ``t[i].item()``,
    values of the data (the op's own meta kernel refuses a tensor on the meta device)."""
    if target not in (torch.tensor_split, "tensor_split") or len(args) < 2:
        return None
    t = args[1]
    if not isinstance(t, TensorVar) or t.meta.dim() != 1 or t.device.type != "cpu":
        return None
    if t.meta.dtype.is_floating_point or not isinstance(t.meta.shape[0], int):
        return None
    items = [
        out.tensor_op(
            "call_method",
            "item",
            [out.tensor_op("call_function", _getitem, [t, ConstVar(i)], {})],
            {},
        )
        for i in range(t.meta.shape[0])
    ]
    return out.tensor_op(kind, target, [args[0], ListVar(items), *args[2:]], kwargs)


def _truth_op(out: OutputGraph, kind: str, target, args: list[Var], kwargs: dict) -> Var | None:
    """``allclose``/``equal`` as ``isclose(...).all().item()`` / ``(a == b).all().item()``
    (``equal``: False when the shapes differ, decided on the shapes); ``tensor_split`` by a
    tensor of indices (``_split_by_tensor``)."""
    split = _split_by_tensor(out, kind, target, args, kwargs)
    if split is not None:
        return split
    which = _TRUTH_OPS.get(target) if kind == "call_function" else None
    if kind == "call_method" and target in ("allclose", "equal"):
        which = target
    if which is None or len(args) < 2 or not all(isinstance(a, TensorVar) for a in args[:2]):
        return None
    a, b = args[0], args[1]
    if which == "equal":
        if kwargs or len(args) != 2:
            return None
        if list(a.meta.shape) != list(b.meta.shape):  # guarded where symbolic
            return ConstVar(False)
        close = out.tensor_op("call_function", torch.eq, [a, b], {})
    else:
        names = ("rtol", "atol", "equal_nan")
        kw = dict(zip(names, args[2:]))
        kw.update(kwargs)
        close = out.tensor_op("call_function", torch.isclose, [a, b], kw)
    every = out.tensor_op("call_method", "all", [close], {})
    return out.tensor_op("call_method", "item", [every], {})


def _input_name(expr: str) -> str:
    """A readable placeholder name: ``__k_G['m']._modules['fc']._parameters['weight']`` -> ``m_fc_weight``."""
    expr = re.sub(r"\._(modules|parameters|buffers)\[", ".", expr)
    expr = expr.replace("__k_G[", "").replace("__k_C[", "const_")
    name = re.sub(r"\W+", "_", expr).strip("_")[-60:]
    name = name.lstrip("_0123456789")
    return name or "input"


def _device_like(v) -> bool:
    if isinstance(v, torch.device):
        return True
    if isinstance(v, str):
        try:
            torch.device(v)
            return True
        except RuntimeError:
            return False
    return False


def _infer_device(kind: str, target, args: list[Var], kwargs: dict[str, Var]) -> torch.device:
    dev = kwargs.get("device")
    if dev is not None and dev.is_const() and dev.as_const() is not None:
        d = dev.as_const()
        return torch.device("cuda", d) if isinstance(d, int) else torch.device(d)
    if kind == "call_method" and target == "cpu":
        return torch.device("cpu")
    if kind == "call_method" and target == "cuda":
        idx = args[1].as_const() if len(args) > 1 else None
        return torch.device(
            "cuda",
            idx
            if idx is not None
            else torch.cuda.current_device()
            if torch.cuda.is_available()
            else 0,
        )
    if kind == "call_method" and target in ("to", "type_as"):
        for a in args[1:]:
            if isinstance(a, TensorVar):
                return a.device
            if a.is_const() and _device_like(a.as_const()):
                return torch.device(a.as_const())
    for a in args:
        t = _first_tensor(a)
        if t is not None:
            return t.device
    for a in kwargs.values():
        t = _first_tensor(a)
        if t is not None:
            return t.device
    return torch.get_default_device()


def _first_tensor(v: Var) -> TensorVar | None:
    if isinstance(v, TensorVar):
        return v
    for c in v.children():
        t = _first_tensor(c)
        if t is not None:
            return t
    return None


def _index_for_meta(key):
    """A tensor index whose symbolic integer indices are 0 (``x[:, t - 1]``): Python's
    indexing would make them concrete (a guard on their value), and the result's shape
    does not depend on them; the graph node keeps the symbolic index."""
    if isinstance(key, torch.SymInt):
        return 0
    if type(key) is tuple:
        return tuple(0 if isinstance(k, torch.SymInt) else k for k in key)
    return key


def _strides_follow_sizes(t: torch.Tensor) -> bool:
    """Whether each stride of ``t`` is the product of the sizes of the dimensions faster
    than it (dense in some dimension order): the strides a symbolic input's meta tensor
    gets (``ShapeEnv.symbolic_sizes``) and its guard checks. A size-1 dimension's stride is
    never read (a row sliced from a batch keeps the batch's stride there)."""
    acc = 1
    for d in sorted(range(t.dim()), key=lambda d: (t.stride(d), -d)):
        if t.shape[d] == 1:
            continue
        if t.stride(d) != acc:
            return False
        acc *= max(t.shape[d], 1)
    return True


def _concrete(value: object) -> object:
    """A number for a possibly symbolic one (guarded when symbolic)."""
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    return value


def _to_node(v: Var):
    if isinstance(v, TensorVar | SymIntVar):
        return v.node
    if isinstance(v, TupleVar | SizeVar) and not v.is_const():
        return tuple(_to_node(i) for i in v.items)
    if isinstance(v, ListVar):
        return [_to_node(i) for i in v.items]
    if type(v).__name__ == "SliceVar":
        return slice(*(_to_node(p) for p in v.parts))
    if isinstance(v, DictVar):
        return {k: _to_node(i) for k, i in v.items.items()}
    try:
        value = v.as_const()
    except Unsupported:
        raise Unsupported(
            breaks.UNSUPPORTED_VALUE, f"{v!r} as an argument of a tensor op"
        ) from None
    if type(value).__module__ == "numpy" and type(value).__name__ != "ndarray":
        # a numpy scalar (np.finfo(...).max): torch takes it as the Python number it
        # holds, and the graph's code can name only that (it printed ``np.float64(...)``)
        item = getattr(value, "item", None)
        if item is not None and getattr(value, "shape", None) == ():
            return item()
    if _unspellable(value):
        # the graph's code names an argument by its repr: a class, a module or a function
        # prints as code that does not parse or names something else
        # (``autograd.Function.apply(x, [Linear(...)])``): the call runs eagerly instead
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{v!r} as an argument of a tensor op")
    return value


_UNSPELLABLE = (
    type,
    nn.Module,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    functools.partial,
)


def _unspellable(value: object) -> bool:
    """Whether FX's generated code cannot spell ``value`` as an argument."""
    if isinstance(value, _UNSPELLABLE) and not hasattr(value, "_custom_fx_repr_fn"):
        return not isinstance(value, torch._ops.OpOverload | torch._ops.OpOverloadPacket)
    if type(value) in (tuple, list):
        return any(_unspellable(p) for p in value)
    if type(value) is dict:
        return any(_unspellable(p) for p in value.values())
    return False


def _to_meta(v: Var, on_device: bool = False):
    """The meta value of an argument; ``on_device``: tensors as DeviceMeta (autocast)."""
    if isinstance(v, TensorVar):
        return autocast_state.DeviceMeta.of(v.meta, v.device) if on_device else v.meta
    if isinstance(v, SymIntVar):
        return v.value
    if isinstance(v, TupleVar | SizeVar) and not v.is_const():
        return tuple(_to_meta(i, on_device) for i in v.items)
    if isinstance(v, ListVar):
        return [_to_meta(i, on_device) for i in v.items]
    if type(v).__name__ == "SliceVar":
        return slice(*(_to_meta(p, on_device) for p in v.parts))
    if isinstance(v, DictVar):
        return {k: _to_meta(i, on_device) for k, i in v.items.items()}
    return v.as_const()
