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

Only results that are new and plain are kept: a tensor of class ``torch.Tensor`` on the
meta device, strided, at offset 0, not requiring grad (its ``grad_fn`` would differ), not
a view and sharing no storage with an argument (a view, ``detach()``, an op returning its
input or writing in place: the next call's result must alias the next call's input), or
numbers, ``None`` and ``torch.Size``, or tuples and lists of these with no tensor twice.
A reused result is a new meta tensor of the recorded shape, strides and dtype
(``empty_strided``): each node still has its own value, as a run of the kernel gives.
Errors are not kept (a failing op runs again and raises again), nor are warnings a
kernel emits (torch warns once per process anyway).
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


def _key(value: Any, tensors: dict[int, int], storages: set[int]) -> Any:
    t = type(value)
    if t is torch.Tensor:
        if value.layout is not torch.strided or value.is_conj() or value.is_neg():
            raise _NoKey
        if value.device.type != "meta":
            raise _NoKey
        storages.add(value.untyped_storage()._cdata)
        same = tensors.setdefault(id(value), len(tensors))
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
        return (t, tuple(_key(v, tensors, storages) for v in value))
    if t is torch.Size:
        return (t, tuple(value))
    if t is dict:
        return (dict, tuple((k, _key(v, tensors, storages)) for k, v in value.items()))
    if t is slice:
        return (slice, *(_key(p, tensors, storages) for p in (value.start, value.stop, value.step)))
    if value is Ellipsis:
        return ("...",)
    raise _NoKey


def _snapshot(result: Any, storages: set[int], seen: set[int]) -> Any:
    """``result`` as plain data, or raise ``_NoKey`` (module docstring)."""
    t = type(result)
    if t is torch.Tensor:
        if (
            result.requires_grad
            or result.layout is not torch.strided
            or result.device.type != "meta"
            or result.storage_offset() != 0
            or result._is_view()
            or result.is_conj()
            or result.is_neg()
            or id(result) in seen
        ):
            raise _NoKey
        shape, stride = tuple(result.shape), result.stride()
        if not all(type(n) is int for n in (*shape, *stride)):
            raise _NoKey  # sizes only the data gives (unbacked symbols)
        storage = result.untyped_storage()._cdata
        if storage in storages:
            raise _NoKey
        storages.add(storage)  # two outputs sharing one storage: not plain either
        seen.add(id(result))
        return ("T", shape, stride, result.dtype)
    if t is tuple or t is list:
        return (t, tuple(_snapshot(r, storages, seen) for r in result))
    if t in (int, bool, float, type(None), torch.Size):
        return ("c", result)
    raise _NoKey


def _fresh(snap: tuple) -> Any:
    kind = snap[0]
    if kind == "T":
        return torch.empty_strided(snap[1], snap[2], dtype=snap[3], device="meta")
    if kind == "c":
        return snap[1]
    return kind(_fresh(s) for s in snap[1])


class MetaResults:
    """One capture's meta results by key (module docstring)."""

    def __init__(self) -> None:
        self._results: dict[Any, tuple] = {}
        self.hits = 0

    def key(self, kind: str, target: object, args: list, kwargs: dict, grad: bool) -> Any:
        """The key of this op's meta evaluation, with the storages of its tensor
        arguments; None: not reusable."""
        if not reusable_target(kind, target):
            return None
        tensors: dict[int, int] = {}
        storages: set[int] = set()
        try:
            key = (
                kind,
                target,
                _key(args, tensors, storages),
                _key(kwargs, tensors, storages),
                grad,
                torch.get_default_dtype(),
            )
            hash(key)
        except (_NoKey, TypeError):
            return None
        return key, storages

    def get(self, key: Any) -> Any:
        """A new result equal to the one kept under ``key``, or None."""
        snap = self._results.get(key[0])
        if snap is None:
            return None
        self.hits += 1
        return _fresh(snap)

    def keep(self, key: Any, result: Any) -> None:
        if len(self._results) >= _MAX:
            return
        try:
            snap = _snapshot(result, set(key[1]), set())
        except _NoKey:
            return
        self._results[key[0]] = snap


__all__ = ["MetaResults", "reusable_target"]
