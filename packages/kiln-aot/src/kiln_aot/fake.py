"""kiln's fake tensor: shape, stride, dtype and the *real* device, and no data.

# Fake tensors

A ``FakeTensor`` is a wrapper tensor subclass whose TensorImpl reports the real device
(``cuda:0``, ``cpu``) while an inner tensor on the ``meta`` device carries the metadata and
runs shape inference: every ATen op on fakes runs on the meta tensors, so nothing is
computed. Outside a trace, ops on fakes simply return new fakes (so a compiler may run
shape computations on a node's ``meta["val"]``); inside ``kiln_aot.trace`` the tracer
(``kiln_aot.op_tracer``) intercepts them and records graph nodes.
"""

from __future__ import annotations

from typing import Any

import torch
from kiln_shapes import meta as shapes_meta
from kiln_shapes.unbacked import RULES
from torch.utils._python_dispatch import _disable_current_modes

from kiln_aot.argmap import iter_leaves, map_args

aten = torch.ops.aten


class FakeTensor(torch.Tensor):
    """A data-less tensor: ``.shape/.stride()/.dtype/.device`` are real, the data is absent.

    ``meta`` is the inner meta-device tensor; ``trace_state`` is the tracer's bookkeeping
    while a trace is running (None otherwise).
    """

    meta: torch.Tensor
    trace_state: Any

    @staticmethod
    def __new__(cls, meta: torch.Tensor, device: torch.device, requires_grad: bool = False):
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            meta.size(),
            strides=meta.stride(),
            storage_offset=meta.storage_offset(),
            dtype=meta.dtype,
            layout=meta.layout,
            device=device,
            requires_grad=requires_grad,
        )
        r.meta = meta
        r.trace_state = None
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:  # never touches data
        return f"FakeTensor(shape={tuple(self.shape)}, stride={self.stride()}, dtype={self.dtype}, device={self.device})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        state = _first_state(args, kwargs)
        if state is not None and state.tracer.active:
            return state.tracer.dispatch(func, args, kwargs)
        return run_on_meta(func, args, kwargs)


def _first_state(args: tuple, kwargs: dict) -> Any:
    for a in iter_leaves((args, kwargs)):
        if isinstance(a, FakeTensor) and a.trace_state is not None:
            return a.trace_state
    return None


def fake_like(
    t: torch.Tensor, *, requires_grad: bool = False, device: torch.device | None = None
) -> FakeTensor:
    """A fake with ``t``'s shape, stride, storage offset, dtype and device (``device``
    for a meta tensor that stands for a tensor on another device, e.g. a capture's
    symbolic example value)."""
    if isinstance(t, FakeTensor):
        return FakeTensor(t.meta, t.device, requires_grad)
    if t.device.type == "meta" and device is not None:
        meta = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")
        if t.storage_offset() != 0:
            meta = meta.as_strided(t.size(), t.stride(), t.storage_offset())
        return FakeTensor(meta, torch.device(device), requires_grad)
    if t.storage_offset() == 0:
        meta = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")
    else:
        numel = t.untyped_storage().nbytes() // max(t.element_size(), 1)
        base = torch.empty(numel, dtype=t.dtype, device="meta")
        meta = base.as_strided(t.size(), t.stride(), t.storage_offset())
    return FakeTensor(meta, t.device, requires_grad)


def contiguous_fake(shape, dtype: torch.dtype, device: torch.device) -> FakeTensor:
    # made outside any dispatch mode: a trace must not record it (with symbolic sizes the
    # tracer would take it for an op of the program)
    with _disable_current_modes():
        meta = torch.empty(shape, dtype=dtype, device="meta")
    return FakeTensor(meta, torch.device(device))


def to_meta(x: Any) -> Any:
    """Map fakes (and real tensors) to meta tensors, devices to ``meta``; leave others."""
    if isinstance(x, FakeTensor):
        return x.meta
    if isinstance(x, torch.Tensor):
        return fake_like(x).meta
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def output_device(func: Any, args: tuple, kwargs: dict) -> torch.device:
    """The device an op's outputs live on: an explicit ``device=`` wins, then the first
    non-CPU tensor argument (a CPU scalar tensor may mix with CUDA tensors), then CPU."""
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    first = None
    for a in iter_leaves((args, kwargs)):
        if isinstance(a, torch.Tensor):
            if a.device.type != "cpu":
                return a.device
            first = first or a.device
    return first or torch.device("cpu")


def run_on_meta(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` for shapes only and wrap the meta results as fakes on the real device.
    Symbolic sizes are computed symbolically (``kiln_shapes.meta``)."""
    device = output_device(func, args, kwargs)
    m_args, m_kwargs = map_args(to_meta, (args, kwargs))
    if "device" in m_kwargs:
        m_kwargs["device"] = torch.device("meta")
    if func in RULES or shapes_meta.has_symbolic((m_args, m_kwargs)):
        out = shapes_meta.run(func, m_args, m_kwargs, reenter=shapes_meta.SymbolicMetaMode())
    else:
        out = func(*m_args, **m_kwargs)
    return map_args(lambda o: FakeTensor(o, device) if isinstance(o, torch.Tensor) else o, out)
