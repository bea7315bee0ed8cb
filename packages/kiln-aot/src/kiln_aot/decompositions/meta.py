"""Meta kernels for ATen ops torch ships without one, whose outputs' shapes follow from
their arguments' shapes: with a meta kernel they stay in the graph as library calls
(``Tracer.emit_library_call``) instead of failing the trace.

# Missing meta kernels

The tracer learns a library op's outputs by running it on meta tensors. ``geqrf`` and the
histogram ops have CPU/CUDA kernels only, so the trace used to fail on them (torch's own
fake tensors run the real kernel on zero-filled inputs instead). Their output shapes depend
only on shapes and int arguments, so each gets a meta kernel here, registered on import
through ``torch.library`` for the ``Meta`` key, and only where torch has none (a torch that
adds its own keeps it). The checks are eager's, with eager's messages, so a bad call fails
at trace time as it would eagerly. Strides are eager's: ``geqrf``'s ``a`` is batched
column-major (LAPACK's layout), everything else contiguous.

An op whose output *shape* depends on data (``nonzero``, ``unique``) cannot have one; those
stay ``Unsupported`` (``core_ops.DATA_DEPENDENT_OPS``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

_LIB = torch.library.Library("aten", "IMPL")  # kept alive: dropping it drops the kernels
REGISTERED: dict[str, Callable[..., Any]] = {}  # "op.overload" -> the kernel registered here


def _register(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload or "default", None)
        if op is not None and not op.has_kernel_for_dispatch_key(torch._C.DispatchKey.Meta):
            _LIB.impl(name, fn, "Meta")
            REGISTERED[name] = fn
        return fn

    return deco


def _column_major_strides(shape: list) -> list:
    """Strides of a batch of column-major matrices (the batch dims row-major)."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(range(len(shape))):
        strides[d] = step
        step = step * torch.sym_max(shape[d], 1)
    m = shape[-2]
    strides[-2], strides[-1] = 1, torch.sym_max(m, 1)
    return strides


@_register("geqrf")
def geqrf(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    torch._check(x.dim() >= 2, lambda: "torch.geqrf: input must have at least 2 dimensions.")
    torch._check(
        x.dtype.is_floating_point or x.dtype.is_complex,
        lambda: f"\"geqrf_cpu\" not implemented for '{_dtype_name(x.dtype)}'",
    )
    shape = list(x.shape)
    a = torch.empty_strided(shape, _column_major_strides(shape), dtype=x.dtype, device=x.device)
    tau = x.new_empty([*shape[:-2], torch.sym_min(shape[-2], shape[-1])])
    return a, tau


def _dtype_name(dtype: torch.dtype) -> str:
    """The name eager's dtype errors give (``Long`` for int64)."""
    names = {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char"}
    names.update({torch.uint8: "Byte", torch.bool: "Bool"})
    return names.get(dtype, str(dtype).removeprefix("torch."))


def _check_histogram(x: torch.Tensor, weight: torch.Tensor | None, dims: int) -> None:
    torch._check(
        x.dtype.is_floating_point,
        lambda: f"\"histogramdd\" not implemented for '{_dtype_name(x.dtype)}'",
    )
    torch._check(
        x.dim() >= 1 and x.shape[-1] == dims,
        lambda: (
            "histogramdd: The size of bins must be equal to the innermost dimension of the input."
        ),
    )
    if weight is not None:
        torch._check(
            tuple(weight.shape) == tuple(x.shape[:-1]),
            lambda: (
                "torch.histogramdd: if weight tensor is provided it should have the same "
                "shape as the input tensor excluding its innermost dimension, but got input with "
                f"shape {list(x.shape)} and weight with shape {list(weight.shape)}"
            ),
        )
        torch._check(
            weight.dtype == x.dtype,
            lambda: (
                "torch.histogramdd: if weight tensor is provided, input tensor and weight "
                f"tensor should have the same dtype, but got input({x.dtype}), and "
                f"weight({weight.dtype})"
            ),
        )


def _check_bin_counts(bins: list, name: str = "histogramdd") -> None:
    for d, n in enumerate(bins):
        torch._check(
            n > 0,
            lambda d=d, n=n: f"torch.{name}(): bins must be > 0, but got {n} for dimension {d}",
        )


def _check_bin_tensors(bins: list) -> None:
    for d, b in enumerate(bins):
        torch._check(
            b.dim() == 1,
            lambda d=d, b=b: (
                "torch.histogramdd: bins tensor should have one dimension, but got "
                f"{b.dim()} dimensions in the bins tensor for dimension {d}"
            ),
        )
        torch._check(
            b.numel() > 0,
            lambda d=d: (
                "torch.histogramdd: bins tensor should have at least 1 element, but got "
                f"0 elements in the bins tensor for dimension {d}"
            ),
        )


@_register("histogram.bin_ct")
def histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    # eager runs histogramdd on the input as one column (and the weight flattened)
    _check_histogram(x.reshape(-1, 1), None if weight is None else weight.reshape(-1), 1)
    _check_bin_counts([bins], "histogram")
    return x.new_empty([bins]), x.new_empty([bins + 1])


@_register("histogram.bins_tensor")
def histogram_bins_tensor(x, bins, *, weight=None, density=False):
    _check_histogram(x.reshape(-1, 1), None if weight is None else weight.reshape(-1), 1)
    _check_bin_tensors([bins])
    return x.new_empty([bins.numel() - 1]), x.new_empty([bins.numel()])


@_register("_histogramdd_bin_edges")
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    _check_histogram(x, weight, len(bins))
    _check_bin_counts(bins)
    return [x.new_empty([n + 1]) for n in bins]


@_register("_histogramdd_from_bin_cts")
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    _check_histogram(x, weight, len(bins))
    _check_bin_counts(bins)
    return x.new_empty(list(bins))


@_register("_histogramdd_from_bin_tensors")
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    _check_histogram(x, weight, len(bins))
    _check_bin_tensors(bins)
    return x.new_empty([b.numel() - 1 for b in bins])
