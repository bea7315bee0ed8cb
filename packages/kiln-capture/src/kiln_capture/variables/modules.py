"""nn.Module instances: parameters and buffers become graph inputs (lifted), submodules
and attributes are read through guarded sources, calls inline ``forward`` with hooks."""

from __future__ import annotations

import importlib
import inspect
import itertools

from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from kiln_capture import breaks, call_reuse
from kiln_capture.errors import Unsupported
from kiln_capture.sources import AttrSource, DictEntrySource, ItemSource
from kiln_capture.variables.base import MethodCallVar, Var
from kiln_capture.variables.constants import ConstVar
from kiln_capture.variables.containers import DictVar, TupleVar

_module_impl = importlib.import_module("torch.nn.modules.module")
_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)
_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def lookup_class_attr(tx, obj_var: Var, cls: type, name: str, src):
    """Resolve ``name`` on ``cls`` (descriptors included) for the instance ``obj_var``."""
    try:
        attr = inspect.getattr_static(cls, name)
    except AttributeError:
        return None
    from kiln_capture.variables.functions import BoundMethodVar

    if src is not None and not inspect.isdatadescriptor(attr):
        _guard_not_shadowed(tx, obj_var, name, src)

    if isinstance(attr, staticmethod):
        return tx.out.wrap_value(attr.__func__)
    if isinstance(attr, classmethod):
        return BoundMethodVar(tx.out.wrap_value(attr.__func__), tx.out.wrap_value(cls))
    if isinstance(attr, property):
        if attr.fget is None:
            raise AttributeError(name)
        if not inspect.isfunction(attr.fget) and src is not None and hasattr(obj_var, "value"):
            # a C getter (a pybind11 class's property): read for real and guarded, as
            # other C descriptors below
            return tx.out.wrap(getattr(obj_var.value, name), AttrSource(src, name))
        return tx.out.wrap_value(attr.fget).call(tx, [obj_var], {})
    if inspect.isfunction(attr):
        return BoundMethodVar(tx.out.wrap_value(attr), obj_var)
    if hasattr(attr, "__get__") and not isinstance(attr, type):
        # other descriptors (slots, functools.cached_property, C methods): read for real
        value = getattr(obj_var.value, name)
        return (
            tx.out.wrap(value, AttrSource(src, name))
            if src is not None
            else tx.out.wrap_value(value)
        )
    if src is None and type(attr) in (bool, int, float, str):
        # a class's constant read through an instance made in the trace (a flag such as
        # torch.distributions.Distribution._validate_args, which set_default_validate_args
        # writes): read through the class, guarded by value
        return tx.out.wrap(attr, AttrSource(tx.out.const_ref(cls), name))
    return tx.out.wrap(attr, AttrSource(src, name)) if src is not None else tx.out.wrap_value(attr)


def _guard_not_shadowed(tx, obj_var: Var, name: str, src) -> None:
    """A class attribute read through an instance (a method, a class constant) stands only
    while the instance's own ``__dict__`` lacks the name: ``m.forward = MethodType(...)``
    or ``obj.f = other`` after the capture must fail the guards, not run the old code."""
    d = getattr(getattr(obj_var, "value", None), "__dict__", None)
    if type(d) is not dict or isinstance(obj_var.value, type) or not tx.out.guards_reads_in(src):
        return
    g, e = tx.out.guards, src.expr()
    g.add(f"{g.const(name)} not in {e}.__dict__", f"{e} has no attribute {name!r} of its own")


def _class_attr(cls: type, name: str) -> object:
    """``name`` as the class (its MRO, not its metaclass) defines it, else ``_MISSING``."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


_MISSING = object()
_call_ids = itertools.count()


def _initialize_lazy(m: nn.Module, args: list[Var], kwargs: dict[str, Var]) -> None:
    """A lazy module (nn.LazyLinear, a LazyModuleMixin of the user's) not initialized yet:
    its parameters are made now, as its first eager call would make them, from the shapes
    of the call's arguments (meta tensors), and it becomes the module it turns into
    (``cls_to_become``); the call is then traced as that module's. Only what
    ``initialize_parameters`` reads of its inputs (their shapes) is known here: an input
    read for values breaks."""
    if not (isinstance(m, LazyModuleMixin) and hasattr(m, "_initialize_hook")):
        return  # initialized: _infer_parameters removed its hook
    try:
        meta_args = tuple(_meta_value(a) for a in args)
        meta_kwargs = {k: _meta_value(v) for k, v in kwargs.items()}
        m._infer_parameters(m, meta_args, meta_kwargs)
    except Unsupported:
        raise
    except Exception as e:
        raise Unsupported(
            breaks.UNSUPPORTED_VALUE,
            f"initializing lazy {type(m).__name__} raised {type(e).__name__}: {e}",
        ) from e


def _meta_value(v: Var) -> object:
    from kiln_capture.variables.containers import DictVar, ListVar, NamedTupleVar
    from kiln_capture.variables.tensors import TensorVar

    if isinstance(v, TensorVar):
        return v.meta
    if isinstance(v, NamedTupleVar):
        return v.cls(*[_meta_value(i) for i in v.items])
    if isinstance(v, TupleVar | ListVar):
        items = [_meta_value(i) for i in v.items]
        return items if isinstance(v, ListVar) else tuple(items)
    if isinstance(v, DictVar):
        return {k: _meta_value(i) for k, i in v.items.items()}
    if v.is_const():
        return v.as_const()
    raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{v!r} given to a lazy module's initialization")


def _record_module_call(graph, last, module_var: ModuleVar) -> None:
    """Mark the nodes one inlined ``forward`` added (those after ``last``) with the call,
    in ``meta["nn_module_stack"]`` (torch's key and layout: call key -> (path, class),
    outermost first; the key is unique per call). kiln-inductor's regional reuse reads it
    to find repeated blocks (transformer layers) and compile each once."""
    node = next(iter(graph.nodes), None) if last is None else last.next
    if node is None or node.op == "root":  # the node list's sentinel: nothing was added
        return
    m = module_var.value
    path = module_var.source.expr() if module_var.source is not None else type(m).__name__
    entry = {f"{path}@{next(_call_ids)}": (path, type(m))}
    while node.op != "root":  # inner calls recorded first: this one goes in front
        node.meta["nn_module_stack"] = {**entry, **node.meta.get("nn_module_stack", {})}
        node = node.next


class ModuleVar(Var):
    def __init__(self, module: nn.Module, source=None) -> None:
        self.value = module
        self.source = source

    def __repr__(self) -> str:
        return f"Module({type(self.value).__name__})"

    def python_type(self) -> type:
        return type(self.value)

    def as_const(self) -> object:
        return self.value

    def _entry(self, tx, table: str, name: str) -> Var:
        value = self.value.__dict__[table][name]
        if value is None:
            return ConstVar(None)
        src = DictEntrySource(self.source, table, name) if self.source is not None else None
        return tx.out.wrap(value, src) if src is not None else tx.out.wrap_value(value)

    def getattr(self, tx, name: str) -> Var:
        m = self.value
        d = m.__dict__
        if name in _HOOK_REGISTRATIONS and name not in d:
            return MethodCallVar(self, name)
        pending = tx.out.side_effects.pending_attr(self, name)
        if pending is not None:
            return pending
        # Python's order: the class's data descriptors (properties), the instance's
        # ``__dict__``, other class attributes (methods, class constants), and only then
        # nn.Module.__getattr__'s parameters, buffers and submodules: a method named as a
        # submodule (``def activation`` beside ``self.activation = nn.ReLU()``) wins
        static = _class_attr(type(m), name)
        if static is not _MISSING and inspect.isdatadescriptor(static):
            return lookup_class_attr(tx, self, type(m), name, self.source)
        src = AttrSource(self.source, name) if self.source is not None else None
        if name in d:
            return tx.out.wrap(d[name], src) if src is not None else tx.out.wrap_value(d[name])
        if static is not _MISSING:
            found = lookup_class_attr(tx, self, type(m), name, self.source)
            if found is not None:
                return found
        for table in ("_parameters", "_buffers", "_modules"):
            if name in d.get(table, {}):
                return self._entry(tx, table, name)
        found = lookup_class_attr(tx, self, type(m), name, self.source)
        if found is not None:
            return found
        raise AttributeError(name)

    def setattr(self, tx, name: str, value: Var) -> None:
        if name in self.value.__dict__.get("_parameters", {}) or name in self.value.__dict__.get(
            "_modules", {}
        ):
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, f"assigning module parameter/submodule {name!r}"
            )
        tx.out.side_effects.store_attr(self, name, value)

    def call(self, tx, args, kwargs) -> Var:
        m = self.value
        if type(m).__call__ is not nn.Module.__call__:
            return self.getattr(tx, "__call__").call(tx, args, kwargs)
        if getattr(m.forward, "_kiln_disabled", False):
            raise Unsupported(breaks.DISABLED, f"{type(m).__name__}.forward is disabled")
        if getattr(m.forward, "_kiln_region", False):
            raise Unsupported(breaks.REGION_BOUNDARY, f"{type(m).__name__} is a region of its own")
        _initialize_lazy(m, args, kwargs)
        pre, post = self._hooks(tx)
        for hook, with_kwargs in pre:
            if with_kwargs:
                result = hook.call(tx, [self, TupleVar(args), DictVar(dict(kwargs))], {})
                if not (result.is_const() and result.as_const() is None):
                    if not (isinstance(result, TupleVar) and len(result.items) == 2):
                        raise Unsupported(
                            breaks.EXCEPTION,
                            "forward pre-hook must return None or a tuple of (new_args, new_kwargs)",
                        )
                    new_args, new_kwargs = result.items
                    args = new_args.unpack(tx)
                    if not isinstance(new_kwargs, DictVar):
                        raise Unsupported(breaks.UNSUPPORTED_VALUE, "pre-hook kwargs not a dict")
                    kwargs = dict(new_kwargs.items)
                continue
            result = hook.call(tx, [self, TupleVar(args)], {})
            if not (result.is_const() and result.as_const() is None):
                args = result.unpack(tx) if isinstance(result, TupleVar) else [result]
        graph = tx.out.graph
        last = next(iter(reversed(graph.nodes)), None)
        if pre or post:
            out = self.getattr(tx, "forward").call(tx, args, kwargs)
        else:  # the same call as an earlier one replays its trace (call_reuse.py)
            out = call_reuse.call(
                tx, self, args, kwargs, lambda: self.getattr(tx, "forward").call(tx, args, kwargs)
            )
        _record_module_call(graph, last, self)
        for hook, with_kwargs in post:
            extra = [DictVar(dict(kwargs))] if with_kwargs else []
            result = hook.call(tx, [self, TupleVar(args), *extra, out], {})
            if not (result.is_const() and result.as_const() is None):
                out = result
        return out

    def _hooks(self, tx) -> tuple[list[tuple[Var, bool]], list[tuple[Var, bool]]]:
        """The forward pre-hooks and forward hooks ``Module.__call__`` would run (global
        ones first), each with whether it takes kwargs. Guards: which hooks are registered
        (keys of each table) and, through their sources, each hook's identity and closure.
        Backward hooks need autograd wrapping of inputs and outputs: the call then breaks."""
        m, g, impl = self.value, tx.out.guards, _module_impl
        if (
            m._backward_hooks
            or m._backward_pre_hooks
            or impl._global_backward_hooks
            or impl._global_backward_pre_hooks
        ):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{type(m).__name__} has backward hooks")
        impl_ref = tx.out.const_ref(impl)
        if not (impl._global_forward_hooks or impl._global_forward_pre_hooks):
            g.add(
                "not (" + " or ".join(f"{impl_ref.expr()}.{n}" for n in _GLOBAL_HOOKS) + ")",
                "no global nn.Module hooks",
            )
        else:
            for table in _GLOBAL_HOOKS:
                g.dict_keys(AttrSource(impl_ref, table), tuple(getattr(impl, table)))
        if tx.out.guards_reads_in(self.source):
            if not (m._forward_hooks or m._forward_pre_hooks):
                g.no_hooks(self.source)
            else:
                for table in ("_forward_hooks", "_forward_pre_hooks"):
                    g.dict_keys(AttrSource(self.source, table), tuple(getattr(m, table)))
                g.no_backward_hooks(self.source)

        def wrapped(base, table: str, key: int) -> Var:
            hook = getattr(base[0], table)[key]
            if base[1] is None:
                return tx.out.wrap_value(hook)
            return tx.out.wrap(hook, ItemSource(AttrSource(base[1], table), key))

        pre_kw = getattr(m, "_forward_pre_hooks_with_kwargs", {})
        post_kw = getattr(m, "_forward_hooks_with_kwargs", {})
        global_kw = getattr(impl, "_global_forward_hooks_with_kwargs", {})
        glob, own = (impl, impl_ref), (m, self.source)
        pre = [
            (wrapped(glob, "_global_forward_pre_hooks", k), k in pre_kw)
            for k in impl._global_forward_pre_hooks
        ]
        pre += [(wrapped(own, "_forward_pre_hooks", k), k in pre_kw) for k in m._forward_pre_hooks]
        post = [
            (wrapped(glob, "_global_forward_hooks", k), k in post_kw or k in global_kw)
            for k in impl._global_forward_hooks
        ]
        post += [
            (wrapped(own, "_forward_hooks", k), k in post_kw or k in global_kw)
            for k in m._forward_hooks
        ]
        for table, hook, with_kwargs in tx.out.side_effects.module_hooks.get(id(m), []):
            (pre if table == "_forward_pre_hooks" else post).append((hook, with_kwargs))
            for r in tx.out.recorders:  # a replay would not run the trace's hook
                r.fail(f"{type(m).__name__} has a hook the trace registered")
        return pre, post

    # -- containers ---------------------------------------------------------------------

    def _children(self, tx) -> list[Var]:
        m = self.value
        table = "_parameters" if isinstance(m, nn.ParameterList | nn.ParameterDict) else "_modules"
        self._guard_keys(tx, table)
        return [self._entry(tx, table, k) for k in m.__dict__[table]]

    def _guard_keys(self, tx, table: str) -> None:
        """Iterating a container depends on which children it holds."""
        if tx.out.guards_reads_in(self.source):
            tx.out.guards.dict_keys(
                AttrSource(self.source, table), tuple(self.value.__dict__[table])
            )

    def unpack(self, tx) -> list[Var]:
        m = self.value
        it = self._user_dunder(tx, "__iter__", [])
        if it is not None:
            return it.unpack(tx)
        if isinstance(m, nn.ModuleDict | nn.ParameterDict):
            return [
                ConstVar(k) for k in (m._modules if isinstance(m, nn.ModuleDict) else m._parameters)
            ]
        if isinstance(m, _CONTAINERS):
            return self._children(tx)
        return super().unpack(tx)

    def _user_dunder(self, tx, name: str, args: list[Var]) -> Var | None:
        """``name`` (``__getitem__``, ``__len__``) as the module's class defines it in
        Python (a model that indexes its layers as ``self[i]``), inlined; None when the
        class has no such method of its own."""
        fn = inspect.getattr_static(type(self.value), name, None)
        if not inspect.isfunction(fn) or (fn.__module__ or "").startswith("torch.nn.modules"):
            return None  # torch's containers' own, modeled by this class
        return self.getattr(tx, name).call(tx, args, {})

    def length(self, tx) -> int:
        n = self._user_dunder(tx, "__len__", [])
        if n is not None and n.is_const() and type(n.as_const()) is int:
            return n.as_const()
        if n is None and isinstance(self.value, _CONTAINERS):
            self._children(tx)
            return len(self.value)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"len() of {type(self.value).__name__}")

    def contains(self, tx, item: Var) -> bool:
        if isinstance(self.value, nn.ModuleDict | nn.ParameterDict):
            return item.as_const() in self.value
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"`in` on {type(self.value).__name__}")

    def getitem(self, tx, key: Var) -> Var:
        m = self.value
        item = self._user_dunder(tx, "__getitem__", [key])
        if item is not None:
            return item
        k = key.as_const()
        if isinstance(m, nn.ModuleDict):
            return self._entry(tx, "_modules", k)
        if isinstance(m, nn.ParameterDict):
            return self._entry(tx, "_parameters", k)
        if isinstance(m, _CONTAINERS) and isinstance(k, int):
            return self._children(tx)[k]
        if isinstance(m, nn.ModuleList) and isinstance(k, slice):
            from kiln_capture.variables.containers import ListVar

            return ListVar(self._children(tx)[k])
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{type(m).__name__}[{k!r}]")

    def call_method(self, tx, name, args, kwargs) -> Var:
        m = self.value
        from kiln_capture.variables.containers import ListVar

        if isinstance(m, nn.ModuleDict | nn.ParameterDict) and name in ("items", "keys", "values"):
            keys = self.unpack(tx)
            vals = [self.getitem(tx, k) for k in keys]
            if name == "keys":
                return ListVar(keys)
            if name == "values":
                return ListVar(vals)
            return ListVar([TupleVar([k, v]) for k, v in zip(keys, vals)])
        if name in ("children", "parameters", "buffers", "named_children", "modules") and not args:
            if name in ("children", "named_children"):
                table = "_modules"
            else:
                table = "_parameters" if name == "parameters" else "_buffers"
            if name == "modules":
                raise Unsupported(breaks.UNSUPPORTED_VALUE, "Module.modules()")
            keys = list(m.__dict__[table])
            if name == "parameters" and m._modules:
                raise Unsupported(breaks.UNSUPPORTED_VALUE, "Module.parameters() over submodules")
            entries = [self._entry(tx, table, k) for k in keys]
            if name == "named_children":
                return ListVar([TupleVar([ConstVar(k), e]) for k, e in zip(keys, entries)])
            return ListVar(entries)
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name in _HOOK_REGISTRATIONS and name not in m.__dict__:
            return self._register_hook(tx, name, list(args), dict(kwargs))
        return super().call_method(tx, name, args, kwargs)

    def _register_hook(self, tx, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
        """``m.register_forward_hook(hook)`` (or a pre-hook) in the trace: the module's
        later calls in this trace run the hook, and the registration itself is replayed
        after the graph (transformers' output capturing installs its hooks lazily, on the
        first call asking for hidden states). The handle is not modeled: using it breaks."""
        hook = args.pop(0) if args else kwargs.pop("hook", None)
        options = {k: v.as_const() for k, v in kwargs.items()}
        if (
            hook is None
            or args
            or set(options) - {"prepend", "with_kwargs", "always_call"}
            or options.get("prepend")
            or options.get("always_call")
        ):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"Module.{name} with these arguments")
        with_kwargs = bool(options.get("with_kwargs", False))
        table = _HOOK_REGISTRATIONS[name]
        effects = tx.out.side_effects
        effects.module_hooks.setdefault(id(self.value), []).append((table, hook, with_kwargs))
        effects.call_after(
            lambda cg: f"{cg.rebuild(self)}.{name}({cg.rebuild(hook)}, with_kwargs={with_kwargs})"
        )
        return _UnmodeledHandle()


_HOOK_REGISTRATIONS = {
    "register_forward_hook": "_forward_hooks",
    "register_forward_pre_hook": "_forward_pre_hooks",
}


class _UnmodeledHandle(Var):
    """The RemovableHandle of a hook registered in the trace: any use breaks."""

    def __repr__(self) -> str:
        return "RemovableHandle"


__all__ = ["ModuleVar", "lookup_class_attr"]
