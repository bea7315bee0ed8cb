"""Value ranges that prove an indirect access in range (no check generated)."""

from __future__ import annotations

import sympy
import torch

from kiln_inductor.index_check import value_range
from kiln_inductor.ir.nodes import Pointwise
from kiln_inductor.ir.ops import ops

CPU = torch.device("cpu")


def _pw(size, fn, dtype=torch.int64):
    return Pointwise(CPU, dtype, tuple(sympy.Integer(s) for s in size), fn)


def test_arange_positions_are_bounded():
    # arange(0, 10, 2), computed in float64 and cast, as the lowering does
    v = _pw(
        (5,),
        lambda i: ops.to_dtype(
            ops.add(
                ops.constant(0, torch.float64),
                ops.mul(ops.index_expr(i[0], torch.float64), ops.constant(2, torch.float64)),
            ),
            torch.int64,
        ),
    )
    assert value_range(v, {}) == (0, 8)


def test_clamp_of_unknown_values_is_bounded():
    load = lambda i: ops.load("ids", i[0])  # an input: any int64
    assert value_range(_pw((4,), load), {}) is None
    clamped = _pw(
        (4,),
        lambda i: ops.minimum(
            ops.maximum(load(i), ops.constant(0, torch.int64)), ops.constant(7, torch.int64)
        ),
    )
    assert value_range(clamped, {}) == (0, 7)
    assert value_range(
        _pw((4,), lambda i: ops.remainder(load(i), ops.constant(16, torch.int64))), {}
    ) == (0, 15)


def test_fractions_and_float_inputs_are_unknown():
    assert (
        value_range(_pw((3,), lambda i: ops.constant(0.5, torch.float32), torch.float32), {})
        is None
    )
    assert (
        value_range(
            _pw(
                (3,),
                lambda i: ops.truediv(
                    ops.index_expr(i[0], torch.int64), ops.constant(2, torch.int64)
                ),
            ),
            {},
        )
        is None
    )


def test_library_op_index_check_raises_the_cpu_kernels_exception():
    """What the wrapper runs before a library op with indices on a GPU (here on CPU
    tensors, which the wrapper leaves to ATen itself)."""
    import pytest

    from kiln_inductor.index_check import check_library_indices

    aten = torch.ops.aten
    y, v = torch.randn(6), torch.randn(2)
    check_library_indices(aten.index_put.default, (y, [torch.tensor([1, -6])], v), {})
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        check_library_indices(aten.index_put.default, (y, [torch.tensor([1, 9])], v), {})
    x = torch.randn(3, 4)
    check_library_indices(aten.scatter_add.default, (x, 1, torch.tensor([[3]]), x), {})
    with pytest.raises(RuntimeError):
        check_library_indices(aten.scatter_add.default, (x, 1, torch.tensor([[-1]]), x), {})
