"""Recipes: how a process finds again an object another process captured with.

A cache entry holds objects of its process (the constants its guards compare with, the
classes and functions its graph calls). A persisted capture (frame_store.py) cannot keep
them; it keeps, per object, a recipe: plain data that names the object in a way another
process can follow, and a fingerprint of what the trace relied on.

- by value: literals (``("v", 3)``), tuples of recipes (``("t", ...)``), torch's dtypes,
  layouts and memory formats (``("torch", "float32")``), devices, sizes, slices;
- by import path: classes, functions, builtins and modules (``("import", "torch.nn",
  "Linear")``), enum members, a module's globals (``("globals", "transformers.activations")``); made only when following the path in this process gives the very object
  (``<locals>`` classes and functions have none);
- by a path from the frame's arguments: an object an identity guard read
  (``("path", "self._modules['h']._modules['3']", <fingerprint>)``), evaluated against
  the new frame's arguments, closure and globals.

A fingerprint says what identity meant in the capturing process, where another process
could give a different object: a function's code (its bytecode, constants, names, file
and line) and its defaults' recipes; a code object's digest; a builtin's import path; an instance's class (by import path); a class's or a
module's import path. ``resolve`` checks it and raises ``Unresolved`` when the object
found is not what was captured with. The source files a recipe's class or function lives
in are named by ``files_of`` (frame_store.py checks their contents too).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib
import sys
import types
from typing import Any

import torch

PLAIN = (int, float, str, bytes, bool, type(None), complex)
_TORCH_SINGLETONS = (torch.dtype, torch.layout, torch.memory_format)


class NotPersistable(Exception):
    """An object no recipe describes (the capture is not kept)."""


class Unresolved(Exception):
    """A recipe this process cannot follow, or whose object differs from the captured one."""


_DIGESTS: dict[int, tuple[types.CodeType, str]] = {}  # id -> (the code, held; digest)


def code_digest(code: types.CodeType) -> str:
    """sha256 of what a code object runs: bytecode, constants (nested code objects by
    their own digests), names, file, line and flags (once per code object: they are
    immutable)."""
    hit = _DIGESTS.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    if len(_DIGESTS) >= 4096:
        _DIGESTS.clear()
    digest = _code_digest(code)
    _DIGESTS[id(code)] = (code, digest)
    return digest


def _code_digest(code: types.CodeType) -> str:
    parts: list[Any] = [
        code.co_code,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
        code.co_filename,
        code.co_firstlineno,
        code.co_qualname,
        code.co_flags,
        code.co_argcount,
        code.co_kwonlyargcount,
        code.co_posonlyargcount,
    ]
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            parts.append(code_digest(c))
        elif isinstance(c, frozenset):
            parts.append(sorted(repr(x) for x in c))
        else:
            parts.append((type(c).__name__, repr(c)))
    return hashlib.sha256(repr(parts).encode("utf-8", "surrogatepass")).hexdigest()


def _module(name: str) -> types.ModuleType:
    mod = sys.modules.get(name)
    return mod if mod is not None else importlib.import_module(name)


def _follow(module: str, qualname: str) -> Any:
    obj: Any = _module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


_CLASS_PATHS: dict[type, tuple[str, str]] = {}  # the import path found for each class


def import_recipe(obj: Any) -> tuple | None:
    """``("import", module, qualname)`` naming ``obj``, checked to lead back to it (a
    class's path, once found, is checked again before the candidates are searched)."""
    if type(obj) is type:
        known = _CLASS_PATHS.get(obj)
        if known is not None:
            try:
                if _follow(*known) is obj:
                    return ("import", *known)
            except Exception:
                pass
        r = _import_recipe(obj)
        if r is not None:
            _CLASS_PATHS[obj] = (r[1], r[2])
        return r
    return _import_recipe(obj)


def _import_recipe(obj: Any) -> tuple | None:
    if isinstance(obj, types.ModuleType):
        return ("import", obj.__name__, "") if sys.modules.get(obj.__name__) is obj else None
    name = getattr(obj, "__name__", None)
    qual = getattr(obj, "__qualname__", None)
    mod = getattr(obj, "__module__", None)
    if not isinstance(name, str):
        return None
    candidates = []
    owner = getattr(obj, "__objclass__", None)  # a method descriptor (``dict.get``)
    if owner is None and isinstance(getattr(obj, "__self__", None), type):
        owner = obj.__self__  # a builtin bound to a class (``dict.fromkeys``)
    if isinstance(owner, type) and owner is not obj:
        r = import_recipe(owner)
        if r is not None:
            candidates.append((r[1], f"{r[2]}.{name}" if r[2] else name))
    if isinstance(mod, str):
        if isinstance(qual, str) and "<" not in qual:
            candidates.append((mod, qual))
            if isinstance(obj, types.FunctionType):  # a property's getter, a classmethod
                candidates += [(mod, f"{qual}.fget"), (mod, f"{qual}.__func__")]
        candidates.append((mod, name))
    for m in ("torch", "torch.nn.functional", "operator", "math", "builtins"):
        candidates.append((m, name))
    if isinstance(qual, str) and "<" not in qual:
        candidates.append(("torch", qual))
    for m, q in candidates:
        try:
            if _follow(m, q) is obj:
                return ("import", m, q)
        except Exception:
            continue
    return None


def _module_dict(obj: dict) -> bool:
    name = obj.get("__name__")
    return isinstance(name, str) and getattr(sys.modules.get(name), "__dict__", None) is obj


def fingerprint(obj: Any, _seen: frozenset = frozenset()) -> tuple:
    """What another process's object must share with ``obj`` to stand for it."""
    if isinstance(obj, types.FunctionType):
        # defaults by their recipes (a default function by its import path and code)
        defaults = tuple(recipe_of(v, {}) for v in obj.__defaults__ or ())
        kw = tuple((k, recipe_of(v, {})) for k, v in sorted((obj.__kwdefaults__ or {}).items()))
        # and what its closure holds: functions made by one decorator share their code
        # (torch's Tensor.__rmod__ and __rpow__ are the same wrapper around different
        # functions), so the code alone let one stand for the other
        closure = tuple(_cell_print(c, _seen | {id(obj)}) for c in obj.__closure__ or ())
        return ("fn", code_digest(obj.__code__), defaults, kw, closure)
    if isinstance(obj, types.CodeType):
        return ("code", code_digest(obj))
    if isinstance(obj, types.BuiltinFunctionType):  # torch._C._nn.gelu: what its name names
        r = import_recipe(obj)
        if r is None:
            raise NotPersistable(f"builtin {obj!r:.60} has no import path")
        return ("builtin", r[1], r[2])
    if isinstance(obj, types.ModuleType):
        return ("mod", obj.__name__)
    if isinstance(obj, type):
        r = import_recipe(obj)
        if r is None:
            raise NotPersistable(f"class {obj.__qualname__} has no import path")
        return ("cls", r[1], r[2])
    r = import_recipe(type(obj))
    if r is None:
        raise NotPersistable(f"class {type(obj).__qualname__} has no import path")
    return ("inst", r[1], r[2])


def _cell_print(cell: Any, seen: frozenset) -> tuple:
    try:
        value = cell.cell_contents
    except ValueError:
        return ("empty",)
    if isinstance(value, types.FunctionType):
        if id(value) in seen:
            return ("self",)  # a recursive closure: its code is already in the fingerprint
        return fingerprint(value, seen)
    return recipe_of(value, {})


def files_of(obj: Any) -> list[str]:
    """The source files whose contents a recipe of ``obj`` depends on: the module file of
    its class and every class above it (their methods may have been traced)."""
    cls = obj if isinstance(obj, type) else type(obj)
    if isinstance(obj, (types.FunctionType, types.ModuleType, types.CodeType)) or isinstance(
        obj, types.BuiltinFunctionType
    ):
        return []  # a function's code is in its fingerprint; a module's version elsewhere
    return list(_class_files(cls))


@functools.lru_cache(maxsize=4096)
def _class_files(cls: type) -> tuple[str, ...]:
    out = []
    for c in cls.__mro__:
        mod = sys.modules.get(c.__module__)
        path = getattr(mod, "__file__", None)
        if isinstance(path, str):
            out.append(path)
    return tuple(out)


def torch_value_recipe(obj: Any) -> tuple | None:
    """A dtype, layout or memory format by its name in ``torch``; a device; a size."""
    if isinstance(obj, _TORCH_SINGLETONS):
        name = str(obj).removeprefix("torch.")
        if getattr(torch, name, None) is obj:
            return ("torch", name)
    if type(obj) is torch.device:
        return ("device", str(obj))
    if type(obj) is torch.Size:
        return ("size", tuple(obj))
    return None


def class_attributes(objs: list, into: dict[int, str | tuple]) -> None:
    """Name each value in the ``__dict__`` of the classes among ``objs`` by its import
    path (``("import", module, "Output.__dataclass_fields__")``), for ``recipe_of``."""
    for c in objs:
        if isinstance(c, type):
            r = import_recipe(c)
            if r is not None:
                for k, v in vars(c).items():
                    if type(v) not in PLAIN:
                        into.setdefault(id(v), ("import", r[1], f"{r[2]}.{k}"))


def recipe_of(obj: Any, paths: dict[int, str | tuple]) -> tuple:
    """A recipe for ``obj``; ``paths`` maps the id of each object an identity guard read
    to the expression it was read with (or of a class attribute to its import path,
    ``class_attributes``)."""
    expr = paths.get(id(obj))
    if isinstance(expr, str) and type(obj) not in PLAIN:
        return ("path", expr, fingerprint(obj))
    t = type(obj)
    if t in PLAIN:
        return ("v", obj)
    if t is tuple:
        return ("t", tuple(recipe_of(v, paths) for v in obj))
    r = torch_value_recipe(obj)
    if r is not None:
        return r
    if isinstance(obj, enum.Enum):
        r = import_recipe(t)
        if r is not None and _follow(r[1], f"{r[2]}.{obj.name}") is obj:
            return ("import", r[1], f"{r[2]}.{obj.name}")
    if t is dict and _module_dict(obj):  # an inlined function's globals
        return ("globals", obj["__name__"])
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)) or (
        callable(obj) and t.__name__ in ("method_descriptor", "wrapper_descriptor")
    ):
        r = import_recipe(obj)
        if r is not None:
            if isinstance(obj, types.FunctionType):
                return (*r, fingerprint(obj))
            return r
    if isinstance(expr, tuple):
        try:
            if _follow(expr[1], expr[2]) is obj:
                return expr
        except Exception:
            pass
    raise NotPersistable(f"a constant of type {t.__qualname__} ({obj!r:.60})")


def resolve(recipe: tuple, evaluate, memo: dict | None = None) -> Any:
    """The object ``recipe`` names in this process; ``evaluate(expr)`` evaluates a path
    against the new frame. Raises ``Unresolved``. ``memo`` keeps what import paths gave
    during one load (a model names the same classes and functions hundreds of times)."""
    if memo is not None and recipe[0] in _MEMO_KINDS:
        obj = memo.get(recipe, _MISSING)
        if obj is _MISSING:
            obj = memo[recipe] = _resolve(recipe, evaluate, memo)
        return obj
    return _resolve(recipe, evaluate, memo)


_MEMO_KINDS = frozenset({"import", "globals", "torch"})
_MISSING = object()


def _resolve(recipe: tuple, evaluate, memo: dict | None) -> Any:
    kind = recipe[0]
    try:
        if kind == "v":
            return recipe[1]
        if kind == "t":
            return tuple(resolve(r, evaluate, memo) for r in recipe[1])
        if kind == "torch":
            obj = getattr(torch, recipe[1])
            if not isinstance(obj, _TORCH_SINGLETONS):
                raise Unresolved(f"torch.{recipe[1]} is no dtype, layout or memory format")
            return obj
        if kind == "device":
            return torch.device(recipe[1])
        if kind == "size":
            return torch.Size(recipe[1])
        if kind == "import":
            obj = _follow(recipe[1], recipe[2]) if recipe[2] else _module(recipe[1])
            if len(recipe) > 3 and fingerprint(obj) != recipe[3]:
                raise Unresolved(f"{recipe[1]}.{recipe[2]} is not the captured function")
            return obj
        if kind == "globals":
            return vars(_module(recipe[1]))
        if kind == "path":
            obj = evaluate(recipe[1])
            if fingerprint(obj) != recipe[2]:
                raise Unresolved(f"{recipe[1]} is not what was captured ({recipe[2]})")
            return obj
    except Unresolved:
        raise
    except Exception as e:  # an attribute or module that is not there (any more)
        raise Unresolved(f"{recipe[:3]!r}: {type(e).__name__}: {e}") from None
    raise Unresolved(f"unknown recipe kind {kind!r}")
