"""How a lowering declines a case: the op then runs as a library call (a fallback kernel)."""

from __future__ import annotations

from ..errors import LoweringUnsupported


def unsupported(why: str) -> Exception:
    return LoweringUnsupported(why)
