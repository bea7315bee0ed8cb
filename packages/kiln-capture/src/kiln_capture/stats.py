"""Process-wide counts since the last ``reset()``: what ``kiln_capture.stats()`` returns.

``explain`` records the details of one call; these counters cover every optimized
function, so that a benchmark or a facade can report graph and break counts.
"""

from __future__ import annotations

COUNTERS: dict[str, int] = {"graphs": 0, "breaks": 0, "recompiles": 0}


def bump(name: str) -> None:
    COUNTERS[name] += 1


def clear() -> None:
    for key in COUNTERS:
        COUNTERS[key] = 0


def stats() -> dict[str, int]:
    """Graphs captured, graph breaks and recompiles since the last ``reset()``."""
    return dict(COUNTERS)
