"""Lowerings of scans: cumsum and cumprod, as one ``Scan`` buffer each.

A scan is its own kernel: the scheduler gives it outer loops over the other dimensions
(parallel) and one inner loop along the scanned one. A kernel backend says it generates
scans with a true ``supports_scan`` attribute (kiln-triton's does); one that does not say
is taken to generate them on the CPU only (kiln-cpp's scans predate the attribute), and
with no backend registered yet (lowering alone, in tests) the CPU keeps scans. Elsewhere
the op runs eagerly (a fallback kernel).
"""

from __future__ import annotations

from typing import Any

import torch

from ..backend import registered_backends
from ..ir.nodes import Scan, TensorValue
from ..ir.ops import ops
from .context import current_graph
from .graph_unsupported import unsupported
from .registry import register_lowering
from .values import compute_dtype, normalize_dims, to_dtype

aten = torch.ops.aten


def backend_supports_scan(device: torch.device) -> bool:
    backend = registered_backends().get(device.type)
    return bool(getattr(backend, "supports_scan", device.type == "cpu"))


def _scan(x: TensorValue, dim: int, scan_type: str, dtype: torch.dtype | None) -> TensorValue:
    if not backend_supports_scan(x.device):
        raise unsupported(f"the kernel backend for {x.device.type} tensors generates no scans")
    if dtype is None:
        is_int = not x.dtype.is_floating_point and not x.dtype.is_complex
        dtype = torch.int64 if is_int else x.dtype
    if x.ndim == 0:
        return to_dtype(x, dtype)
    (axis,) = normalize_dims([dim], x.ndim)
    acc = compute_dtype(dtype)
    loader = x.make_loader()
    # eager converts the input to the output type, then accumulates in the wider type
    low = dtype != acc

    def inner(index: Any) -> Any:
        v = ops.to_dtype(loader(index), dtype)
        return ops.to_dtype(v, acc) if low else v

    scan = Scan(x.device, acc, tuple(x.size), axis, scan_type, inner)
    out = current_graph().realize_reduction(scan)
    return to_dtype(out, dtype)


@register_lowering(aten.cumsum)
def cumsum(x: TensorValue, dim: int, dtype: torch.dtype | None = None) -> TensorValue:
    return _scan(x, dim, "sum", dtype)


@register_lowering(aten.cumprod)
def cumprod(x: TensorValue, dim: int, dtype: torch.dtype | None = None) -> TensorValue:
    return _scan(x, dim, "prod", dtype)
