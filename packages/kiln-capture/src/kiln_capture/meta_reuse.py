"""Meta results reused within one capture: the 2nd..Nth identical layer runs no meta kernel.

# Reusing meta results

Every tensor op the trace meets runs on meta tensors (``OutputGraph.tensor_op``) to learn
its output's metadata: a grad-mode, device and speculation context around a meta kernel,
often a Python one (torch's refs and decompositions). A transformer's layers repeat the
same ops on tensors of the same metadata, so from the second layer on each op asks a
question already answered. ``MetaResults`` answers it again from the first answer.

The key is everything the meta kernel reads: the op (a method name, or a function of
torch or of ``operator``; never user code such as an ``autograd.Function``), each
argument as plain data (a meta tensor by its shape, strides, storage offset, dtype,
``requires_grad``, whether it is a leaf and a view, and which arguments are the same
object; numbers with their type, floats by ``repr`` so that ``-0.0``, ``nan`` and ``1``
vs ``1.0`` stay apart; dtypes, devices, layouts, strings, ``None``, slices, and
sequences and dicts of these), the grad mode and the default dtype. An argument of any
other kind (a function, a module, an object, a symbolic size) gives no key: the op runs.
Nothing is reused under autocast, with symbolic sizes in the trace, or when the op took
sides of a branch on data (``kiln_speculation``).

Only results that are plain are kept: numbers, ``None`` and ``torch.Size``, tuples and
lists of these, and meta tensors of class ``torch.Tensor``, strided, not requiring grad
(their ``grad_fn`` would differ), not conjugate or negative, each of one of three kinds:

- new: a tensor at offset 0, not a view, sharing no storage with an argument or another
  output; reused as a new tensor of the recorded shape, strides and dtype
  (``empty_strided``);
- a view of a new base (``F.linear`` of a 3-d input views its 2-d product): its storage
  shared with no argument and no other output, the base itself plain; reused as the same
  view (``as_strided``) of a new base of the recorded shape, strides and dtype;
- an argument itself or a view of one (``dropout`` in eval mode, ``contiguous`` of a
  contiguous tensor; ``view``, ``transpose``, ``split``), from an op that is not in
  place (no ``out=``, ``inplace=True``, ``add_``, ``+=``) and left every argument's
  metadata as it was: reused as that argument of the next call, or the same view
  (``as_strided``, the dtype of the argument) of it, made with grad off as the kernel
  made it (a kept result needs no grad). A tensor sharing its argument's storage that is
  no view (``detach()``) is not kept.

So each node still has its own value, aliasing what a run of the kernel's would alias
(the next call's result aliases the next call's input). Errors are not kept (a failing
op runs again and raises again), nor are warnings a kernel emits (torch warns once per
process anyway).
"""

from __future__ import annotations

from typing import Any

import torch

_PLAIN = (int, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_MAX = 4096  # entries per capture: a trace of many distinct ops stops adding past it


class _NoKey(Exception):
    pass


def reusable_target(kind: str, target: object) -> bool:
    """Ops whose meta result depends on their arguments only: tensor methods by name,
    torch's functions and Python's operators (not a user's functions)."""
    if kind == "call_method":
        return type(target) is str
    if kind != "call_function":
        return False
    module = getattr(target, "__module__", None) or ""
    if module in ("_operator", "operator"):
        return True
    if not (module == "torch" or module.startswith("torch.")):
        return False
    return module not in ("torch.autograd.function", "torch.utils.checkpoint") and not (
        module.startswith(("torch._higher_order_ops", "torch._functorch", "torch.func"))
    )


def _key(value: Any, tensors: dict[int, tuple[int, torch.Tensor]]) -> Any:
    t = type(value)
    if t is torch.Tensor:
        if value.layout is not torch.strided or value.is_conj() or value.is_neg():
            raise _NoKey
        if value.device.type != "meta":
            raise _NoKey
        same = tensors.setdefault(id(value), (len(tensors), value))[0]
        grad = value.requires_grad
        return (
            "T",
            same,
            tuple(value.shape),
            value.stride(),
            value.storage_offset(),
            value.dtype,
            grad,
            value.is_leaf if grad else None,
            value._is_view(),
        )
    if t is float:
        return ("f", repr(value))
    if t in _PLAIN:
        return (t, value)
    if t is tuple or t is list:
        return (t, tuple(_key(v, tensors) for v in value))
    if t is torch.Size:
        return (t, tuple(value))
    if t is dict:
        return (dict, tuple((k, _key(v, tensors)) for k, v in value.items()))
    if t is slice:
        return (slice, *(_key(p, tensors) for p in (value.start, value.stop, value.step)))
    if value is Ellipsis:
        return ("...",)
    raise _NoKey


def _collect(value: Any, tensors: dict[int, torch.Tensor]) -> None:
    """The tensors of ``value`` into ``tensors`` by first appearance, in ``_key``'s order."""
    t = type(value)
    if t is torch.Tensor:
        tensors.setdefault(id(value), value)
    elif t is tuple or t is list:
        for v in value:
            _collect(v, tensors)
    elif t is dict:
        for v in value.values():
            _collect(v, tensors)
    elif t is slice:
        for v in (value.start, value.stop, value.step):
            _collect(v, tensors)


_IN_PLACE_OPERATORS = frozenset(
    f"i{name}"
    for name in (
        "add", "and", "concat", "floordiv", "lshift", "matmul", "mod", "mul",
        "or", "pow", "rshift", "sub", "truediv", "xor",
    )
)  # fmt: skip


def _in_place(kind: str, target: object, kwargs: dict) -> bool:
    """Whether the op may write into an argument (its result may be that argument)."""
    if "out" in kwargs or kwargs.get("inplace") is True:
        return True
    schema = getattr(target, "_schema", None)  # torch.ops.aten.add_.Tensor
    if schema is not None and getattr(schema, "is_mutable", True):
        return True
    name = target if type(target) is str else getattr(target, "__name__", "")
    if not isinstance(name, str):
        return True
    if name.endswith("_") and not name.endswith("__"):
        return True  # x.add_(y), torch.relu_(x)
    if name.startswith("__i") and name.endswith("__"):
        return True  # x.__iadd__(y)
    module = getattr(target, "__module__", None) if kind == "call_function" else None
    return module in ("_operator", "operator") and name in _IN_PLACE_OPERATORS


def _metadata(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.requires_grad)


class _Outputs:
    """What ``_snapshot`` knows of the call: its tensor arguments (in key order), the
    storages they hold, whether a result may alias them, and the outputs seen so far."""

    def __init__(self, args: list[torch.Tensor], may_alias: bool) -> None:
        self.args = args
        self.index = {id(t): i for i, t in enumerate(args)}
        self.arg_storages: dict[int, list[int]] = {}
        for i, t in enumerate(args):
            self.arg_storages.setdefault(t.untyped_storage()._cdata, []).append(i)
        self.may_alias = may_alias
        self.storages: set[int] = set()  # of new outputs
        self.seen: set[int] = set()


def _plain_tensor(t: Any) -> bool:
    return (
        type(t) is torch.Tensor
        and not t.requires_grad
        and t.layout is torch.strided
        and t.device.type == "meta"
        and not t.is_conj()
        and not t.is_neg()
        and all(type(n) is int for n in (*t.shape, *t.stride(), t.storage_offset()))
    )


def _snapshot(result: Any, outs: _Outputs) -> Any:
    """``result`` as plain data, or raise ``_NoKey`` (module docstring)."""
    t = type(result)
    if t is torch.Tensor:
        return _snapshot_tensor(result, outs)
    if t is tuple or t is list:
        return (t, tuple(_snapshot(r, outs) for r in result))
    if t in (int, bool, float, type(None), torch.Size):
        return ("c", result)
    raise _NoKey


def _snapshot_tensor(result: torch.Tensor, outs: _Outputs) -> tuple:
    if not _plain_tensor(result):
        raise _NoKey
    shape, stride, offset = tuple(result.shape), result.stride(), result.storage_offset()
    if id(result) in outs.index:  # an argument itself
        if not outs.may_alias:
            raise _NoKey
        return ("A", outs.index[id(result)])
    if id(result) in outs.seen:
        raise _NoKey
    outs.seen.add(id(result))
    storage = result.untyped_storage()._cdata
    if storage in outs.arg_storages:  # a view of an argument
        if not (outs.may_alias and result._is_view()):
            raise _NoKey  # detach(): shares the storage, no view
        of = [i for i in outs.arg_storages[storage] if outs.args[i].dtype == result.dtype]
        if not of:
            raise _NoKey
        return ("V", of[0], shape, stride, offset)
    if storage in outs.storages:
        raise _NoKey  # two outputs sharing one new storage
    outs.storages.add(storage)
    if not result._is_view():
        if offset != 0:
            raise _NoKey
        return ("T", shape, stride, result.dtype)
    base = result._base
    if (
        base is None
        or not _plain_tensor(base)
        or base._is_view()
        or base.storage_offset() != 0
        or base.dtype != result.dtype
    ):
        raise _NoKey
    return ("B", tuple(base.shape), base.stride(), base.dtype, shape, stride, offset)


def _fresh(snap: tuple, args: list[torch.Tensor]) -> Any:
    kind = snap[0]
    if kind == "T":
        return torch.empty_strided(snap[1], snap[2], dtype=snap[3], device="meta")
    if kind == "c":
        return snap[1]
    if kind == "A":
        return args[snap[1]]
    if kind == "V":
        return args[snap[1]].as_strided(snap[2], snap[3], snap[4])
    if kind == "B":
        base = torch.empty_strided(snap[1], snap[2], dtype=snap[3], device="meta")
        return base.as_strided(snap[4], snap[5], snap[6])
    return kind(_fresh(s, args) for s in snap[1])


class MetaResults:
    """One capture's meta results by key (module docstring)."""

    def __init__(self) -> None:
        self._results: dict[Any, tuple] = {}
        self.hits = 0

    def key(self, kind: str, target: object, args: list, kwargs: dict, grad: bool) -> Any:
        """The key of this op's meta evaluation, with what ``keep`` and ``get`` need of
        the call (its tensor arguments and their metadata); None: not reusable."""
        if not reusable_target(kind, target):
            return None
        tensors: dict[int, tuple[int, torch.Tensor]] = {}
        try:
            key = (
                kind,
                target,
                _key(args, tensors),
                _key(kwargs, tensors),
                grad,
                torch.get_default_dtype(),
            )
            hash(key)
        except (_NoKey, TypeError):
            return None
        ordered = [t for _, t in tensors.values()]
        in_place = _in_place(kind, target, kwargs)
        return key, ordered, in_place, [_metadata(t) for t in ordered]

    def get(self, key: Any) -> Any:
        """A new result equal to the one kept under ``key``, or None."""
        snap = self._results.get(key[0])
        if snap is None:
            return None
        try:
            with torch.no_grad():  # as the kept result was made: needing no grad
                result = _fresh(snap, key[1])
        except Exception:  # a view out of this argument's storage: the op runs
            return None
        self.hits += 1
        return result

    def get_known(self, key: Any, args: list, kwargs: dict) -> Any:
        """``get`` for an op known to have ``key[0]`` as its key (``key`` as ``key``
        gave it for alike arguments: a replayed call's op, call_reuse.py): its tensor
        arguments are collected in the key's order without building the key."""
        if key not in self._results:
            return None
        tensors: dict[int, torch.Tensor] = {}
        _collect(args, tensors)
        _collect(kwargs, tensors)
        return self.get((key, list(tensors.values())))

    def keep(self, key: Any, result: Any) -> None:
        if len(self._results) >= _MAX:
            return
        _, args, in_place, before = key
        unchanged = [_metadata(t) for t in args] == before
        try:
            snap = _snapshot(result, _Outputs(args, not in_place and unchanged))
        except _NoKey:
            return
        self._results[key[0]] = snap


__all__ = ["MetaResults", "reusable_target"]
