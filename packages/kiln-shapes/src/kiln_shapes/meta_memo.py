"""Symbolic meta results reused: an op asked again about the same symbolic sizes.

Design note: "answered ops"
---------------------------
An ATen op on meta tensors with symbolic sizes runs a Python meta function or
decomposition (``meta.run``) that computes every output size with sympy through
``torch.SymInt``: a few milliseconds per op, where the C++ meta kernel of a static op
takes microseconds. A model's repeated layers make the same ops on tensors of the same
symbolic sizes (``[2, s0, 128]`` in every layer of a transformer compiled for any sequence
length), and both kiln-capture (its trace) and kiln-aot (its ATen trace) ask them all: a
24-layer model's dynamic recompile spent most of its time there.

``run`` asks this memo first. The key is everything the meta function reads: the op, each
argument as plain data (a meta tensor by its sizes, strides and storage offset as
expressions, dtype, ``requires_grad``, whether it is a view, and which arguments are the
same tensor; SymInts by their expressions; numbers, dtypes, devices, strings, ``None`` and
sequences of these) and the default dtype. The memo lives in the arguments'
``ShapeEnv`` (``ShapeEnv._answers``), so it is emptied whenever a symbol, a replacement, an
expression's value or an assumption is added there: an answer is reused only while
everything the first evaluation could have read is as it was. The guards the first
evaluation recorded are in the env already (the same questions give the same guards).

Only functional ops (no mutable schema) of envs without unbacked symbols are kept, and only
results that are plain: SymInts, numbers, ``None``, tuples and lists of these, and strided
meta tensors, each new (a fresh ``empty_strided`` of the recorded sizes and strides), a
view of an argument (the same ``as_strided`` view of this call's argument; an alias that
is no view, as prims make them, made below view tracking likewise) or a view of a new
base; anything else runs again. So each result is a tensor of its own that aliases
what the kernel's result would alias.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

_PLAIN = (int, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_MAX = 8192  # entries per env state: past it nothing more is kept
_STATS = {"hits": 0, "kept": 0}


class _NoKey(Exception):
    pass


def _expr(x: Any) -> Any:
    """A size, stride or offset as plain data: an int, or its sympy expression."""
    if type(x) is int:
        return x
    node = getattr(x, "node", None)
    expr = getattr(node, "expr", None)
    if expr is None or not isinstance(x, torch.SymInt):
        raise _NoKey
    return expr


class _Call:
    """One call's tensors (in key order) and the env its symbolic sizes belong to."""

    def __init__(self) -> None:
        self.tensors: dict[int, tuple[int, torch.Tensor]] = {}
        self.env: Any = None

    def note_env(self, x: Any) -> None:
        if self.env is None and isinstance(x, torch.SymInt):
            self.env = getattr(x.node, "env", None)

    def key(self, value: Any) -> Any:
        t = type(value)
        if t is torch.Tensor:
            if (
                value.layout is not torch.strided
                or value.device.type != "meta"
                or value.is_conj()
                or value.is_neg()
            ):
                raise _NoKey
            same = self.tensors.setdefault(id(value), (len(self.tensors), value))[0]
            shape, stride = tuple(value.shape), value.stride()
            for x in shape:
                self.note_env(x)
            return (
                "T",
                same,
                tuple(_expr(x) for x in shape),
                tuple(_expr(x) for x in stride),
                _expr(value.storage_offset()),
                value.dtype,
                value.requires_grad,
                value._is_view(),
            )
        if t is torch.SymInt:
            self.note_env(value)
            return ("S", _expr(value))
        if t is float:
            return ("f", repr(value))
        if t in _PLAIN:
            return (t, value)
        if t is tuple or t is list:
            return (t, tuple(self.key(v) for v in value))
        if t is dict:
            return (dict, tuple((k, self.key(v)) for k, v in value.items()))
        raise _NoKey


def lookup(func: Any, args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """``(result, keep)``: a fresh copy of the result kept for this call, or None and a
    ``keep(result)`` to call with the result once computed (None: not kept)."""
    schema = getattr(func, "_schema", None)
    if schema is None or schema.is_mutable:
        return None, None
    call = _Call()
    try:
        key = ("meta", func, call.key(args), call.key(kwargs), torch.get_default_dtype())
        hash(key)
    except (_NoKey, TypeError):
        return None, None
    env = call.env
    if env is None or getattr(env, "has_unbacked", True) or not hasattr(env, "_answers"):
        return None, None
    answers = env._answers()
    state = env._memo_state
    tensors = [t for _, t in call.tensors.values()]
    snap = answers.get(key)
    if snap is not None:
        try:
            with _disable_current_modes(), torch._C.DisableTorchFunction():
                result = fresh(snap, tensors)
        except Exception:  # a view the argument's storage cannot hold: run the op
            return None, None
        _STATS["hits"] += 1
        return result, None

    def keep(result: Any) -> None:
        env._answers()
        if len(answers) >= _MAX or env._memo_state != state:
            return  # the op changed the env (a new guard's replacement): not kept
        try:
            answers[key] = snapshot(result, Outputs(tensors, may_alias=True))
        except NotPlain:
            return
        _STATS["kept"] += 1

    return None, keep


class NotPlain(Exception):
    """A result ``snapshot`` cannot describe as plain data: the op runs again."""


class Outputs:
    """What ``snapshot`` knows of the call: its tensor arguments (in key order), the
    storages they hold, whether a result may be or view an argument (``may_alias``:
    the op is not in place and left the arguments' metadata as it was), whether an alias
    that is no view may be kept (``aliases``: prims make them below view tracking; at
    the torch level ``detach()`` does), and the outputs seen so far."""

    def __init__(self, args: list[torch.Tensor], may_alias: bool, aliases: bool = True) -> None:
        self.args = args
        self.index = {id(t): i for i, t in enumerate(args)}
        self.arg_storages: dict[int, list[int]] = {}
        for i, t in enumerate(args):
            self.arg_storages.setdefault(_storage(t), []).append(i)
        self.may_alias = may_alias
        self.aliases = aliases
        self.storages: set[int] = set()  # of new outputs
        self.seen: set[int] = set()


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage()._cdata
    except Exception as e:  # (no storage to compare: not kept)
        raise NotPlain from e


def _whole(x: Any) -> bool:
    return type(x) is int or isinstance(x, torch.SymInt)


def plain_tensor(t: Any) -> bool:
    """A meta tensor of class ``torch.Tensor``, strided, needing no grad (its ``grad_fn``
    would differ), neither conjugate nor negative, of int or SymInt sizes."""
    return (
        type(t) is torch.Tensor
        and not t.requires_grad
        and t.layout is torch.strided
        and t.device.type == "meta"
        and not t.is_conj()
        and not t.is_neg()
        and all(_whole(n) for n in (*t.shape, *t.stride(), t.storage_offset()))
    )


def snapshot(result: Any, outs: Outputs) -> Any:
    """``result`` as plain data ``fresh`` makes a new result of, or raise ``NotPlain``."""
    t = type(result)
    if t is torch.Tensor:
        return _snapshot_tensor(result, outs)
    if t is tuple or t is list:
        return (t, tuple(snapshot(r, outs) for r in result))
    if t in (int, bool, float, type(None), torch.Size, torch.SymInt):
        return ("c", result)
    raise NotPlain


def _zero(x: Any) -> bool:
    return type(x) is int and x == 0


def _snapshot_tensor(result: torch.Tensor, outs: Outputs) -> tuple:
    if not plain_tensor(result):
        raise NotPlain
    shape, stride, offset = tuple(result.shape), result.stride(), result.storage_offset()
    if id(result) in outs.index:  # an argument itself
        if not outs.may_alias:
            raise NotPlain
        return ("A", outs.index[id(result)])
    if id(result) in outs.seen:
        raise NotPlain
    outs.seen.add(id(result))
    storage = _storage(result)
    if storage in outs.arg_storages:  # a view of an argument
        view = result._is_view()
        if not outs.may_alias or not (view or outs.aliases):
            raise NotPlain  # (detach(): shares the storage, no view)
        of = [i for i in outs.arg_storages[storage] if outs.args[i].dtype == result.dtype]
        if not of:
            raise NotPlain
        return ("V" if view else "N", of[0], shape, stride, offset)
    if storage in outs.storages:
        raise NotPlain  # two outputs sharing one new storage
    outs.storages.add(storage)
    if not result._is_view():
        if not _zero(offset):
            raise NotPlain
        return ("T", shape, stride, result.dtype)
    base = result._base
    if (
        base is None
        or not plain_tensor(base)
        or base._is_view()
        or not _zero(base.storage_offset())
        or base.dtype != result.dtype
    ):
        raise NotPlain
    return ("B", tuple(base.shape), base.stride(), base.dtype, shape, stride, offset)


def fresh(snap: Any, args: list[torch.Tensor]) -> Any:
    """A new result like the one ``snap`` describes, aliasing ``args`` as it aliased its
    call's arguments."""
    kind = snap[0]
    if kind == "T":
        return torch.empty_strided(snap[1], snap[2], dtype=snap[3], device="meta")
    if kind == "c":
        return snap[1]
    if kind == "A":
        return args[snap[1]]
    if kind == "V":
        return args[snap[1]].as_strided(snap[2], snap[3], snap[4])
    if kind == "N":  # (as prims make their aliases: no view of the argument)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            return args[snap[1]].as_strided(snap[2], snap[3], snap[4])
    if kind == "B":
        base = torch.empty_strided(snap[1], snap[2], dtype=snap[3], device="meta")
        return base.as_strided(snap[4], snap[5], snap[6])
    return kind(fresh(s, args) for s in snap[1])


def stats() -> dict[str, int]:
    """Results reused and kept in this process (tests, benchmarks)."""
    return dict(_STATS)


__all__ = ["NotPlain", "Outputs", "fresh", "lookup", "plain_tensor", "snapshot", "stats"]
