"""Extern kernels get their inputs in the strides they were traced with (lowering/extern.py)."""

from __future__ import annotations

import torch

from kiln_inductor.lowering.extern import _dense_in_stride_order


def _strides(val: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in _dense_in_stride_order(val, val.device).stride)


def test_dense_layout_keeps_the_traced_dimension_order():
    q = torch.empty(2, 128, 3, 4, 16).select(2, 0).transpose(1, 2)  # a sliced query
    assert q.stride() == (24576, 16, 192, 1)
    assert _strides(q) == (8192, 16, 64, 1)


def test_broadcast_dimensions_go_outermost():
    # an additive mask expanded over the heads: CUDA's memory-efficient attention needs
    # its last dimension contiguous ("(*bias): last dimension must be contiguous")
    mask = torch.empty(2, 1, 128, 128).expand(2, 4, 128, 128)
    assert mask.stride() == (16384, 0, 128, 1)
    assert _strides(mask)[2:] == (128, 1)
    full = torch.empty(1, 1, 128, 128).expand(2, 4, 128, 128)
    assert _strides(full)[2:] == (128, 1)
