"""Process-wide counts since the last ``reset()``: what ``kiln_capture.stats()`` returns.

``explain`` records the details of one call; these counters cover every optimized
function, so that a benchmark or a facade can report graph and break counts.
"""

from __future__ import annotations

COUNTERS: dict[str, int] = {
    "graphs": 0,
    "breaks": 0,
    "recompiles": 0,
    "eager_frames": 0,
    "cache_limit_hits": 0,  # frames that reached KILN_CACHE_SIZE_LIMIT (and run eagerly)
    "region_boundaries": 0,  # calls of modules compiled as regions of their own (not breaks)
    "reused_calls": 0,  # module calls replayed from an earlier identical call's trace
}
# frames run eagerly by kiln's choice, by reason (cache size limit, internal error, ...)
EAGER_REASONS: dict[str, int] = {}
# graph breaks by kind, detail and user line ("B001 print() @ model.py:12")
BREAK_REASONS: dict[str, int] = {}


def bump(name: str) -> None:
    COUNTERS[name] += 1


def eager_frame(reason: str) -> None:
    COUNTERS["eager_frames"] += 1
    EAGER_REASONS[reason] = EAGER_REASONS.get(reason, 0) + 1


def graph_break(reason: str) -> None:
    COUNTERS["breaks"] += 1
    BREAK_REASONS[reason] = BREAK_REASONS.get(reason, 0) + 1


def clear() -> None:
    for key in COUNTERS:
        COUNTERS[key] = 0
    EAGER_REASONS.clear()
    BREAK_REASONS.clear()


def stats() -> dict[str, int]:
    """Graphs captured, graph breaks, recompiles, frames kiln chose to run eagerly and
    frames that reached the cache size limit, since the last ``reset()``."""
    return dict(COUNTERS)


def eager_reasons() -> dict[str, int]:
    """Why frames ran eagerly (``stats()["eager_frames"]``), with counts."""
    return dict(EAGER_REASONS)


def break_reasons() -> dict[str, int]:
    """The graph breaks of ``stats()["breaks"]`` by kind, detail and user line, with
    counts (a benchmark can say why without a second capture under ``explain``)."""
    return dict(BREAK_REASONS)
