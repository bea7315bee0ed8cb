"""How a lowering declines a case: the op then runs eagerly as a fallback kernel."""

from __future__ import annotations


def unsupported(why: str) -> Exception:
    from ..graph import Unsupported

    return Unsupported(why)
