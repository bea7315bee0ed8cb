"""kiln_shapes.indexing.uniform_masked_write: the value shapes of ``x[mask] = value`` that
every selected element or row gets alike, and the per-row ones that it refuses."""

from __future__ import annotations

import pytest
from kiln_shapes.indexing import uniform_masked_write


@pytest.mark.parametrize(
    "x, mask, value, row",
    [
        ((3, 5), (3,), (5,), (5,)),
        ((3, 5), (3,), (1, 5), (5,)),
        ((3, 5), (3,), (1,), ()),
        ((3, 5), (3, 5), (), ()),
        ((2, 3, 4), (2,), (3, 1), (3, 1)),
        ((3, 5), (3,), (2, 5), None),  # a row per selected row: depends on the mask
        ((3, 5), (3,), (4,), None),  # does not broadcast
        ((3, 5), (5,), (5,), None),  # the mask is not over the leading dims
    ],
)
def test_uniform_masked_write(x, mask, value, row):
    assert uniform_masked_write(x, mask, value) == row
