"""Shape rules of indexing that capture and tracing must agree on."""

from __future__ import annotations

from collections.abc import Sequence


def uniform_masked_write(
    x: Sequence[int], mask: Sequence[int], value: Sequence[int]
) -> tuple[int, ...] | None:
    """For ``x[mask] = value`` with one boolean ``mask`` over ``x``'s leading dims: the
    shape to view ``value`` as when every selected element or row gets the same value
    (``()`` for one element; else one row broadcast over the dims after the mask's, a
    leading 1 dropped), so that the write is ``where(mask, value, x)`` whatever the mask
    holds. None when ``value`` has values per selected row (its shape depends on how many
    the mask selects) or the mask does not cover ``x``'s leading dims."""
    if tuple(mask) != tuple(x[: len(mask)]):
        return None
    numel = 1
    for v in value:
        numel *= v
    if numel == 1:
        return ()
    rest, row = tuple(x[len(mask) :]), tuple(value)
    if len(row) == len(rest) + 1 and row[0] == 1:
        row = row[1:]
    if len(row) > len(rest) or any(v not in (1, r) for v, r in zip(reversed(row), reversed(rest))):
        return None
    return row


__all__ = ["uniform_masked_write"]
