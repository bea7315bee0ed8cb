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


def _weight_grad(x, g):
    """A weight gradient's ``act(x).T @ g``: the computed value transposed into a matmul."""
    act = torch.ops.aten.mul.Tensor(torch.ops.aten.relu.default(x), 0.5)
    return (torch.ops.aten.mm.default(torch.ops.aten.permute.default(act, [1, 0]), g),)


def test_a_transposed_computed_matmul_operand_is_stored_in_its_own_shape():
    from kiln_inductor.graph import GraphLowering
    from kiln_inductor.ir.nodes import ComputedBuffer, ExternKernel, StorageView
    from kiln_inductor.testing import aten_graph

    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(12, 20, generator=g), torch.randn(12, 8, generator=g)]
    ir = GraphLowering(aten_graph(_weight_grad, inputs), inputs).run()
    (computed,) = [n for n in ir.nodes if isinstance(n, ComputedBuffer)]
    assert tuple(int(s) for s in computed.layout.stride) == (20, 1)  # written row by row
    (mm,) = [n for n in ir.nodes if isinstance(n, ExternKernel)]
    operand = mm.args[0]
    assert isinstance(operand, StorageView) and operand.buffer is computed
    assert tuple(int(s) for s in operand.layout.size) == (20, 12)
    assert tuple(int(s) for s in operand.layout.stride) == (1, 20)  # the library transposes
