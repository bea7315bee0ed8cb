"""Autocast: the state a trace assumes, its guard, and tensor metadata computed under it.

Design note: "metadata under autocast"
--------------------------------------
Autocast casts an op's arguments in the dispatcher, above the Python key, and only
arguments that live on the autocast device. A meta tensor is never eligible, so an op
evaluated on the meta device under ``torch.autocast("cpu")`` would report the un-cast
dtype. While the trace's autocast state enables some device, each op's metadata is
therefore computed on ``DeviceMeta`` wrappers: tensors that report the real device
(autocast casts them as it would the real ones) and run every op that reaches them,
the casts included, on their meta tensor. The real autocast state is set to the trace's
for that one call, with the autocast weight cache off (it is keyed by tensor address and
the wrappers die after each op).

Composite ops (``scaled_dot_product_attention``'s math path, ``dropout``) make tensors of
their own with their input's options: on the wrapper's real device, where a real CUDA
tensor would be allocated and then meet a meta one ("Expected all tensors to be on the
same device": a graph break per op on the GPU, while the CPU, whose factories the
``torch.device("meta")`` context already redirects, was fine). ``device_meta_mode()``
therefore also intercepts every op below autocast, factories included: a requested device
becomes ``meta`` and the result a wrapper reporting it.

The state is a tuple of ``(device, dtype)`` for each device with autocast enabled; the
frame's state at entry is guarded (``current()``), since the same code traced with
autocast on and off gives different graphs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

DEVICES = ("cpu", "cuda")

AutocastState = tuple[tuple[str, torch.dtype], ...]


_any_enabled = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def current() -> AutocastState:
    """The calling thread's autocast state: ``(device, dtype)`` per enabled device.
    Evaluated by every guard function: the common "all off" answer takes one C call."""
    if not _any_enabled():
        return ()
    return tuple((d, torch.get_autocast_dtype(d)) for d in DEVICES if torch.is_autocast_enabled(d))


def with_device(state: AutocastState, device: str, dtype: torch.dtype, enabled: bool):
    """``state`` after entering ``torch.autocast(device, dtype, enabled=enabled)``."""
    rest = tuple((d, t) for d, t in state if d != device)
    if not enabled:
        return rest
    return tuple(sorted(rest + ((device, dtype),), key=lambda e: DEVICES.index(e[0])))


class DeviceMeta(torch.Tensor):
    """A meta tensor that reports a real device (see the design note above)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device) -> DeviceMeta:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            device=device,
            requires_grad=elem.requires_grad,
        )
        r.elem = elem.detach() if elem.requires_grad else elem
        return r

    @staticmethod
    def of(elem: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A wrapper of ``elem`` that is a leaf exactly when ``elem`` is one: an op's result
        that requires grad is not a leaf, and in-place ops on it (``ReLU(inplace=True)``
        after a batch norm under autocast) are allowed as they are in eager mode."""
        r = DeviceMeta(elem, device)
        if elem.is_leaf:
            return r
        with torch.enable_grad():  # under no_grad a clone would drop requires_grad
            return r.clone()

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run_on_meta(func, args, kwargs)


def _run_on_meta(func, args, kwargs):
    """``func`` on the meta tensors of its arguments (wrappers unwrapped, a real tensor
    replaced by a meta one of its metadata, a requested device by ``meta``); tensors in
    the result wrapped to report the device the arguments or the request named."""
    device = None

    def unwrap(t):
        nonlocal device
        if isinstance(t, DeviceMeta):
            device = device or t.device
            return t.elem
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            device = device or t.device
            return t.to("meta")
        return t

    args, kwargs = tree_map(unwrap, (args, dict(kwargs or {})))
    asked = kwargs.get("device")
    if asked is not None and torch.device(asked).type != "meta":
        device = torch.device(asked)
        kwargs["device"] = torch.device("meta")
    out = func(*args, **kwargs)
    if device is None:
        return out
    return tree_map(lambda t: DeviceMeta(t, device) if isinstance(t, torch.Tensor) else t, out)


class _DeviceMetaMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run_on_meta(func, args, kwargs)


def device_meta_mode() -> TorchDispatchMode:
    """Every op below autocast, factories included, runs on meta tensors (design note)."""
    return _DeviceMetaMode()


def to_meta(value):
    """Plain meta tensors for the wrappers in an op's result (requires_grad kept)."""

    def unwrap(t):
        if not isinstance(t, DeviceMeta):
            return t
        m = t.elem
        if t.requires_grad and not m.requires_grad:
            m = m.detach().requires_grad_(True)
            if not t.is_leaf:  # an op's result, not a leaf: in-place ops on it are allowed
                with torch.enable_grad():
                    m = m.clone()
        return m

    return tree_map(unwrap, value)


@contextlib.contextmanager
def autocast_as(state: AutocastState) -> Iterator[None]:
    """Set the real autocast state to ``state`` (weight cache off), restore it after."""
    saved = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in DEVICES]
    cache = torch.is_autocast_cache_enabled()
    wanted = dict(state)
    torch.set_autocast_cache_enabled(False)
    try:
        for d in DEVICES:
            torch.set_autocast_enabled(d, d in wanted)
            if d in wanted:
                torch.set_autocast_dtype(d, wanted[d])
        yield
    finally:
        for d, enabled, dtype in saved:
            torch.set_autocast_enabled(d, enabled)
            torch.set_autocast_dtype(d, dtype)
        torch.set_autocast_cache_enabled(cache)


__all__ = [
    "DEVICES",
    "AutocastState",
    "DeviceMeta",
    "autocast_as",
    "current",
    "device_meta_mode",
    "to_meta",
    "with_device",
]
