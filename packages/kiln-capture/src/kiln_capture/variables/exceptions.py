"""Exceptions raised and caught inside captured code.

Design note: "exceptions as control flow"
------------------------------------------
An exception the captured code raises (``raise``, a missing dict key, a missing
attribute, ``next()`` of an exhausted iterator, a failed argument binding, a constant
computation that fails) whose type and arguments are known at trace time is an ExcVar,
carried out of the step that raised it by a ``Raised`` (errors.py). Each Frame of the
evaluator looks the raising instruction up in its code's exception table (3.11 and 3.12
share the format): a covering handler gets the stack cut to its depth, the exception
pushed and control, exactly as CPython unwinds, so ``try``/``except``/``finally``,
``with`` blocks (``__exit__`` gets the exception) and generators (``throw``) run their
handlers in the trace. An exception no frame of the trace handles leaves the root frame
as a graph break at the root's instruction (that step then runs eagerly and raises
eager's exception), or, where the root itself raises it, in generated code after the
graph (capture.py). ``Raised`` is an ``Unsupported``: code that is not the evaluator
treats it as a graph break, as before.

Exceptions of tensor operations (shape errors found on the meta device) are never
ExcVars: the meta kernels need not fail the way eager kernels do, so such a step is a
graph break and runs eagerly, raising eager's exception.
"""

from __future__ import annotations

import inspect

from kiln_capture import breaks
from kiln_capture.errors import Raised, Unsupported
from kiln_capture.variables.base import Var
from kiln_capture.variables.constants import ConstVar
from kiln_capture.variables.containers import TupleVar

# attributes every exception has, with their values on a fresh one
_DEFAULTS = {"__cause__": None, "__context__": None, "__traceback__": None}


class ExcVar(Var):
    """An exception instance made in the trace: its class, ``args`` and attributes."""

    def __init__(self, cls: type, args: list[Var]) -> None:
        self.cls = cls
        self.args = list(args)
        self.attrs: dict[str, Var] = {}

    def __repr__(self) -> str:
        return f"Exception({self.cls.__name__})"

    def python_type(self) -> type:
        return self.cls

    def truth(self, tx) -> bool:
        return True

    def children(self) -> list[Var]:
        return [*self.args, *self.attrs.values()]

    def const_args(self) -> tuple | None:
        if all(a.is_const() for a in self.args):
            return tuple(a.as_const() for a in self.args)
        return None

    def real(self) -> BaseException | None:
        """An equal real exception (for its message), where its arguments are constants
        and its class is a builtin one or keeps the builtin ``__init__``/``__str__``."""
        args = self.const_args()
        if args is None:
            return None
        try:
            e = BaseException.__new__(self.cls, *args)
            e.args = args
        except Exception:
            return None
        return e

    def message(self) -> str:
        e = self.real()
        if e is not None and not _python_defined(self.cls, "__str__"):
            try:
                return f"{self.cls.__name__}: {e}"
            except Exception:
                pass
        return self.cls.__name__

    def getattr(self, tx, name: str) -> Var:
        if name in self.attrs:
            return self.attrs[name]
        if self.source is not None and name in _REAL_STATE:
            # eager's exception (a re-raising continuation's): its traceback and chain
            # are the real object's, which the trace does not hold
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{name} of an exception eager code raised")
        if name == "args":
            return TupleVar(list(self.args))
        if name in _DEFAULTS:
            return ConstVar(_DEFAULTS[name])
        if name == "__suppress_context__":
            return ConstVar(False)
        if name == "__class__":
            return tx.out.wrap_value(self.cls)
        if name == "with_traceback":
            return _WithTraceback(self)
        if name == "value" and issubclass(self.cls, StopIteration | StopAsyncIteration):
            return self.args[0] if self.args else ConstVar(None)
        static = inspect.getattr_static(self.cls, name, None)
        if static is not None and _python_defined(self.cls, name):
            from kiln_capture.variables.modules import lookup_class_attr

            found = lookup_class_attr(tx, self, self.cls, name, None)
            if found is not None:
                return found
        if static is None and name not in dir(BaseException):
            if inspect.getattr_static(self.cls, "__getattr__", None) is None:
                raise AttributeError(name)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self.cls.__name__}.{name}")

    def setattr(self, tx, name: str, value: Var) -> None:
        self.source = None  # changed: rebuilt from its state, no longer the object read
        if name == "args":
            self.args = value.unpack(tx)
            return
        self.attrs[name] = value

    def call_method(self, tx, name, args, kwargs) -> Var:
        if name in ("__str__", "__repr__") and not args and not _python_defined(self.cls, name):
            e = self.real()
            if e is not None:
                return ConstVar(str(e) if name == "__str__" else repr(e))
        return self.getattr(tx, name).call(tx, args, kwargs)

    def reconstruct(self, cg) -> str:
        """An equal exception made by ``build_exception``: its state is its ``args`` and
        attributes (a Python ``__init__`` already ran in the trace). One read from the
        frame (a re-raised eager exception) is that object."""
        if self.source is not None and not self.attrs:
            return self.source.expr()
        if self.source is not None:  # ``raise e from None`` of eager's exception
            attrs = ", ".join(f"{k!r}: {cg.rebuild(v)}" for k, v in self.attrs.items())
            return f"{cg.const(set_exception_attrs)}({self.source.expr()}, {{{attrs}}})"
        if _python_defined(self.cls, "__new__"):
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, f"rebuilding a {self.cls.__name__} outside the trace"
            )
        args = ", ".join(cg.rebuild(a) for a in self.args)
        attrs = ", ".join(f"{k!r}: {cg.rebuild(v)}" for k, v in self.attrs.items())
        return (
            f"{cg.const(build_exception)}({cg.const(self.cls)}, ({args}{',' if args else ''}), "
            f"{{{attrs}}})"
        )


class Reraise:
    """Stands in for a step's callable/value in a re-raising continuation (capture.py):
    any use raises the exception the eager step raised (an attribute read too: its own
    names are ``_kiln_``-prefixed)."""

    def __init__(self, exc: BaseException) -> None:
        self._kiln_exc = exc

    def _kiln_raise(self, *args, **kwargs):
        raise self._kiln_exc

    __call__ = __bool__ = __getitem__ = __format__ = __str__ = __repr__ = _kiln_raise
    __enter__ = __exit__ = __contains__ = __getattr__ = _kiln_raise
    __next__ = _kiln_raise  # FOR_ITER's iterator (without it, FOR_ITER would crash)
    __lt__ = __le__ = __eq__ = __ne__ = __gt__ = __ge__ = _kiln_raise
    __hash__ = None  # type: ignore[assignment]


# the left operand of a binary operation that raised: each operator (and a += b) raises
for _op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift"):
    setattr(Reraise, f"__{_op}__", Reraise._kiln_raise)
    setattr(Reraise, f"__i{_op}__", Reraise._kiln_raise)
for _op in ("rshift", "and", "or", "xor"):
    setattr(Reraise, f"__{_op}__", Reraise._kiln_raise)
    setattr(Reraise, f"__i{_op}__", Reraise._kiln_raise)


class RaisingVar(Var):
    """A ``Reraise`` a re-raising continuation receives, in its trace: its first use
    raises (in the trace, to the frame's handlers) an exception equal to the one the
    eager step raised, so that the ``except`` branch is captured too. The exception's
    class and arguments are guarded; rebuilt, it is the eager exception object itself."""

    def __init__(self, exc: ExcVar, source) -> None:
        self.exc = exc
        self.source = source

    def __repr__(self) -> str:
        return f"Raising({self.exc!r})"

    def raised(self) -> Raised:
        return Raised(self.exc, self.exc.message())

    def python_type(self) -> type:
        return Reraise

    def _raise(self, *args, **kwargs):
        raise self.raised()

    as_const = truth = getattr = setattr = call = call_method = _raise
    unpack = getitem = setitem = _raise


def wrap_reraise(out, value: Reraise, source) -> RaisingVar:
    """The Var of a continuation's ``Reraise`` argument, guarded: a builtin-like exception
    (no Python-defined methods, no instance attributes) with constant arguments; else
    Unsupported (the continuation runs eagerly)."""
    from kiln_capture.sources import AttrSource
    from kiln_capture.variables.constants import is_constant_value

    e = value._kiln_exc
    cls = type(e)
    plain = not getattr(e, "__dict__", None) and not any(
        _python_defined(cls, n) for n in ("__init__", "__new__", "__str__", "__getattr__")
    )
    if not plain or not all(is_constant_value(a) for a in e.args):
        raise Unsupported(breaks.EXCEPTION, f"re-raising a {cls.__name__} kiln cannot model")
    g, src = out.guards, source.expr()
    g.add(f"type({src}) is {g.const(Reraise)}", f"{src} re-raises")
    exc_src = AttrSource(source, "_kiln_exc")
    g.add(f"type({exc_src.expr()}) is {g.const(cls)}", f"{src} re-raises a {cls.__name__}")
    g.add(f"{exc_src.expr()}.args == {g.const(e.args)}", f"{src} re-raises with {e.args!r}")
    exc = ExcVar(cls, [ConstVar(a) for a in e.args])
    exc.source = exc_src
    return RaisingVar(exc, source)


_REAL_STATE = frozenset(
    {"__traceback__", "__context__", "__cause__", "__suppress_context__", "__notes__"}
)


def set_exception_attrs(e: BaseException, attrs: dict) -> BaseException:
    """Eager's exception with the attributes the trace set on it (``raise e from x``)."""
    for k, v in attrs.items():
        setattr(e, k, v)
    return e


def build_exception(cls: type, args: tuple, attrs: dict) -> BaseException:
    """What generated code calls to make an exception the trace made: the nearest builtin
    class's ``__init__`` sets its C fields (StopIteration.value, OSError.errno...)."""
    base = next(k for k in cls.__mro__ if k.__module__ == "builtins")
    e = BaseException.__new__(cls, *args)
    base.__init__(e, *args)
    e.args = args
    for k, v in attrs.items():
        setattr(e, k, v)
    return e


class _WithTraceback(Var):
    def __init__(self, exc: ExcVar) -> None:
        self.exc = exc

    def call(self, tx, args, kwargs) -> Var:
        return self.exc  # traceback objects are not modeled: the trace has none


class InitExceptionVar(Var):
    """``BaseException.__init__`` bound to an exception made in the trace (a user
    exception's ``super().__init__(...)``): sets its ``args``."""

    def __init__(self, exc: ExcVar) -> None:
        self.exc = exc

    def call(self, tx, args, kwargs) -> Var:
        if kwargs:
            raise raised(TypeError, f"{self.exc.cls.__name__}() takes no keyword arguments")
        self.exc.args = list(args)
        return ConstVar(None)


def _python_defined(cls: type, name: str) -> bool:
    """Whether a class of ``cls``'s MRO below the builtin exceptions defines ``name``."""
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            return False
        if name in klass.__dict__:
            return True
    return False


def make_exception(tx, cls: type, args: list[Var], kwargs: dict[str, Var]) -> ExcVar:
    """``cls(*args, **kwargs)`` for an exception class: builtin classes take their
    arguments as ``args``; a user class's Python ``__init__`` is inlined."""
    if _python_defined(cls, "__new__"):
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{cls.__qualname__}.__new__ in captured code")
    exc = ExcVar(cls, args)
    if _python_defined(cls, "__init__"):
        init = inspect.getattr_static(cls, "__init__")
        if not inspect.isfunction(init):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{cls.__qualname__}.__init__")
        result = tx.out.wrap_value(init).call(tx, [exc, *args], kwargs)
        if not (result.is_const() and result.as_const() is None):
            raise raised(TypeError, "__init__() should return None")
    elif kwargs:
        raise raised(TypeError, f"{cls.__name__}() takes no keyword arguments")
    return exc


def raised(cls: type, *args: object) -> Raised:
    """A ``Raised`` for ``cls(*args)`` (constant arguments), to ``raise`` from a step."""
    exc = ExcVar(cls, [a if isinstance(a, Var) else ConstVar(a) for a in args])
    return Raised(exc, exc.message())


def raised_real(e: BaseException) -> Raised | None:
    """A ``Raised`` for a real exception a constant computation raised, when its type
    and arguments are plain (else None: the step is a graph break as before)."""
    cls = type(e)
    if cls.__module__ != "builtins" or not isinstance(e, Exception):
        return None
    from kiln_capture.variables.constants import is_constant_value

    if not all(is_constant_value(a) for a in e.args):
        return None
    return raised(cls, *e.args)


def attribute_error(obj: Var, name: str) -> Unsupported:
    """What a failed ``obj.name`` raises: a catchable AttributeError only where the real
    value cannot have the attribute either (kiln's model of a value may lack what the
    value has: then it is a graph break, and eager code decides)."""
    if isinstance(obj, ExcVar) or _surely_missing(obj, name):
        try:
            cls = obj.python_type()
            is_class = obj.is_const() and isinstance(obj.as_const(), type)
        except Unsupported:
            cls, is_class = None, False
        what = (
            f"type object '{obj.as_const().__name__}'"
            if is_class
            else f"'{getattr(cls, '__name__', '?')}' object"
        )
        return raised(AttributeError, f"{what} has no attribute '{name}'")
    return Unsupported(breaks.EXCEPTION, f"AttributeError: {obj!r} has no attribute {name!r}")


_NO_VALUE = object()


def _surely_missing(obj: Var, name: str) -> bool:
    try:
        cls = obj.python_type()
    except Unsupported:
        return False
    if any(name in k.__dict__ for k in cls.__mro__) or any(
        _python_defined(cls, n) for n in ("__getattr__", "__getattribute__")
    ):
        return False
    real = _NO_VALUE
    if obj.is_const():
        real = obj.as_const()
    elif type(obj).__name__ in _REAL_VALUE_VARS:
        real = getattr(obj, "value", getattr(obj, "fn", _NO_VALUE))
    if real is not _NO_VALUE:
        try:
            return not hasattr(real, name)
        except Exception:
            return False
    # a value with no real object at hand: only its class says what it has
    return type(obj).__name__ == "NewObjectVar" or getattr(cls, "__dictoffset__", 0) == 0


# Vars holding the real object (read through a source, or a constant)
_REAL_VALUE_VARS = frozenset(
    {"ObjectVar", "ModuleVar", "TorchFnVar", "UserFunctionVar", "BuiltinVar"}
)


def stop_iteration_error(exc: Var) -> Var:
    """PEP 479: a StopIteration leaving a generator's body becomes a RuntimeError."""
    if isinstance(exc, ExcVar) and issubclass(exc.cls, StopIteration):
        err = ExcVar(RuntimeError, [ConstVar("generator raised StopIteration")])
        err.attrs["__cause__"] = exc
        err.attrs["__context__"] = exc
        err.attrs["__suppress_context__"] = ConstVar(True)
        return err
    return exc


def as_exception(tx, v: Var) -> ExcVar:
    """What ``raise v`` raises: an instance, or an instance made by calling a class."""
    if isinstance(v, ExcVar):
        return v
    if v.is_const():
        cls = v.as_const()
        if isinstance(cls, type) and issubclass(cls, BaseException):
            made = v.call(tx, [], {})
            if isinstance(made, ExcVar):
                return made
    raise raised(TypeError, "exceptions must derive from BaseException")


def exception_matches(tx, exc: Var, classes: Var) -> bool:
    """``except classes:`` for the exception being handled."""
    want = classes.as_const()
    items = want if isinstance(want, tuple) else (want,)
    if not all(isinstance(c, type) and issubclass(c, BaseException) for c in items):
        raise raised(
            TypeError, "catching classes that do not inherit from BaseException is not allowed"
        )
    return issubclass(exc.python_type(), want)


__all__ = [
    "ExcVar",
    "RaisingVar",
    "Reraise",
    "InitExceptionVar",
    "as_exception",
    "attribute_error",
    "build_exception",
    "exception_matches",
    "make_exception",
    "raised",
    "raised_real",
    "stop_iteration_error",
    "wrap_reraise",
]
