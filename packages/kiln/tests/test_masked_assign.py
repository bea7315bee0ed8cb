"""``x[mask] = value`` with a boolean mask: when every selected element or row gets the
same value (a number, a one-element tensor, or one row broadcast over the dims after the
mask's, with or without a leading 1) the result's shape does not depend on the mask, and
the write compiles as ``where(mask, value, x)`` in the graph (kiln-capture lets it through,
kiln-aot traces it); values per selected row are an ``index_put`` by the mask's nonzero
columns, whose count is a value of the data (issue #17)."""

from __future__ import annotations

import math

import pytest
import torch

import kiln


def _write(x, mask, value):
    x = x.clone()
    x[mask] = value
    return x * 2 + 1


@pytest.mark.parametrize(
    "x_shape, mask_shape, value",
    [
        ((3, 5), (3,), (5,)),
        ((3, 5), (3,), (1, 5)),
        ((3, 5), (3,), (1,)),
        ((3, 5), (3,), 2.5),
        ((3, 5), (3, 5), ()),
        ((2, 3, 4), (2, 3), (4,)),
        ((2, 3, 4), (2,), (3, 1)),
    ],
    ids=["row", "row_leading_1", "one_element", "number", "elementwise", "3d_row", "3d_broadcast"],
)
def test_uniform_masked_writes_compile_into_the_graph(x_shape, mask_shape, value):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=g)
    # alternating, so the write selects some elements (or rows) and leaves others
    mask = (torch.arange(math.prod(mask_shape)) % 2 == 0).reshape(mask_shape)
    assert mask.any()
    v = value if isinstance(value, float) else torch.randn(value, generator=g)
    kiln.reset()
    compiled = kiln.compile(_write)
    torch.testing.assert_close(compiled(x, mask, v), _write(x, mask, v))
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0 and stats["fallbacks"] == 0, stats


def test_values_per_selected_row_compile_through_the_masks_nonzero_columns():
    """Issue #17: a value per selected row is an index_put by the mask's nonzero columns
    (their count a value of the data); a mask selecting another count than there are
    values raises, as eager does (kiln's run-time check of the count)."""
    g = torch.Generator().manual_seed(1)
    x, mask = torch.randn(3, 5, generator=g), torch.tensor([True, False, True])
    values = torch.randn(2, 5, generator=g)
    kiln.reset()
    compiled = kiln.compile(_write)
    torch.testing.assert_close(compiled(x, mask, values), _write(x, mask, values))
    other = torch.tensor([False, True, True])  # the same count elsewhere: the same graph
    torch.testing.assert_close(compiled(x, other, values), _write(x, other, values))
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0 and stats["fallbacks"] == 0, stats
    assert stats["recompiles"] == 0
    three = torch.tensor([True, True, True])
    with pytest.raises(RuntimeError):
        _write(x, three, values)
    with pytest.raises(RuntimeError):
        compiled(x, three, values)
