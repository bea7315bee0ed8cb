"""Other Python objects: classes, Python modules, user objects (configs, dataclasses),
objects created during the trace, and ``super()``."""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import inspect
import operator
import sys
import threading
import types
import weakref

import torch

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.sources import AttrSource, ConstRef
from kiln_capture.variables.arrays import array_read_after_write, store_into_array
from kiln_capture.variables.base import MethodCallVar, Var
from kiln_capture.variables.constants import ConstMethodVar, ConstVar, is_constant_value
from kiln_capture.variables.containers import (
    DequeVar,
    DictVar,
    ListVar,
    NamedTupleVar,
    TupleVar,
    make_counter,
)
from kiln_capture.variables.contexts import GRAD_MODE_CLASSES, AutocastVar, GradModeVar
from kiln_capture.variables.iterators import (
    iterate,
)
from kiln_capture.variables.modules import lookup_class_attr
from kiln_capture.variables.records import (
    _RECORD_DICT_READS,
    RecordVar,
    _RecordDelitemVar,
    _RecordSetitemVar,
    is_record_type,
    make_record,
)
from kiln_capture.variables.rng import NO_OP_GUARDS
from kiln_capture.variables.tensors import SizeVar

# Modules whose attributes are taken as constants without a guard: nobody patches them
# between calls, and guarding `torch.relu` on every call would cost more than it protects.
TRUSTED_MODULE_PREFIXES = (
    "torch",
    "math",
    "operator",
    "builtins",
    "functools",
    "itertools",
    "collections",
    "typing",
    "numbers",
)


# Containers that cannot change after creation: read for real, no guard needed.
_IMMUTABLE_C_CONTAINERS = (types.MappingProxyType, frozenset, tuple, str, bytes)


class ObjectVar(Var):
    """An existing Python object read through a source (or held as a constant)."""

    def __init__(self, value: object, source=None) -> None:
        self.value = value
        self.source = source

    def __repr__(self) -> str:
        return f"Object({type(self.value).__name__})"

    def python_type(self) -> type:
        return type(self.value)

    def as_const(self) -> object:
        if isinstance(
            self.value, type | types.ModuleType | types.FunctionType
        ) or is_constant_value(self.value):
            return self.value
        return super().as_const()

    def is_const(self) -> bool:
        return isinstance(self.value, type)

    def truth(self, tx) -> bool:
        if isinstance(self.value, type):
            return True
        return truth_by_protocol(tx, self, type(self.value))

    def _child(self, tx, value, name):
        if self.source is not None:
            return tx.out.wrap(value, AttrSource(self.source, name))
        return tx.out.wrap_value(value)

    def _process_group_attr(self, tx, name: str) -> Var:
        """A ProcessGroup's name, size or rank (a property or a method): a constant of this
        group, whose identity is guarded (functional collectives read its name)."""
        attr = getattr(guarded_process_group(tx, self), name)
        return ConstMethodVar(self.value, name) if callable(attr) else ConstVar(attr)

    def _device_mesh_attr(self, tx, name: str) -> Var:
        """A DeviceMesh's shape and group names: fixed when the mesh is made, constants of
        this mesh, whose identity is guarded (functional collectives given a mesh read
        ``ndim`` and ``_dim_group_names``)."""
        if self.source is not None and not isinstance(self.source, ConstRef):
            tx.out.guards.id_is(self.source, self.value)
        return tx.out.wrap_value(getattr(self.value, name))

    def getattr(self, tx, name: str) -> Var:
        v = self.value
        array_read_after_write(self)
        pending = tx.out.side_effects.pending_attr(self, name)
        if pending is not None:
            return pending
        if isinstance(v, types.ModuleType):
            attr = getattr(v, name)
            if v.__name__.split(".")[0] in TRUSTED_MODULE_PREFIXES:
                return tx.out.wrap_value(attr)
            return self._child(tx, attr, name)
        if isinstance(v, type):
            attr = inspect.getattr_static(v, name)
            if isinstance(attr, staticmethod):
                return tx.out.wrap_value(attr.__func__)
            if isinstance(attr, classmethod):
                from kiln_capture.variables.functions import BoundMethodVar

                return BoundMethodVar(tx.out.wrap_value(attr.__func__), self)
            return self._child(tx, getattr(v, name), name)
        if name in _PROCESS_GROUP_READS and _is_process_group(v):
            return self._process_group_attr(tx, name)
        if name in _DEVICE_MESH_READS and _is_device_mesh(v):
            return self._device_mesh_attr(tx, name)
        if inspect.isfunction(inspect.getattr_static(type(v), "__getattribute__", None)):
            return self._real_getattr(tx, name)
        static = inspect.getattr_static(type(v), name, None)
        if name in _DICT_VIEWS and self.source is not None and static in _DICT_VIEWS[name]:
            return _DictViewMethodVar(self, name)
        if (
            name in _READ_ONLY_METHODS
            and self.source is not None
            and callable(static)
            and (
                (getattr(static, "__module__", "") or "").startswith(
                    ("collections", "_collections_abc", "os")
                )
                or static in _DICT_C_READS  # a dict subclass's inherited get()
            )
        ):
            return ReadOnlyCMethodVar(getattr(type(v), name), self)
        d = getattr(v, "__dict__", None)
        if (
            d is not None
            and name in d
            and not inspect.isdatadescriptor(getattr(type(v), name, None))
        ):
            return self._child(tx, d[name], name)
        found = lookup_class_attr(tx, self, type(v), name, self.source)
        if found is not None:
            return found
        ga = inspect.getattr_static(type(v), "__getattr__", None)
        if inspect.isfunction(ga) and (ga.__module__ or "").startswith("torch.backends."):
            # a backend flag (torch.backends.cuda.matmul.allow_tf32): read now, guarded
            value = getattr(v, name)
            if is_constant_value(value) and self.source is not None:
                return tx.out.wrap(value, AttrSource(self.source, name))
        if inspect.isfunction(ga):
            return tx.out.wrap_value(ga).call(tx, [self, ConstVar(name)], {})
        if ga in _DICT_C_READS and self.source is not None:  # ``__getattr__ = dict.get``
            return ReadOnlyCMethodVar(ga, self).call(tx, [ConstVar(name)], {})
        raise AttributeError(name)

    def _dict_keys(self, dunder: str) -> list[Var] | None:
        """The keys of a dict subclass's instance passed in, for ``for k in d`` and
        ``len(d)`` where the class keeps dict's own ``dunder`` (guarded as keys())."""
        if not isinstance(self.value, dict) or self.source is None:
            return None
        static = inspect.getattr_static(type(self.value), dunder, None)
        if static not in (getattr(dict, dunder), getattr(collections.OrderedDict, dunder)):
            return None
        return _DictViewMethodVar(self, "keys")

    def setitem(self, tx, key: Var, value: Var) -> None:
        if not store_into_array(tx, self, key, value):
            super().setitem(tx, key, value)

    def unpack(self, tx) -> list[Var]:
        array_read_after_write(self)
        if isinstance(self.value, type | types.ModuleType):
            return super().unpack(tx)
        if isinstance(self.value, _IMMUTABLE_C_CONTAINERS):
            return [tx.out.wrap_value(v) for v in self.value]
        keys = self._dict_keys("__iter__")
        if keys is not None:
            return keys.call(tx, [], {}).unpack(tx)
        return unpack_by_protocol(tx, self, type(self.value))

    def length(self, tx) -> int:
        if isinstance(self.value, _IMMUTABLE_C_CONTAINERS):
            return len(self.value)
        keys = self._dict_keys("__len__")
        if keys is not None:
            return len(keys.call(tx, [], {}).unpack(tx))
        return length_by_protocol(tx, self, type(self.value))

    def contains(self, tx, item: Var) -> bool:
        fn = inspect.getattr_static(type(self.value), "__contains__", None)
        if inspect.isfunction(fn) and not fn.__module__.startswith("collections"):
            return tx.out.wrap_value(fn).call(tx, [self, item], {}).truth(tx)
        if self.source is None or not (item.is_const() or _is_builtin_class(item)):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"`in` on {self!r}")
        key = item.as_const()
        result = key in self.value  # read-only membership test, re-checked by a guard
        e = self.source.expr()
        tx.out.guards.add(
            f"({tx.out.guards.const(key)} in {e}) is {result}",
            f"{key!r} {'in' if result else 'not in'} {e}",
        )
        return result

    def _real_getattr(self, tx, name: str) -> Var:
        """For types overriding __getattribute__ (e.g. configs with attribute aliases):
        read for real; guards re-read the same way."""
        static = inspect.getattr_static(type(self.value), name, None)
        if inspect.isfunction(static):
            from kiln_capture.variables.functions import BoundMethodVar

            return BoundMethodVar(tx.out.wrap_value(static), self)
        if isinstance(static, property) and static.fget is not None:
            return tx.out.wrap_value(static.fget).call(tx, [self], {})
        try:
            value = getattr(self.value, name)
        except AttributeError:
            if self.source is not None:  # getattr(cfg, name, default): absent on each call
                g, src = tx.out.guards, self.source.expr()
                g.add(f"not hasattr({src}, {g.const(name)})", f"{src} has no attribute {name!r}")
            raise
        return self._child(tx, value, name)

    def setattr(self, tx, name: str, value: Var) -> None:
        if isinstance(self.value, type | types.ModuleType):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"setting {name!r} on a class or module")
        tx.out.side_effects.store_attr(self, name, value)

    def call_method(self, tx, name, args, kwargs) -> Var:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def call(self, tx, args, kwargs) -> Var:
        v = self.value
        if isinstance(v, type):
            return construct(tx, v, args, kwargs)
        call = inspect.getattr_static(type(v), "__call__", None)
        if inspect.isfunction(call):
            return tx.out.wrap_value(call).call(tx, [self, *args], kwargs)
        if isinstance(v, _LRU_CACHE_WRAPPER):
            return _cached_call(tx, v, args, kwargs)
        if _is_fromkeys(v):
            return _fromkeys(tx, v.__self__, args, kwargs)
        if (getattr(v, "__module__", None) or type(v).__module__ or "").startswith("numpy"):
            from kiln_capture.variables.arrays import numpy_call

            made = numpy_call(tx, v, list(args), dict(kwargs))
            if made is not None:
                return made
        if isinstance(getattr(v, "__self__", None), _LOCK_TYPES) and v.__name__ in _LOCK_METHODS:
            # a threading lock taken around Python state (transformers' hook installation):
            # the trace runs in one thread and holds nothing past the graph, whose effects
            # are replayed after it; acquiring answers True as an uncontended lock does
            return ConstVar(_LOCK_METHODS[v.__name__])
        if v is tuple.__new__ and len(args) == 2 and not kwargs and args[0].is_const():
            cls = args[0].as_const()  # a namedtuple's _make / __new__ (generated code)
            if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
                return NamedTupleVar(cls, args[1].unpack(tx))
        if type(v) is weakref.ref and not args and not kwargs and self.source is not None:
            # an LR scheduler's wrapper of optimizer.step holds the optimizer by weakref
            from kiln_capture.sources import CallSource

            return tx.out.wrap(v(), CallSource(tx.out.const_ref(operator.call), self.source, ()))
        if type(v) is functools.partial and self.source is not None:
            # partial(f, *a, **k)(*args, **kw) is f(*a, *args, **{**k, **kw}); its fields are
            # read (and guarded) at their sources
            from kiln_capture.sources import AttrSource, ItemSource

            fn = self._child(tx, v.func, "func")
            given = [
                tx.out.wrap(a, ItemSource(AttrSource(self.source, "args"), i))
                for i, a in enumerate(v.args)
            ]
            keywords = {
                k: tx.out.wrap(a, ItemSource(AttrSource(self.source, "keywords"), k))
                for k, a in v.keywords.items()
            }
            return fn.call(tx, [*given, *args], {**keywords, **kwargs})
        name = getattr(v, "__qualname__", None) or getattr(v, "__name__", None)
        module = getattr(v, "__module__", None)
        what = f"{module}.{name}" if name and module else (name or "")
        # the report names the callable (``_C.set_enabled``), not only its type
        raise Unsupported(
            breaks.UNKNOWN_CALLABLE,
            f"call of {what} ({type(v).__name__})" if what else f"call of a {type(v).__name__}",
        )

    def getitem(self, tx, key):
        gi = inspect.getattr_static(type(self.value), "__getitem__", None)
        if inspect.isfunction(gi):
            return tx.out.wrap_value(gi).call(tx, [self, key], {})
        array_read_after_write(self)
        if (
            self.source is not None
            and (key.is_const() or _is_builtin_class(key))
            and isinstance(self.value, list | tuple | dict)
        ):
            from kiln_capture.sources import ItemSource

            k = key.as_const()
            if (
                k not in self.value
                if isinstance(self.value, dict)
                else not -len(self.value) <= k < len(self.value)
            ):
                raise Unsupported(
                    breaks.EXCEPTION, f"{type(self.value).__name__} has no item {k!r}"
                )
            if isinstance(self.source, ConstRef):
                # a container held by reference: its items are held the same way
                return tx.out.wrap_value(self.value[k])
            if not is_constant_value(k) or isinstance(k, float):
                # a key with no literal form (pytree's SUPPORTED_NODES is keyed by type):
                # the guards read the item with the key held as a constant
                from kiln_capture.sources import TensorKeySource

                src = TensorKeySource(self.source, tx.out.const_ref(k))
                return tx.out.wrap(self.value[k], src)
            return tx.out.wrap(self.value[k], ItemSource(self.source, k))
        return super().getitem(tx, key)

    def reconstruct(self, cg) -> str:
        if self.source is not None:
            return self.source.expr()
        return cg.const(self.value)


def _is_builtin_class(var: Var) -> bool:
    """A class or function used as a key, as pytree's SUPPORTED_NODES is keyed (tuple,
    list, dict, collections.namedtuple): a known object, compared by identity."""
    from kiln_capture.variables.builtins import BuiltinVar
    from kiln_capture.variables.functions import UserFunctionVar

    if isinstance(var, BuiltinVar):
        return isinstance(var.fn, type)
    return isinstance(var, UserFunctionVar) and var.source is not None


def unpack_by_protocol(tx, var: Var, cls: type) -> list[Var]:
    """Iterate a user object through its Python ``__iter__``, or ``__len__``+``__getitem__``."""
    it = inspect.getattr_static(cls, "__iter__", None)
    # collections.abc's mixins (Mapping.keys()'s KeysView) are plain Python: traced
    if inspect.isfunction(it) and (
        not it.__module__.startswith("collections") or it.__module__ == "collections.abc"
    ):
        return tx.out.wrap_value(it).call(tx, [var], {}).unpack(tx)
    ln = inspect.getattr_static(cls, "__len__", None)
    gi = inspect.getattr_static(cls, "__getitem__", None)
    if inspect.isfunction(ln) and inspect.isfunction(gi):
        n = tx.out.wrap_value(ln).call(tx, [var], {}).as_const()
        return [tx.out.wrap_value(gi).call(tx, [var, ConstVar(i)], {}) for i in range(n)]
    raise Unsupported(breaks.UNSUPPORTED_VALUE, f"iteration over a {cls.__name__}")


def truth_by_protocol(tx, var: Var, cls: type) -> bool:
    """``bool(obj)`` of a user object by Python's rule: its ``__bool__``, else whether its
    ``__len__`` is not 0 (a transformers cache), else true."""
    if not (hasattr(cls, "__bool__") or hasattr(cls, "__len__")):
        return True
    if inspect.isfunction(getattr(cls, "__bool__", None)):
        return var.call_method(tx, "__bool__", [], {}).truth(tx)
    if getattr(cls, "__bool__", None) is None and inspect.isfunction(getattr(cls, "__len__", None)):
        return var.call_method(tx, "__len__", [], {}).truth(tx)
    raise Unsupported(breaks.UNSUPPORTED_VALUE, f"truth value of {cls.__name__}")


def length_by_protocol(tx, var: Var, cls: type) -> int:
    ln = inspect.getattr_static(cls, "__len__", None)
    if inspect.isfunction(ln):
        return tx.out.wrap_value(ln).call(tx, [var], {}).as_const()
    raise Unsupported(breaks.UNSUPPORTED_VALUE, f"len() of a {cls.__name__}")


_is_record = is_record_type  # records.py


def _stateless_module(cls: type, args: list[Var], kwargs: dict[str, Var]) -> object | None:
    """A torch.nn module made in captured code from constants that holds no parameters,
    buffers or submodules (``loss_fct = CrossEntropyLoss()`` in HF models' forward):
    built now, while capturing, and called like any module (its settings are constants of
    this trace). Other modules made in captured code break the graph."""
    if not (cls.__module__ or "").startswith("torch.nn.modules."):
        return None
    if not all(a.is_const() for a in args) or not all(v.is_const() for v in kwargs.values()):
        return None
    from kiln_capture.variables.fresh_modules import build_keeping_rng

    module = build_keeping_rng(
        cls, [a.as_const() for a in args], {k: v.as_const() for k, v in kwargs.items()}
    )
    if module is None:
        return None  # the constructor's error: capture breaks and eager raises it
    tables = (module._parameters, module._buffers, module._modules)
    if any(v is not None for table in tables for v in table.values()):
        return None
    return module


_LRU_CACHE_WRAPPER = type(functools.lru_cache(None)(lambda: None))


def _holds_traced_tensor(v: Var) -> bool:
    from kiln_capture.variables.tensors import TensorVar

    return isinstance(v, TensorVar)


def _cached_call(tx, fn, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """A call of an ``lru_cache``d function on constants (and objects, keyed by identity
    as the cache keys them): run once now, while capturing. Its result for these arguments
    is the cache's from then on, so the compiled code uses it as a constant; what the
    first call did (transformers' ``logger.warning_once`` prints its warning) happens once,
    as in eager. Non-constant results and tensor arguments break the graph."""

    def value(v: Var) -> object:
        if v.is_const():
            return v.as_const()
        if isinstance(v, ObjectVar) and not isinstance(v.value, torch.Tensor):
            return v.value
        raise Unsupported(breaks.UNKNOWN_CALLABLE, "an lru_cache'd function on non-constants")

    wrapped = getattr(fn, "__wrapped__", None)
    if isinstance(wrapped, types.FunctionType) and any(
        _holds_traced_tensor(v) for v in (*args, *kwargs.values())
    ):
        # on tensors (keys by identity) the function itself runs, as under torch.compile:
        # a cached result would be a value computed at capture time
        return tx.out.wrap_value(wrapped).call(tx, args, kwargs)
    result = fn(*[value(a) for a in args], **{k: value(v) for k, v in kwargs.items()})
    if isinstance(result, types.ModuleType):  # torch.get_device_module(...)
        return tx.out.wrap_value(result)
    if not is_constant_value(result):
        raise Unsupported(
            breaks.UNKNOWN_CALLABLE, f"an lru_cache'd function returned a {type(result).__name__}"
        )
    return ConstVar(result)


class CopiedObjectVar(ObjectVar):
    """``copy.deepcopy(obj)`` of a plain Python object (a model config): a copy made while
    capturing, read and written in the trace like any object, private to it (see
    ``deepcopy_var``); generated code cannot hand it on, since eager code makes a new one
    on every call. Being private, it is written for real while capturing (what the trace
    reads from it afterwards follows from the guarded original)."""

    def setattr(self, tx, name: str, value: Var) -> None:
        from kiln_capture.variables.functions import _NO_VALUE, python_value

        real = python_value(value)
        if real is _NO_VALUE or isinstance(real, torch.Tensor):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"storing {value!r} on a copied object")
        setattr(self.value, name, real)

    def delattr(self, tx, name: str) -> None:
        delattr(self.value, name)

    def reconstruct(self, cg) -> str:
        raise Unsupported(
            breaks.UNSUPPORTED_VALUE,
            f"a copy of a {type(self.value).__name__} made in captured code leaving it",
        )


def deepcopy_var(tx, x: Var, memo: Var | None = None) -> Var:
    """``copy.deepcopy(x)``: containers of traced values are copied item by item;
    an object holding only plain Python data (a transformers config, deep-copied in
    ``DynamicCache.__init__`` through ``get_text_config``) is copied now, while capturing,
    and its whole state is guarded equal to what was copied (``snapshot == vars(obj)``,
    one C-level comparison); tensors and objects whose copy would not compare equal to
    them break the graph. A tensor that does not require grad is cloned in the graph
    (one tensor per copy: deepcopy keeps views of one storage sharing a copy, and the
    trace does not know which tensors share storage)."""
    if memo is not None and not (memo.is_const() and memo.as_const() is None):
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "copy.deepcopy with a memo")
    return _deepcopy(tx, x, {})


def _deepcopy(tx, x: Var, copied: dict[object, Var]) -> Var:
    from kiln_capture.variables.containers import DictVar, ListVar, SetVar
    from kiln_capture.variables.tensors import TensorVar

    if x.is_const():
        return x
    if isinstance(x, TensorVar) and type(x.meta) is torch.Tensor:
        if id(x) in copied:
            return copied[id(x)]
        m = x.meta
        dense = m.is_contiguous() or m.is_contiguous(memory_format=torch.channels_last)
        # a copy of the storage keeps a view's strides and offset; a clone of a dense
        # tensor at offset 0 has the same
        if copied.get("tensor") is not None or m.requires_grad or not dense or m.storage_offset():
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"copy.deepcopy of {x!r}")
        copied[id(x)] = copied["tensor"] = tx.out.tensor_op("call_function", torch.clone, [x], {})
        return copied[id(x)]
    if isinstance(x, ListVar | TupleVar) and type(x) in (ListVar, TupleVar):
        return type(x)([_deepcopy(tx, i, copied) for i in x.items])
    if type(x) is DictVar:
        return DictVar({k: _deepcopy(tx, v, copied) for k, v in x.items.items()}, cls=x.cls)
    if type(x) is SetVar:
        return SetVar(set(x.values), dict(x.members), x.kind)
    obj = getattr(x, "value", None)
    if type(x) in (ObjectVar, CopiedObjectVar) and obj is not None and hasattr(obj, "__dict__"):
        state = vars(obj)
        snapshot = copy.deepcopy(state)
        if _holds_tensor(snapshot) or not _equal(snapshot, state):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"copy.deepcopy of a {type(obj).__name__}")
        # a copy of a copy (Whisper copies its config, then get_text_config copies that)
        # needs no guard: what the first copy holds follows from its original's guard
        if type(x) is ObjectVar:
            g = tx.out.guards
            src = x.source.expr() if x.source is not None else g.const(obj)
            g.add(f"{g.const(snapshot)} == vars({src})", f"{src} holds what was copied at capture")
        clone = copy.deepcopy(obj)
        ref = tx.out.const_ref(clone)
        tx.out.freeze(ref)  # private: what it holds follows from the guard above
        return CopiedObjectVar(clone, ref)
    raise Unsupported(breaks.UNSUPPORTED_VALUE, f"copy.deepcopy of {x!r}")


def copy_var(tx, x: Var) -> Var:
    """``copy.copy(x)`` of a list, dict or set made or read in the trace (a new container
    holding the same items)."""
    from kiln_capture.variables.containers import DictVar, ListVar, SetVar

    if x.is_const():
        return x
    if type(x) is ListVar:
        return ListVar(list(x.items))
    if type(x) is DictVar:
        return DictVar(dict(x.items), cls=x.cls)
    if type(x) is SetVar:
        return SetVar(set(x.values), dict(x.members), x.kind)
    raise Unsupported(breaks.UNSUPPORTED_VALUE, f"copy.copy of {x!r}")


def _equal(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _holds_tensor(value: object, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth > 20:
        return True  # deeper than configs go: not plain data
    if isinstance(value, dict):
        return any(_holds_tensor(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds_tensor(v, depth + 1) for v in value)
    if hasattr(value, "__dict__") and not isinstance(value, type | types.ModuleType):
        return _holds_tensor(vars(value), depth + 1)
    return False


class PartialVar(Var):
    """``functools.partial(fn, *args, **kwargs)`` made in captured code: calling it calls
    ``fn`` with the stored arguments first (HF's gradient checkpointing wraps each layer's
    forward this way)."""

    def __init__(self, fn: Var, args: list[Var], kwargs: dict[str, Var]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __repr__(self) -> str:
        return f"Partial({self.fn!r})"

    def python_type(self) -> type:
        return functools.partial

    def children(self) -> list[Var]:
        return [self.fn, *self.args, *self.kwargs.values()]

    def call(self, tx, args, kwargs) -> Var:
        return self.fn.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})

    def getattr(self, tx, name: str) -> Var:
        if name == "func":
            return self.fn
        if name == "args":
            return TupleVar(list(self.args))
        if name == "keywords":
            return DictVar(dict(self.kwargs))
        if name == "__call__":
            return self
        # the rest are partial's own class attributes (a partial made here has no others:
        # setting one is not modeled): absent ones raise as eager's, present ones answer
        # hasattr and break where used
        if not hasattr(_PARTIAL_PROBE, name):
            raise AttributeError(name)
        value = getattr(_PARTIAL_PROBE, name)
        if name != "__dict__" and is_constant_value(value):
            return ConstVar(value)
        if name == "__class__":
            return tx.out.wrap_value(functools.partial)
        return _UnmodeledAttrVar(f"partial.{name}")

    def reconstruct(self, cg) -> str:
        items = [cg.rebuild(self.fn), *(cg.rebuild(a) for a in self.args)]
        items += [f"{k}={cg.rebuild(v)}" for k, v in self.kwargs.items()]
        return f"{cg.const(functools.partial)}({', '.join(items)})"


_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
_LOCK_METHODS = {"__enter__": True, "acquire": True, "__exit__": None, "release": None}


_CLASS_BOOKKEEPING = frozenset(
    {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__firstlineno__"}
    | {"__static_attributes__", "__annotations__"}
)


def _plain_dict_subclass(cls: type) -> bool:
    """A subclass of dict or OrderedDict that adds nothing (no method, no attribute)."""
    if cls in (dict, collections.OrderedDict) or not issubclass(cls, dict):
        return False
    base = collections.OrderedDict if issubclass(cls, collections.OrderedDict) else dict
    own = cls.__mro__[: cls.__mro__.index(base)]
    return all(set(vars(k)) <= _CLASS_BOOKKEEPING for k in own)


def _is_fromkeys(v: object) -> bool:
    owner = getattr(v, "__self__", None)
    return (
        getattr(v, "__name__", None) == "fromkeys"
        and owner in (dict, collections.OrderedDict, collections.defaultdict)
        and type(v).__name__ == "builtin_function_or_method"
    )


def _fromkeys(tx, cls: type, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """``dict.fromkeys(keys, value=None)`` (and OrderedDict's, defaultdict's: a default
    factory of None): every key maps to the one value."""
    from kiln_capture.variables.builtins import _items
    from kiln_capture.variables.containers import DefaultDictVar, key_of

    if not args or len(args) > 2 or set(kwargs) - {"value"}:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{cls.__name__}.fromkeys arguments")
    value = args[1] if len(args) > 1 else kwargs.get("value", ConstVar(None))
    items = {key_of(tx, k): value for k in _items(tx, args[0])}
    if cls is collections.defaultdict:
        return DefaultDictVar(ConstVar(None), items)
    return DictVar(items, cls=cls)


# what an instance of functools.partial has without attributes of its own
_PARTIAL_PROBE = functools.partial(print)


class _UnmodeledAttrVar(Var):
    """An attribute that exists (``hasattr`` is True) but that the trace does not model:
    any use of it breaks."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return self.what

    def call(self, tx, args, kwargs) -> Var:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self.what}()")


def construct(tx, cls: type, args: list[Var], kwargs: dict[str, Var]) -> Var:
    numpy = sys.modules.get("numpy")
    if numpy is not None and cls is numpy.dtype and len(args) == 1 and not kwargs:
        return ConstVar(numpy.dtype(args[0].as_const()))  # np.dtype("float")
    if numpy is not None and cls in (numpy.finfo, numpy.iinfo) and len(args) == 1 and not kwargs:
        return ConstVar(cls(args[0].as_const()))  # np.finfo(np.float32): a type's limits
    if cls is collections.Counter:
        return make_counter(tx, list(args), dict(kwargs))
    if cls is collections.deque:
        if len(args) > 2 or set(kwargs) - {"iterable", "maxlen"}:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "deque() arguments")
        iterable = args[0] if args else kwargs.get("iterable")
        maxlen = args[1] if len(args) > 1 else kwargs.get("maxlen")
        items = iterate(tx, iterable).unpack(tx) if iterable is not None else []
        return DequeVar(items, maxlen.as_const() if maxlen is not None else None)
    if _plain_dict_subclass(cls):  # class Config(OrderedDict): pass
        from kiln_capture.variables.builtins import BuiltinVar

        return DictVar(BuiltinVar(dict).call(tx, list(args), dict(kwargs)).items, cls=cls)
    if cls in (collections.OrderedDict, collections.defaultdict):
        from kiln_capture.variables.builtins import BuiltinVar
        from kiln_capture.variables.containers import DefaultDictVar

        if cls is collections.OrderedDict:
            made = BuiltinVar(dict).call(tx, list(args), dict(kwargs))
            return DictVar(made.items, cls=cls)
        factory = args[0] if args else ConstVar(None)
        made = BuiltinVar(dict).call(tx, list(args[1:]), dict(kwargs))
        return DefaultDictVar(factory, made.items)
    if cls is functools.partial and args:
        return PartialVar(args[0], list(args[1:]), dict(kwargs))
    if cls in NO_OP_GUARDS:  # no_dispatch(), _DisableFuncTorch(): see variables/rng.py
        return construct(tx, contextlib.nullcontext, [], {})
    if cls is torch.autograd.profiler.record_function:  # a profiling range: not a graph op
        return construct(tx, contextlib.nullcontext, [], {})
    if cls in GRAD_MODE_CLASSES:
        if cls in (torch.no_grad, torch.enable_grad) and len(args) == 1 and not kwargs:
            # ``torch.no_grad(fn)``: the class applied to a function decorates it
            return GradModeVar(tx, cls, []).call(tx, args, {})
        return GradModeVar(tx, cls, args)
    if issubclass(cls, torch.amp.autocast):
        return AutocastVar.construct(tx, cls, args, kwargs)
    if cls is torch.Size:
        return SizeVar(args[0].unpack(tx) if args else [])
    if _is_treespec_class(cls):
        return _construct_treespec(tx, cls, args, kwargs)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        names = cls._fields
        values = dict(zip(names, args))
        values.update(kwargs)
        defaults = getattr(cls, "_field_defaults", {})
        return NamedTupleVar(
            cls, [values[n] if n in values else tx.out.wrap_value(defaults[n]) for n in names]
        )
    if _is_record(cls):
        return make_record(tx, cls, list(args), dict(kwargs))
    if (
        all(a.is_const() for a in args)
        and all(v.is_const() for v in kwargs.values())
        and is_constant_value_type(cls)
    ):
        return tx.out.wrap_value(
            cls(*[a.as_const() for a in args], **{k: v.as_const() for k, v in kwargs.items()})
        )
    if issubclass(cls, torch.nn.Module):
        from kiln_capture.variables.fresh_modules import build_fresh_module

        fresh = build_fresh_module(tx, cls, args, kwargs)
        if fresh is not None:
            return fresh
        stateless = _stateless_module(cls, args, kwargs)
        if stateless is not None:
            return tx.out.wrap_value(stateless)
        raise Unsupported(
            breaks.UNKNOWN_CALLABLE, f"creating a module ({cls.__qualname__}) inside captured code"
        )
    if issubclass(cls, BaseException):
        from kiln_capture.variables.exceptions import make_exception

        return make_exception(tx, cls, args, kwargs)
    if (
        cls.__new__ is object.__new__
        and inspect.isfunction(getattr(cls, "__init__", None))
        and getattr(cls, "__dictoffset__", 0) != 0
    ):
        obj = NewObjectVar(cls)
        tx.out.wrap_value(cls.__init__).call(tx, [obj, *args], kwargs)
        return obj
    if (
        cls.__new__ is object.__new__
        and cls.__init__ is object.__init__
        and getattr(cls, "__dictoffset__", 0) != 0
        and not args
        and not kwargs
    ):  # a class with no __init__ of its own (a context manager, a namespace)
        return NewObjectVar(cls)
    if (
        _is_numpy_number_type(cls)
        and len(args) <= 1
        and not kwargs
        and all(a.is_const() for a in args)
    ):
        return ConstVar(cls(*(a.as_const() for a in args)))  # np.int64(3): a number
    raise Unsupported(breaks.UNKNOWN_CALLABLE, f"construction of {cls.__qualname__}")


def _is_numpy_number_type(cls: type) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and issubclass(cls, numpy.number | numpy.bool_)


def _is_treespec_class(cls: type) -> bool:
    pytree = sys.modules.get("torch.utils._pytree")
    return pytree is not None and isinstance(cls, type) and issubclass(cls, pytree.TreeSpec)


def _structure_value(v: Var) -> object:
    """The Python object a pytree spec's part stands for: a node type, a context (None, a
    class, a list of dict keys) or a child spec; _NO_VALUE when the trace computed it."""
    from kiln_capture.variables.containers import ListVar
    from kiln_capture.variables.functions import _NO_VALUE, python_value

    if type(v) in (ListVar, TupleVar):
        items = [_structure_value(i) for i in v.items]
        if any(i is _NO_VALUE for i in items):
            return _NO_VALUE
        return list(items) if type(v) is ListVar else tuple(items)
    value = python_value(v)
    if isinstance(value, torch.Tensor):
        return _NO_VALUE
    return value


def _construct_treespec(tx, cls: type, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """A pytree TreeSpec built in the trace (tree_flatten, tree_map): a frozen record of
    node types, contexts and child specs, all known while tracing. It is built for real
    and held as a constant, as the specs a frame reads are (its __post_init__ only counts
    nodes); a spec of a value the trace computed (a tensor as a context) is a break."""
    from kiln_capture.variables.functions import _NO_VALUE

    values = [_structure_value(a) for a in args]
    named = {k: _structure_value(v) for k, v in kwargs.items()}
    if any(v is _NO_VALUE for v in (*values, *named.values())):
        raise Unsupported(breaks.UNKNOWN_CALLABLE, f"construction of {cls.__qualname__}")
    return tx.out.wrap_value(cls(*values, **named))


def is_constant_value_type(cls: type) -> bool:
    return cls in (
        int,
        float,
        bool,
        str,
        complex,
        range,
        slice,
        torch.device,
        torch.dtype,
        torch.finfo,
        torch.iinfo,
        frozenset,
    )


# what code reads from a torch.distributed ProcessGroup: fixed when the group is made
_PROCESS_GROUP_READS = frozenset(
    {"group_name", "group_desc", "size", "rank", "name", "bound_device_id"}
)


# what functional collectives read from a DeviceMesh given as their group
_DEVICE_MESH_READS = frozenset({"ndim", "_dim_group_names", "mesh_dim_names", "device_type"})


def _is_device_mesh(value: object) -> bool:
    mesh = sys.modules.get("torch.distributed.device_mesh")
    return mesh is not None and isinstance(value, getattr(mesh, "DeviceMesh", ()))


def _is_process_group(value: object) -> bool:
    c10d = sys.modules.get("torch._C._distributed_c10d")
    return c10d is not None and isinstance(value, getattr(c10d, "ProcessGroup", ()))


def guarded_process_group(tx, var: Var) -> object | None:
    """The ProcessGroup ``var`` holds, its identity guarded (a group's name, size and rank
    are fixed when it is made: code reading them may use them as constants); None when
    ``var`` holds no ProcessGroup."""
    if not isinstance(var, ObjectVar) or not _is_process_group(var.value):
        return None
    if var.source is not None and not isinstance(var.source, ConstRef):
        tx.out.guards.id_is(var.source, var.value)
    return var.value


class NewObjectVar(Var):
    """An instance of a plain Python class created inside the trace."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.attrs: dict[str, Var] = {}

    def __repr__(self) -> str:
        return f"New({self.cls.__name__})"

    def python_type(self) -> type:
        return self.cls

    def children(self) -> list[Var]:
        return list(self.attrs.values())

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return tx.out.wrap_value(self.cls)
        found = lookup_class_attr(tx, self, self.cls, name, None)
        if found is not None:
            return found
        ga = inspect.getattr_static(self.cls, "__getattr__", None)
        if inspect.isfunction(ga):
            return tx.out.wrap_value(ga).call(tx, [self, ConstVar(name)], {})
        raise AttributeError(name)

    def setattr(self, tx, name, value) -> None:
        self.attrs[name] = value

    def delattr(self, tx, name: str) -> None:
        # ``del self.args`` (contextlib's _GeneratorContextManager.__enter__): an attribute
        # the trace set goes; one it did not is left to eager code
        if name not in self.attrs or inspect.getattr_static(self.cls, "__delattr__", None) not in (
            None,
            object.__delattr__,
        ):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"del {self!r}.{name}")
        del self.attrs[name]

    def unpack(self, tx) -> list[Var]:
        return unpack_by_protocol(tx, self, self.cls)

    def length(self, tx) -> int:
        return length_by_protocol(tx, self, self.cls)

    def truth(self, tx) -> bool:
        return truth_by_protocol(tx, self, self.cls)

    def getitem(self, tx, key):
        gi = inspect.getattr_static(self.cls, "__getitem__", None)
        if inspect.isfunction(gi):
            return tx.out.wrap_value(gi).call(tx, [self, key], {})
        return super().getitem(tx, key)

    def call_method(self, tx, name, args, kwargs):
        return self.getattr(tx, name).call(tx, args, kwargs)

    def reconstruct(self, cg) -> str:
        attrs = ", ".join(f"{k!r}: {cg.rebuild(v)}" for k, v in self.attrs.items())
        return f"__k_new_object({cg.const(self.cls)}, {{{attrs}}})"


class SuperVar(Var):
    def __init__(self, cls: type, obj: Var) -> None:
        self.cls = cls
        self.obj = obj

    def __repr__(self) -> str:
        return f"Super({self.cls.__name__})"

    def getattr(self, tx, name):
        value = getattr(self.obj, "value", None)
        owner = value if isinstance(value, type) else self.obj.python_type()
        mro = owner.__mro__
        if self.cls not in mro:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, f"super() of {self.cls.__name__} for a {owner.__name__}"
            )
        for klass in mro[mro.index(self.cls) + 1 :]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                from kiln_capture.variables.functions import BoundMethodVar

                if isinstance(attr, staticmethod):
                    return tx.out.wrap_value(attr.__func__)
                if isinstance(attr, classmethod):
                    return BoundMethodVar(
                        tx.out.wrap_value(attr.__func__), tx.out.wrap_value(self.obj.python_type())
                    )
                if inspect.isfunction(attr):
                    return BoundMethodVar(tx.out.wrap_value(attr), self.obj)
                if isinstance(attr, property):
                    return tx.out.wrap_value(attr.fget).call(tx, [self.obj], {})
                if klass is object and name == "__setattr__":
                    from kiln_capture.variables.functions import BoundMethodVar

                    return BoundMethodVar(tx.out.wrap_value(object.__setattr__), self.obj)
                if klass is object and name == "__init__":
                    return _NoopVar()
                if (
                    issubclass(klass, BaseException)
                    and klass.__module__ == "builtins"
                    and name == "__init__"
                ):
                    from kiln_capture.variables.exceptions import ExcVar, InitExceptionVar

                    if isinstance(self.obj, ExcVar):  # super().__init__(msg) of a user exception
                        return InitExceptionVar(self.obj)
                if (
                    klass is object
                    and name == "__getattribute__"
                    and isinstance(self.obj, ObjectVar)
                    and self.obj.source is not None
                ):
                    # a __getattribute__ override reading through the default one (HF's
                    # configs: super().__getattribute__("__dict__"))
                    return _DefaultGetattributeVar(self.obj)
                if klass in (dict, collections.OrderedDict) and name == "__setitem__":
                    if isinstance(self.obj, RecordVar):  # ModelOutput.__setitem__
                        return _RecordSetitemVar(attr, self.obj)
                if klass in (dict, collections.OrderedDict) and isinstance(self.obj, RecordVar):
                    if name == "__delitem__":  # ModelOutput.__post_init__
                        return _RecordDelitemVar(self.obj)
                    if name in _RECORD_DICT_READS:  # super().get(k), __contains__
                        return MethodCallVar(self.obj.entries_var(), name)
                if (
                    klass in (dict, list, tuple)
                    and name in _READ_ONLY_METHODS
                    and isinstance(self.obj, ObjectVar)
                ):
                    return ReadOnlyCMethodVar(attr, self.obj)
                raise Unsupported(
                    breaks.UNSUPPORTED_VALUE, f"super().{name} ({type(attr).__name__})"
                )
        raise AttributeError(name)


class _DefaultGetattributeVar(Var):
    """``object.__getattribute__`` bound to a real object: reads the attribute without the
    class's override (the value is guarded at its source like any attribute read)."""

    def __init__(self, obj: ObjectVar) -> None:
        self.obj = obj

    def call(self, tx, args, kwargs):
        if kwargs or len(args) != 1 or not args[0].is_const():
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "object.__getattribute__ on non-constants")
        name = args[0].as_const()
        real = self.obj.value
        try:
            value = object.__getattribute__(real, name)
        except AttributeError as e:
            # raised in the trace (getattr(obj, name, default) catches it; a frame that
            # does not, HF's config __getattribute__ called from eager code, raises it
            # after its graph), the attribute's absence guarded
            if not isinstance(getattr(real, "__dict__", None), dict) or hasattr(type(real), name):
                raise Unsupported(breaks.EXCEPTION, f"AttributeError: {e}") from None
            from kiln_capture.variables.exceptions import raised

            g, src = tx.out.guards, self.obj.source.expr()
            g.add(f"{g.const(name)} not in vars({src})", f"{src} has no attribute {name!r}")
            raise raised(AttributeError, *e.args) from None
        return self.obj._child(tx, value, name)


_READ_ONLY_METHODS = frozenset(
    {
        "get",
        "keys",
        "values",
        "items",
        "__getitem__",
        "__contains__",
        "__len__",
        "copy",
        "index",
        "count",
    }
)


_DICT_C_READS = frozenset(
    getattr(cls, name)
    for cls in (dict, collections.OrderedDict)
    for name in ("get", "__getitem__", "__contains__", "__len__")
)
_DICT_VIEWS = {
    name: (getattr(dict, name), getattr(collections.OrderedDict, name))
    for name in ("keys", "values", "items")
}


class _DictViewMethodVar(Var):
    """``keys()``, ``values()`` or ``items()`` of a dict subclass's instance that does not
    override them (transformers' ModelOutput, an OrderedDict of parameters): a list of its
    entries in its order (an OrderedDict's own), read through ``dict.__getitem__`` (not the
    class's own ``__getitem__``), with its keys guarded."""

    def __init__(self, obj: ObjectVar, name: str) -> None:
        self.obj = obj
        self.name = name

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self.name}() with arguments")
        from kiln_capture.sources import CallSource

        real, src, g = self.obj.value, self.obj.source, tx.out.guards
        # an OrderedDict keeps its own order (move_to_end), which dict.keys does not see
        ordered = isinstance(real, collections.OrderedDict)
        keys_of = collections.OrderedDict.keys if ordered else dict.keys
        keys = tuple(keys_of(real))
        if tx.out.guards_reads_in(src):
            e = src.expr()
            g.add(
                f"tuple({g.const(keys_of)}({e})) == {g.const(keys)}",
                f"keys of {e} are {keys!r}",
            )
        get = tx.out.const_ref(dict.__getitem__)
        keys_v = [tx.out.wrap_value(k) for k in keys]
        if self.name == "keys":
            return ListVar(keys_v)
        vals = [tx.out.wrap(dict.__getitem__(real, k), CallSource(get, src, (k,))) for k in keys]
        if self.name == "values":
            return ListVar(vals)
        return ListVar([TupleVar([k, v]) for k, v in zip(keys_v, vals)])


class ReadOnlyCMethodVar(Var):
    """A read-only C method of dict/list/tuple called on a real object (``super().get(k)``)."""

    def __init__(self, method, obj: ObjectVar) -> None:
        self.method = method
        self.obj = obj

    def call(self, tx, args, kwargs):
        if kwargs or not all(a.is_const() for a in args):
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, f"{self.method.__qualname__} on non-constants"
            )
        consts = tuple(a.as_const() for a in args)
        result = self.method(self.obj.value, *consts)
        if self.obj.source is None:
            return tx.out.wrap_value(result)
        from kiln_capture.sources import CallSource

        return tx.out.wrap(
            result, CallSource(tx.out.const_ref(self.method), self.obj.source, consts)
        )


class _NoopVar(Var):
    """``object.__init__`` reached through ``super().__init__()``."""

    def call(self, tx, args, kwargs):
        return ConstVar(None)
