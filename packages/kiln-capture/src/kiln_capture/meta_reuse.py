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
from kiln_shapes.meta_memo import NotPlain, Outputs, fresh, snapshot

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
                result = fresh(snap, key[1])
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
            snap = snapshot(result, Outputs(args, not in_place and unchanged, aliases=False))
        except NotPlain:
            return
        self._results[key[0]] = snap


__all__ = ["MetaResults", "reusable_target"]
