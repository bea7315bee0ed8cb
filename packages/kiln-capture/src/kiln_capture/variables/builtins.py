"""Python builtins and operators: folded on constants, graph nodes on tensors."""

from __future__ import annotations

import builtins
import functools
import inspect
import itertools
import math
import operator
import sys

import torch

from kiln_capture import breaks
from kiln_capture.errors import Raised, Unsupported
from kiln_capture.variables import sizes
from kiln_capture.variables.base import Var
from kiln_capture.variables.constants import ConstVar, fold
from kiln_capture.variables.containers import (
    CounterVar,
    DictVar,
    DictViewVar,
    ListVar,
    NamedTupleVar,
    SequenceVar,
    SetVar,
    TupleVar,
    counter_binary,
    key_of,
    make_set,
    sort_items,
)
from kiln_capture.variables.exceptions import ExcVar, RaisingVar, attribute_error, raised
from kiln_capture.variables.generators import LazyIteratorVar, PullIteratorVar
from kiln_capture.variables.iterators import (
    DictIteratorVar,
    EnumerateVar,
    IteratorVar,
    ListIteratorVar,
    ListReverseIteratorVar,
    ZipVar,
    iterate,
)
from kiln_capture.variables.sizes import SymIntVar
from kiln_capture.variables.tensors import SizeVar, TensorVar

LIVE_ITERATORS = (ListIteratorVar, ListReverseIteratorVar, DictIteratorVar)

BINARY_OPS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
    "@": operator.matmul,
    "&": operator.and_,
    "|": operator.or_,
    "^": operator.xor,
    "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "@=": operator.imatmul,
    "&=": operator.iand,
    "|=": operator.ior,
    "^=": operator.ixor,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
}
COMPARE_OPS = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
}
_INPLACE_TO_PLAIN = sizes.INPLACE_TO_PLAIN


def binary(tx, fn, a: Var, b: Var) -> Var:
    """``fn(a, b)`` for an operator function (operator.add, operator.lt, ...)."""
    if isinstance(a, RaisingVar):  # a re-raising continuation's first step
        raise a.raised()
    if isinstance(a, TensorVar) or isinstance(b, TensorVar):
        if fn in _INPLACE_TO_PLAIN and isinstance(a, PickedTensorVar):
            raise a._written(f"operator {fn.__name__}")
        if fn in _INPLACE_TO_PLAIN and not isinstance(a, TensorVar):
            fn = _INPLACE_TO_PLAIN[fn]
        return tx.out.tensor_op("call_function", fn, [a, b], {})
    if isinstance(a, DictViewVar) or isinstance(b, DictViewVar):
        return _view_binary(tx, fn, a, b)
    if type(a).__name__ == "ArrayVar" or type(b).__name__ == "ArrayVar":
        from kiln_capture.variables.arrays import array_binary

        made = array_binary(tx, fn, a, b)
        if made is None:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"operator {fn.__name__} on arrays")
        return made
    if isinstance(a, CounterVar) or isinstance(b, CounterVar):
        counted = counter_binary(tx, fn, a, b)
        if counted is not None:
            return counted
    if isinstance(a, SymIntVar) or isinstance(b, SymIntVar):
        result = sizes.binary(tx, fn, a, b)
        if result is not None:
            return result
        # a size used where Python needs a concrete int (``[0] * t``, ``t & 1``)
        a, b = (ConstVar(v.as_const()) if isinstance(v, SymIntVar) else v for v in (a, b))
        return binary(tx, fn, a, b)
    if a.is_const() and b.is_const():
        return tx.out.wrap_value(fold(fn, a.as_const(), b.as_const()))
    plain = _INPLACE_TO_PLAIN.get(fn, fn)
    if plain in (operator.add, operator.eq, operator.ne):
        # a constant tuple with a shape holding symbolic sizes: ``(-1,) + x.shape[1:]``
        if isinstance(b, SizeVar | SequenceVar) and _const_tuple(a):
            a = TupleVar([ConstVar(v) for v in a.as_const()])
        elif isinstance(a, SizeVar | SequenceVar) and _const_tuple(b):
            b = TupleVar([ConstVar(v) for v in b.as_const()])
    if isinstance(a, ListVar) and fn is operator.iadd:
        a.call_method(tx, "extend", [b], {})
        return a
    if (
        isinstance(a, SequenceVar | SizeVar)
        and isinstance(b, SequenceVar | SizeVar)
        and plain is operator.add
    ):
        items = a.unpack(tx) + b.unpack(tx)
        return (
            ListVar(items)
            if isinstance(a, ListVar)
            else (SizeVar(items) if isinstance(a, SizeVar) else TupleVar(items))
        )
    if isinstance(b, SequenceVar) and plain is operator.mul and a.is_const():
        a, b = b, a  # 4 * [x]: as [x] * 4
    if isinstance(a, SequenceVar) and plain is operator.mul and b.is_const():
        return (
            type(a)(a.items * b.as_const())
            if not isinstance(a, NamedTupleVar)
            else TupleVar(a.items * b.as_const())
        )
    if (
        plain in (operator.eq, operator.ne)
        and isinstance(a, SequenceVar | SizeVar)
        and isinstance(b, SequenceVar | SizeVar)
    ):
        la, lb = a.unpack(tx), b.unpack(tx)
        same = len(la) == len(lb) and all(
            binary(tx, operator.eq, x, y).truth(tx) for x, y in zip(la, lb)
        )
        return ConstVar(same if plain is operator.eq else not same)
    if (
        plain in (operator.eq, operator.ne)
        and a.python_type() is not b.python_type()
        and (a.is_const() or b.is_const())
    ):
        # e.g. `module == None`, `obj != "x"`: objects of different types compare unequal
        if type(a).__name__ != "ObjectVar" and type(b).__name__ != "ObjectVar":
            return ConstVar(plain is operator.ne)
    if isinstance(a, DictVar) and isinstance(b, DictVar) and plain is operator.or_:
        return DictVar({**a.items, **b.items}, cls=a.cls)
    if isinstance(a, SetVar) and isinstance(b, SetVar) and plain in _SET_OPERATORS:
        # members the trace computed (tensors) too; s |= t changes s
        name = _SET_OPERATORS[plain]
        if fn is not plain:
            a.call_method(tx, f"{name}_update" if name != "union" else "update", [b], {})
            return a
        return a.call_method(tx, name, [b], {})
    if plain in (operator.eq, operator.ne) and _default_eq_module(a) and _default_eq_module(b):
        # nn.Modules compare by identity (``layer == self.layer0``), as object.__eq__ does
        return ConstVar(identical(tx, a, b) == (plain is operator.eq))
    dunder = getattr(a, "dunder_call", None)
    if dunder is not None:
        return dunder(tx, fn, b)
    compared = _compare_made_objects(tx, fn, a, b)
    if compared is not None:
        return compared
    raise Unsupported(breaks.UNSUPPORTED_VALUE, f"operator {fn.__name__} on {a!r} and {b!r}")


def _default_eq_module(v: Var) -> bool:
    return type(v).__name__ == "ModuleVar" and type(v.value).__eq__ is object.__eq__


_SET_OPERATORS = {
    operator.or_: "union",
    operator.and_: "intersection",
    operator.sub: "difference",
    operator.xor: "symmetric_difference",
}


def _view_binary(tx, fn, a: Var, b: Var) -> Var:
    """An operator on a dict view (``d.keys() == {...}``, ``d.items() & other``): on
    real views equal to the trace's (keys, items of constants) and the other operand's
    constant value, as Python computes it. A values view is not set-like: ``==`` is
    identity."""
    real = []
    for v in (a, b):
        if isinstance(v, DictViewVar):
            r = v.set_like()
            if r is None:  # a values view
                if fn in (operator.eq, operator.ne):
                    return ConstVar(identical(tx, a, b) == (fn is operator.eq))
                raise Unsupported(breaks.UNSUPPORTED_VALUE, f"operator {fn.__name__} on d.values()")
            real.append(r)
        elif v.is_const():
            real.append(v.as_const())
        elif isinstance(v, ListVar) and all(i.is_const() for i in v.items):
            real.append([i.as_const() for i in v.items])  # ``d.keys() | [...]``
        else:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, f"operator {fn.__name__} on {a!r} and {b!r}"
            )
    result = fold(fn, *real)
    if isinstance(result, set | frozenset):
        return SetVar(result, kind=type(result))
    return tx.out.wrap_value(result)


# comparison -> (its method, the reflected one)
_COMPARISONS = {
    operator.eq: ("__eq__", "__eq__"),
    operator.ne: ("__ne__", "__ne__"),
    operator.lt: ("__lt__", "__gt__"),
    operator.le: ("__le__", "__ge__"),
    operator.gt: ("__gt__", "__lt__"),
    operator.ge: ("__ge__", "__le__"),
}


def _compare_made_objects(tx, fn, a: Var, b: Var) -> Var | None:
    """A comparison where an operand is an instance made in the trace (a dataclass's
    generated ``__eq__``...): its class's Python method, then the reflected one; with
    neither, ``==``/``!=`` compare identity as ``object``'s do. None when no operand is
    such an instance."""
    names = _COMPARISONS.get(fn)
    made = ("NewObjectVar", "ExcVar")
    if names is None or not (type(a).__name__ in made or type(b).__name__ in made):
        return None
    for obj, other, name in ((a, b, names[0]), (b, a, names[1])):
        if type(obj).__name__ not in made:
            continue
        method = inspect.getattr_static(obj.python_type(), name, None)
        if fn is operator.ne and not inspect.isfunction(method):
            eq = _compare_made_objects(tx, operator.eq, obj, other)  # object.__ne__
            if eq is not None and not (eq.is_const() and eq.as_const() is NotImplemented):
                return ConstVar(not eq.truth(tx))
            continue
        if inspect.isfunction(method):
            result = tx.out.wrap_value(method).call(tx, [obj, other], {})
            if not (result.is_const() and result.as_const() is NotImplemented):
                return result
    if fn in (operator.eq, operator.ne):
        return ConstVar(identical(tx, a, b) == (fn is operator.eq))
    raise raised(
        TypeError,
        f"'{_OP_SYMBOLS[fn]}' not supported between instances of "
        f"'{a.python_type().__name__}' and '{b.python_type().__name__}'",
    )


_OP_SYMBOLS = {operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">="}


def _const_tuple(v: Var) -> bool:
    return isinstance(v, ConstVar) and type(v.value) is tuple


def identical(tx, a: Var, b: Var) -> bool:
    """The ``is`` operator."""
    if a is b:
        return True
    if a.is_const() and b.is_const():
        return a.as_const() is b.as_const()
    if a.is_const() or b.is_const():
        return False  # a constant is never the same object as a tensor/container/...
    if isinstance(a, TensorVar) and isinstance(b, TensorVar):
        # an in-place op (x.add_(1)) or a conversion that changes nothing (x.to(x.dtype))
        # returns its input, and does so on the meta device too: the same meta tensor
        return a.meta is b.meta and a.device == b.device
    obj_a, obj_b = getattr(a, "value", None), getattr(b, "value", None)
    if obj_a is not None and obj_b is not None:
        return obj_a is obj_b
    return False


def contains(tx, item: Var, container: Var) -> bool:
    if isinstance(container, RaisingVar):  # a re-raising continuation's first step
        raise container.raised()
    if isinstance(container, DictVar):
        return key_of(tx, item) in container.items
    if isinstance(container, SetVar):
        return container.contains(tx, item)
    if isinstance(container, SequenceVar | SizeVar):
        return any(
            identical(tx, item, x) or binary(tx, operator.eq, item, x).truth(tx)
            for x in container.unpack(tx)
        )
    if container.is_const():
        return item.as_const() in container.as_const()
    if isinstance(getattr(container, "value", None), frozenset):
        # a frozenset of classes (3.12's dataclasses._ATOMIC_TYPES): immutable
        from kiln_capture.variables.functions import _NO_VALUE, python_value

        known = python_value(item)
        if known is not _NO_VALUE:
            return known in container.value
    if hasattr(container, "contains"):
        return container.contains(tx, item)
    raise Unsupported(breaks.UNSUPPORTED_VALUE, f"`in` on {container!r}")


def contains_value(tx, item: Var, container: Var, negate: bool = False) -> Var:
    """``item in container`` as a value: a graph truth value where the answer is a
    one-element tensor's ``==`` (``1 in [t]``: eager's ``bool(t == 1)``), kept a graph value
    (``(t == 1).item()``) until Python needs it (a branch breaks there, a return value
    is read from the graph's outputs); a constant otherwise."""
    if isinstance(container, SequenceVar) and not isinstance(item, TensorVar):
        found = _tensor_contains(tx, item, container.unpack(tx))
        if found is not None:
            if negate:
                found = unary(tx, operator.not_, found)
            return found
    return ConstVar(contains(tx, item, container) != negate)


def _tensor_contains(tx, item: Var, elements: list[Var]) -> Var | None:
    """The graph's truth value of ``item in elements`` where some element is a tensor;
    None where none is (or the answer is known without the data)."""
    if not any(isinstance(x, TensorVar) for x in elements):
        return None
    hits: list[Var] = []
    for x in elements:
        if identical(tx, item, x):
            return ConstVar(True)
        eq = binary(tx, operator.eq, x, item)
        if not isinstance(eq, TensorVar):
            if eq.truth(tx):
                return ConstVar(True)
            continue
        numel = eq.meta.numel()
        if not isinstance(numel, int) or numel != 1:
            eq.truth(tx)  # breaks: eager's bool() of it raises
        hits.append(eq)
    if not hits:
        return ConstVar(False)
    acc = hits[0]
    for h in hits[1:]:
        acc = tx.out.tensor_op("call_function", torch.logical_or, [acc, h], {})
    return tx.out.tensor_op("call_method", "item", [acc], {})


def unary(tx, fn, a: Var) -> Var:
    if isinstance(a, TensorVar):
        return tx.out.tensor_op("call_function", fn, [a], {})
    if isinstance(a, SymIntVar):
        return sizes.unary(tx, fn, a)
    if fn is operator.not_:
        return ConstVar(not a.truth(tx))
    if isinstance(a, CounterVar):  # +c, -c: the positive / negated counts
        return CounterVar({k: ConstVar(n) for k, n in fold(fn, a.counts()).items()})
    return tx.out.wrap_value(fold(fn, a.as_const()))


def isinstance_check(tx, obj: Var, cls: Var) -> bool:
    classes = cls.as_const()
    if isinstance(obj, PickedTensorVar) and obj.may_be_a_number():
        raise obj._which("isinstance()")
    t = obj.python_type()
    return issubclass(t, classes)


class BuiltinVar(Var):
    """A builtin function (len, isinstance, range...) or one of math/operator."""

    def __init__(self, fn, source=None) -> None:
        self.fn = fn
        self.source = source

    def __repr__(self) -> str:
        return f"Builtin({getattr(self.fn, '__name__', self.fn)})"

    def python_type(self) -> type:
        return type(self.fn)

    def as_const(self) -> object:
        return self.fn

    def getattr(self, tx, name: str) -> Var:
        if not hasattr(self.fn, name):  # itertools.chain.from_iterable, int.from_bytes...
            raise AttributeError(name)
        return tx.out.wrap_value(getattr(self.fn, name))

    def getitem(self, tx, key: Var) -> Var:
        if isinstance(self.fn, type) and key.is_const():  # list[Tensor] in a cast()
            return tx.out.wrap_value(self.fn[key.as_const()])
        if isinstance(self.fn, type) and isinstance(key, BuiltinVar) and isinstance(key.fn, type):
            return tx.out.wrap_value(self.fn[key.fn])  # list[int] (a functional collective's cast)
        return super().getitem(tx, key)

    def call(self, tx, args: list[Var], kwargs: dict[str, Var]) -> Var:
        fn = self.fn
        handler = _HANDLERS.get(fn)
        if handler is not None:
            return handler(tx, *args, **kwargs)
        if fn in _OPERATOR_BINARY and len(args) == 2:
            return binary(tx, fn, args[0], args[1])
        if (
            fn in (operator.neg, operator.pos, operator.invert, operator.not_, abs)
            and len(args) == 1
        ):
            return unary(tx, fn, args[0])
        if fn in (str, repr) and len(args) == 1 and isinstance(args[0], ExcVar):
            return args[0].call_method(tx, f"__{fn.__name__}__", [], {})
        if fn in (str, repr) and len(args) == 1 and not kwargs:
            text = _object_text(tx, fn, args[0])
            if text is not None:
                return text
        if fn is operator.getitem:
            return args[0].getitem(tx, args[1])
        if fn is operator.setitem:
            args[0].setitem(tx, args[1], args[2])
            return ConstVar(None)
        if any(isinstance(a, SymIntVar) for a in [*args, *kwargs.values()]):
            # int(t), math.ceil(t / 2), operator.index(t), ...: a concrete value, guarded
            args = [ConstVar(a.as_const()) if isinstance(a, SymIntVar) else a for a in args]
            kwargs = {
                k: ConstVar(v.as_const()) if isinstance(v, SymIntVar) else v
                for k, v in kwargs.items()
            }
        if (
            all(a.is_const() for a in args)
            and all(v.is_const() for v in kwargs.values())
            and fn not in _IMPURE
        ):
            if fn is id or fn is hash:  # per process (frame_store.py keeps no such capture)
                from kiln_capture.frame_store import note_process_specific, stable_hash

                if fn is id or not all(stable_hash(a.as_const()) for a in args):
                    note_process_specific(tx.out, f"{fn.__name__}() of an object")
            return tx.out.wrap_value(
                fold(
                    lambda: fn(
                        *[a.as_const() for a in args],
                        **{k: v.as_const() for k, v in kwargs.items()},
                    )
                )
            )
        if fn in (str, repr) and len(args) == 1 and not kwargs:
            from kiln_capture.variables.functions import python_value

            cls = python_value(args[0])
            if isinstance(cls, type):  # str(type(x)): "<class 'torch.Tensor'>"
                return ConstVar(fn(cls))
        if any(isinstance(a, TensorVar) for a in args):
            if fn in (int, float) and len(args) == 1 and not kwargs:
                # float(t) of a one-element float tensor is t.item(): a graph value (tensors.py)
                return args[0].call_method(tx, f"__{fn.__name__}__", [], {})
            if getattr(fn, "__module__", None) == "math" or fn in (
                int,
                float,
                bool,
                complex,
                round,
            ):
                raise Unsupported(breaks.TENSOR_TO_PYTHON, f"{fn.__name__}() of a tensor")
        if fn is print:
            raise Unsupported(breaks.PRINT, "print()")
        if fn in (operator.is_, operator.is_not) and len(args) == 2 and not kwargs:
            return ConstVar(identical(tx, *args) == (fn is operator.is_))
        raise Unsupported(
            breaks.UNKNOWN_CALLABLE, f"builtin {getattr(fn, '__name__', fn)} on these arguments"
        )


def _object_text(tx, fn, v: Var) -> Var | None:
    """``str(v)``/``repr(v)`` of a plain object (made in the trace, or read from the frame):
    its class's Python ``__str__``/``__repr__`` traced (``object.__str__`` is ``repr``), or
    ``object.__repr__``'s "<module.Class object at 0x...>" (``AddressedReprVar``); None for
    other values."""
    from kiln_capture.variables.objects import NewObjectVar, ObjectVar

    if not isinstance(v, NewObjectVar | ObjectVar) or (
        v.source is None and isinstance(v, ObjectVar)
    ):
        return None
    cls = v.python_type()
    if not isinstance(cls, type) or type(cls) is not type or issubclass(cls, BaseException):
        return None
    method = inspect.getattr_static(cls, "__str__", None) if fn is str else object.__str__
    if method is object.__str__:
        method = inspect.getattr_static(cls, "__repr__", None)
    if method is object.__repr__:
        return AddressedReprVar(v)
    if not inspect.isfunction(method) or not isinstance(v, NewObjectVar):
        return None
    text = tx.out.wrap_value(method).call(tx, [v], {})
    if not (text.is_const() and type(text.as_const()) is str):
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{fn.__name__}() of {v!r} returned {text!r}")
    return text


class AddressedReprVar(Var):
    """``str(obj)`` of an object with ``object``'s ``__repr__``: its text holds the
    object's address, known only when the object exists, so the generated code calls
    ``repr`` on the object it rebuilds (``object.__str__`` is ``repr``). The text itself
    is no value the trace can read: anything done with it breaks the graph."""

    def __init__(self, obj: Var) -> None:
        self.obj = obj

    def __repr__(self) -> str:
        return f"Repr({self.obj!r})"

    def python_type(self) -> type:
        return str

    def children(self) -> list[Var]:
        return [self.obj]

    def getattr(self, tx, name: str) -> Var:
        raise Unsupported(
            breaks.UNSUPPORTED_VALUE, f"str.{name} of {self!r} (its address is known at run time)"
        )

    def reconstruct(self, cg) -> str:
        return f"{cg.const(repr)}({cg.rebuild(self.obj)})"


_OPERATOR_BINARY = frozenset(BINARY_OPS.values()) | frozenset(COMPARE_OPS.values())
_IMPURE = frozenset(
    {print, input, open, id, hash, exec, eval, setattr, delattr, globals, locals, vars, iter, next}
)


def _len(tx, x: Var) -> Var:
    if isinstance(x, TensorVar):
        if x.meta.dim() == 0:
            raise Unsupported(breaks.EXCEPTION, "len() of a 0-d tensor")
        return tx.out.size_of(x, "size", 0)
    if isinstance(x, SequenceVar | SizeVar | DictVar):
        return ConstVar(len(x.unpack(tx)))
    if x.is_const():
        return ConstVar(len(x.as_const()))
    if hasattr(x, "length"):
        return ConstVar(x.length(tx))
    raise Unsupported(breaks.UNSUPPORTED_VALUE, f"len() of {x!r}")


def _isinstance(tx, obj, cls) -> Var:
    return ConstVar(isinstance_check(tx, obj, cls))


def _issubclass(tx, a, b) -> Var:
    return ConstVar(issubclass(a.as_const(), b.as_const()))


def _getattr(tx, obj, name, *default) -> Var:
    try:
        return obj.getattr(tx, name.as_const())
    except AttributeError:
        if default:
            return default[0]
        raise attribute_error(obj, name.as_const()) from None
    except Raised as e:  # a property or __getattr__ of the trace raised it
        if default and issubclass(e.exc.python_type(), AttributeError):
            return default[0]
        raise


def _hasattr(tx, obj, name) -> Var:
    try:
        obj.getattr(tx, name.as_const())
        return ConstVar(True)
    except AttributeError:
        return ConstVar(False)
    except Raised as e:
        if issubclass(e.exc.python_type(), AttributeError):
            return ConstVar(False)
        raise


def _setattr(tx, obj, name, value) -> Var:
    obj.setattr(tx, name.as_const(), value)
    return ConstVar(None)


def _delattr(tx, obj, name) -> Var:
    method = getattr(obj, "delattr", None)
    if method is None:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"delattr on {obj!r}")
    method(tx, name.as_const())
    return ConstVar(None)


def _range(tx, *args) -> Var:
    return ConstVar(range(*[a.as_const() for a in args]))


def _items(tx, x: Var) -> list[Var]:
    if isinstance(x, IteratorVar):
        return x.unpack(tx)
    return x.unpack(tx)


def _reads_a_generator(iters: list[IteratorVar]) -> bool:
    return any(isinstance(s, LazyIteratorVar) and not s.drained for s in iters)


def _enumerate(tx, it, start=None) -> Var:
    it = _as_iter(tx, it)
    if not _reads_a_generator([it]):  # read on demand, rebuilt as a real enumerate
        return EnumerateVar(it, start.as_const() if start is not None else 0)
    n = itertools.count(start.as_const() if start is not None else 0)

    def step() -> Var | None:
        v = it.next()
        return None if v is None else TupleVar([ConstVar(next(n)), v])

    return _iterate("enumerate", step, [it])


def _zip(tx, *its, strict=None) -> Var:
    """Rows are read as CPython reads them: one item of each in turn, stopping at the
    first exhausted one (so an endless generator zipped with a list ends)."""
    iters = [_as_iter(tx, i) for i in its]
    if not _reads_a_generator(iters) and not (strict is not None and strict.truth(tx)):
        return ZipVar(iters)  # read on demand, rebuilt as a real zip

    def step() -> Var | None:
        row = _next_row(iters)
        return TupleVar(row) if row else None

    return _iterate("zip", step, iters)


def _next_row(iters: list[IteratorVar]) -> list[Var] | None:
    """One item of each iterator in turn; None once one is exhausted."""
    row = []
    for it in iters:
        v = it.next()
        if v is None:
            return None
        row.append(v)
    return row


def _reversed(tx, it) -> Var:
    if type(it) is ListVar:  # live, as CPython's list_reverseiterator
        return ListReverseIteratorVar(it)
    return IteratorVar(list(reversed(_items(tx, it))))


def _map(tx, fn, *its) -> Var:
    iters = [_as_iter(tx, i) for i in its]

    def step() -> Var | None:
        row = _next_row(iters)
        return None if row is None else fn.call(tx, row, {})

    return _remade(_iterate("map", step, iters), map, fn)


def _filter(tx, fn, it) -> Var:
    it = _as_iter(tx, it)

    def step() -> Var | None:
        while (v := it.next()) is not None:
            keep = v if fn.is_const() and fn.as_const() is None else fn.call(tx, [v], {})
            if keep.truth(tx):
                return v
        return None

    return _remade(_iterate("filter", step, [it]), filter, fn)


def _remade(it: IteratorVar, builtin, fn: Var) -> IteratorVar:
    if isinstance(it, PullIteratorVar):
        it.remake = (builtin, fn)
    return it


def _as_iter(tx, x: Var) -> IteratorVar:
    return iterate(tx, x)


def _iterate(name: str, step, sources: list[IteratorVar]) -> IteratorVar:
    """An iterator of ``step()``'s items: read on demand when a source is (a generator,
    ``itertools.count``), else all now (an iterator over known items)."""
    if any(
        isinstance(s, LazyIteratorVar) and not s.drained or isinstance(s, LIVE_ITERATORS)
        for s in sources
    ):  # read on demand: a generator, or a list or dict the loop body may change
        return PullIteratorVar(name, step, sources)
    items = []
    while (v := step()) is not None:
        items.append(v)
    return IteratorVar(items)


def _islice(tx, it, *bounds) -> Var:
    it = _as_iter(tx, it)
    bounds_ = slice(*[b.as_const() for b in bounds])
    start, stop, stride = bounds_.start or 0, bounds_.stop, bounds_.step or 1
    if stop is None:
        stop = sys.maxsize
    pos = [0]  # items read so far
    wanted = iter(range(start, stop, stride))

    def step() -> Var | None:
        target = next(wanted, None)
        if target is None:
            return None
        v = None
        while pos[0] <= target:
            v = it.next()
            if v is None:
                return None
            pos[0] += 1
        return v

    return _iterate("islice", step, [it])


def _count(tx, start=None, stride=None) -> Var:
    n = itertools.count(
        start.as_const() if start is not None else 0, stride.as_const() if stride else 1
    )
    return PullIteratorVar("count", lambda: ConstVar(next(n)), [])


def _chain(tx, *its) -> Var:
    return IteratorVar([v for i in its for v in _items(tx, i)])


def _chain_from_iterable(tx, its) -> Var:
    return _chain(tx, *_items(tx, its))


def _combinatoric(fn):
    """itertools.product/permutations/combinations/...: the index tuples ``fn`` makes
    over the items' positions, mapped back to the items."""

    def handler(tx, *args, **kwargs):
        kw = {k: v.as_const() for k, v in kwargs.items()}
        if fn is itertools.product:
            pools = [_items(tx, a) for a in args] * kw.get("repeat", 1)
            rows = itertools.product(*[range(len(p)) for p in pools])
            return IteratorVar([TupleVar([p[i] for p, i in zip(pools, t)]) for t in rows])
        pool = _items(tx, args[0])
        rows = fn(range(len(pool)), *[a.as_const() for a in args[1:]], **kw)
        return IteratorVar([TupleVar([pool[i] for i in t]) for t in rows])

    return handler


def _accumulate(tx, it, func=None, initial=None) -> Var:
    items = _items(tx, it)
    acc = [] if initial is None else [initial]
    for v in items:
        if not acc:
            acc.append(v)
            continue
        prev = acc[-1]
        acc.append(
            binary(tx, operator.add, prev, v)
            if func is None or (func.is_const() and func.as_const() is None)
            else func.call(tx, [prev, v], {})
        )
    return IteratorVar(acc)


def _list(tx, it=None) -> Var:
    return ListVar(_items(tx, it) if it is not None else [])


def _set(kind: type):
    def made(tx, it=None) -> Var:
        if isinstance(it, SetVar):  # a copy: the same members (tensors too), any order
            return SetVar(it.values, it.members, kind)
        return make_set(tx, _items(tx, it) if it is not None else [], kind)

    return made


def _tuple(tx, it=None) -> Var:
    return TupleVar(_items(tx, it) if it is not None else [])


def _dict(tx, it=None, **kwargs) -> Var:
    items: dict = {}
    if isinstance(it, DictVar):
        items.update(it.items)
    elif it is not None and _is_mapping(it):
        # CPython's dict(mapping): it[k] for k in mapping.keys() (a MutableMapping
        # subclass of the user's), not the pairs of its iteration
        for k in _items(tx, it.call_method(tx, "keys", [], {})):
            items[key_of(tx, k)] = it.call_method(tx, "__getitem__", [k], {})
    elif it is not None:
        for pair in _items(tx, it):
            k, v = pair.unpack(tx)
            items[key_of(tx, k)] = v
    items.update(kwargs)
    return DictVar(items)


def _is_mapping(v: Var) -> bool:
    """Whether ``dict(v)`` reads ``v`` as a mapping: its class has ``keys``."""
    try:
        return hasattr(v.python_type(), "keys")
    except Unsupported:
        return False


def _iter(tx, it) -> Var:
    return iterate(tx, it)


def _next(tx, it, *default) -> Var:
    if not isinstance(it, IteratorVar):
        raise Unsupported(breaks.UNKNOWN_CALLABLE, f"next() of {it!r}")
    v = it.next()
    if v is None:
        if default:
            return default[0]
        raise raised(StopIteration)
    return v


def _minmax(fn):
    def handler(tx, *args, **kwargs):
        items = _items(tx, args[0]) if len(args) == 1 else list(args)
        if all(i.is_const() for i in items) and not kwargs:
            return tx.out.wrap_value(fold(fn, [i.as_const() for i in items]))
        if not kwargs and any(isinstance(i, SymIntVar) for i in items):
            found = sizes.min_max(tx, fn, items)
            if found is not None:
                return found
        if len(items) == 1 and not kwargs:
            return items[0]  # one item: returned as it is, nothing compared
        if any(isinstance(i, TensorVar) for i in items) and not kwargs:
            return _tensor_minmax(tx, fn, items)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{fn.__name__}() of non-constants")

    return handler


class PickedTensorVar(TensorVar):
    """``max(a, b)`` / ``min(a, b)`` with a one-element tensor among the items.

    Eager compares with ``bool(b > a)`` and returns one of the items itself, so which one
    (a tensor, or the number in ``max(t, 0)``) is known only from the values. In the graph
    the pair is computed as a tensor, as torch.compile does: ``torch.clamp`` (a tensor and a
    number) or ``torch.maximum``/``torch.minimum`` (two tensors), equal in value. Where the
    value leaves the graph (returned, a live local at a break, stored in an object) it is
    ``max(...)`` of the items' real values, run by the generated code: eager's own answer.
    Writing into it in place would write into whichever item eager picked: a break.
    """

    def __init__(self, made: TensorVar, fn, items: list[Var]) -> None:
        super().__init__(made.node, made.meta, made.device, cls=made.cls)
        self.picked_by = fn
        self.items = items

    def children(self) -> list[Var]:
        return list(self.items)

    def reconstruct(self, cg) -> str:
        return f"{self.picked_by.__name__}({', '.join(cg.rebuild(i) for i in self.items)})"

    def _written(self, what: str) -> Unsupported:
        return Unsupported(
            breaks.TENSOR_BRANCH,
            f"{what} on the result of {self.picked_by.__name__}() of tensors: eager writes "
            f"into the item it picked, known only from the values (write into a clone)",
        )

    def _which(self, what: str) -> Unsupported:
        return Unsupported(
            breaks.TENSOR_BRANCH,
            f"{what} of the result of {self.picked_by.__name__}() of tensors: eager's result "
            f"is one of the items itself (a number or a tensor), known only from the values "
            f"(torch.maximum/torch.minimum/torch.clamp give a tensor)",
        )

    def getattr(self, tx, name: str) -> Var:
        if name.endswith("_") and not name.startswith("_"):
            raise self._written(f"in-place {name}()")
        if self.may_be_a_number():
            raise self._which(f".{name}")
        return super().getattr(tx, name)

    def may_be_a_number(self) -> bool:
        """Whether eager's answer may be one of the numbers (``max(t, 0)``)."""
        return any(
            not isinstance(i, TensorVar) or (isinstance(i, PickedTensorVar) and i.may_be_a_number())
            for i in self.items
        )

    def setitem(self, tx, key: Var, value: Var) -> None:
        raise self._written("item assignment")


def _tensor_minmax(tx, fn, items: list[Var]) -> Var:
    """``max(t, 0)``, ``min(a, b)`` with one-element tensors: a PickedTensorVar. Tensors of
    more than one element keep the break (eager's ``bool()`` of them raises)."""
    for i in items:
        if isinstance(i, TensorVar):
            numel = i.meta.numel()
            if not isinstance(numel, int) or numel != 1:
                raise Unsupported(
                    breaks.TENSOR_BRANCH,
                    f"{fn.__name__}() of a tensor of {numel} elements: eager compares "
                    f"them with bool(), which needs one element (use torch.maximum/"
                    f"torch.minimum/torch.clamp)",
                )
        elif not (
            isinstance(i, SymIntVar) or i.is_const() and isinstance(i.as_const(), int | float)
        ):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{fn.__name__}() of {i!r} and tensors")
    both = torch.maximum if fn is max else torch.minimum
    bound = "min" if fn is max else "max"
    acc = items[0]
    for item in items[1:]:
        if isinstance(acc, TensorVar) and isinstance(item, TensorVar):
            made = tx.out.tensor_op("call_function", both, [acc, item], {})
        elif isinstance(acc, TensorVar) or isinstance(item, TensorVar):
            t, n = (acc, item) if isinstance(acc, TensorVar) else (item, acc)
            made = tx.out.tensor_op("call_function", torch.clamp, [t], {bound: n})
        else:
            acc = _minmax(fn)(tx, acc, item)
            continue
        acc = PickedTensorVar(made, fn, [acc, item])
    return acc


def _sum(tx, it, start=None) -> Var:
    acc = start if start is not None else ConstVar(0)
    for v in _items(tx, it):
        acc = binary(tx, operator.add, acc, v)
    return acc


def _any_all(fn):
    def handler(tx, it):
        return ConstVar(fn(v.truth(tx) for v in _items(tx, it)))

    return handler


def _bool(tx, x=None) -> Var:
    return ConstVar(x.truth(tx) if x is not None else False)


def _type(tx, x) -> Var:
    return tx.out.wrap_value(x.python_type())


def _callable(tx, x) -> Var:
    if x.is_const():
        return ConstVar(callable(x.as_const()))
    # an instance is callable when its class defines __call__ (every Var has a ``call``
    # method and every class is callable, so neither says anything)
    return ConstVar(any("__call__" in vars(k) for k in x.python_type().__mro__))


def _sorted(tx, it, key=None, reverse=None) -> Var:
    return ListVar(sort_items(tx, _items(tx, it), key, reverse))


def _zip_longest(tx, *its, fillvalue=None) -> Var:
    lists = [_items(tx, i) for i in its]
    fill = fillvalue if fillvalue is not None else ConstVar(None)
    n = max((len(items) for items in lists), default=0)
    return IteratorVar(
        [TupleVar([items[i] if i < len(items) else fill for items in lists]) for i in range(n)]
    )


def _reduce(tx, fn, it, *initial) -> Var:
    items = _items(tx, it)
    acc = initial[0] if initial else items.pop(0)
    for v in items:
        acc = fn.call(tx, [acc, v], {})
    return acc


def _print(tx, *args, **kwargs) -> Var:
    raise Unsupported(breaks.PRINT, "print()")


def _super(tx, *args) -> Var:
    from kiln_capture.variables.objects import SuperVar

    if args:
        return SuperVar(args[0].as_const(), args[1])
    cls, obj = tx.zero_arg_super()
    return SuperVar(cls, obj)


def _object_setattr(tx, obj, name, value) -> Var:
    if type(obj).__name__ == "ObjectVar":  # replayed past the class's own __setattr__
        tx.out.side_effects.store_attr(obj, name.as_const(), value, raw=True)
    elif type(obj).__name__ == "RecordVar":
        obj.raw_setattr(tx, name.as_const(), value)
    else:
        obj.setattr(tx, name.as_const(), value)
    return ConstVar(None)


def _repeat(tx, value, times=None) -> Var:
    """``itertools.repeat(x, n)`` with a known count (``torch.nn.modules.utils._pair``)."""
    if times is None or not times.is_const():
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "itertools.repeat without a known count")
    return IteratorVar([value] * max(int(times.as_const()), 0))


def _slice(tx, *parts) -> Var:
    """``slice(stop)`` / ``slice(start, stop[, step])``, as BUILD_SLICE makes it."""
    from kiln_capture.variables.containers import SliceVar

    if not 1 <= len(parts) <= 3:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"slice() of {len(parts)} arguments")
    none = ConstVar(None)
    if len(parts) == 1:
        return SliceVar(none, parts[0], none)
    return SliceVar(*parts, *[none] * (3 - len(parts)))


_HANDLERS = {
    slice: _slice,
    itertools.repeat: _repeat,
    itertools.islice: _islice,
    itertools.zip_longest: _zip_longest,
    itertools.count: _count,
    itertools.chain: _chain,
    itertools.chain.from_iterable: _chain_from_iterable,
    itertools.accumulate: _accumulate,
    itertools.product: _combinatoric(itertools.product),
    itertools.permutations: _combinatoric(itertools.permutations),
    itertools.combinations: _combinatoric(itertools.combinations),
    itertools.combinations_with_replacement: _combinatoric(itertools.combinations_with_replacement),
    len: _len,
    isinstance: _isinstance,
    issubclass: _issubclass,
    getattr: _getattr,
    hasattr: _hasattr,
    setattr: _setattr,
    delattr: _delattr,
    range: _range,
    enumerate: _enumerate,
    zip: _zip,
    reversed: _reversed,
    map: _map,
    filter: _filter,
    list: _list,
    tuple: _tuple,
    dict: _dict,
    set: _set(set),
    frozenset: _set(frozenset),
    iter: _iter,
    next: _next,
    min: _minmax(min),
    max: _minmax(max),
    sum: _sum,
    any: _any_all(any),
    all: _any_all(all),
    bool: _bool,
    type: _type,
    callable: _callable,
    sorted: _sorted,
    print: _print,
    pow: lambda tx, a, b: binary(tx, operator.pow, a, b),
    super: _super,
    object.__setattr__: _object_setattr,
    functools.reduce: _reduce,
}

BUILTIN_MODULES = ("builtins", "math", "operator", "_operator")


def is_builtin_callable(value: object) -> bool:
    if not callable(value):
        return False
    try:
        hash(value)
    except TypeError:
        return False
    if (
        isinstance(value, type)
        and value not in _HANDLERS
        and value not in (int, float, str, complex, bool)
    ):
        return False
    return (
        value in _HANDLERS
        or (
            callable(value)
            and getattr(value, "__module__", None) in BUILTIN_MODULES
            and not isinstance(value, type)
        )
        or value in (int, float, str, complex, abs, round, divmod, pow, repr, format, chr, ord)
        or (
            getattr(value, "__module__", None) is None
            # by identity: ``in`` compares with ==, elementwise for a numpy array's method
            and any(getattr(value, "__self__", None) is m for m in (math, operator, builtins))
        )
    )


__all__ = [
    "BINARY_OPS",
    "COMPARE_OPS",
    "BuiltinVar",
    "binary",
    "contains",
    "identical",
    "is_builtin_callable",
    "unary",
]
