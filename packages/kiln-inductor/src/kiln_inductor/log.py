"""Opt-in logging by topic: ``KILN_LOG=kernels,graphs,timings,fallbacks,layouts,cache``
(``all`` enables every topic; kiln-shapes' ``TopicLog``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from kiln_shapes.logs import TopicLog
from kiln_shapes.settings import parse_set

from .config import settings

_log = TopicLog("kiln_inductor", "[kiln:%(topic)s]", lambda: parse_set(settings.log))
_logger = _log.logger
_warned: set[str] = set()
enabled, log = _log.enabled, _log.log
# the warnings of the graph being compiled (the artifact cache replays them on a hit)
_collected: contextvars.ContextVar[list[tuple[str, str]] | None]
_collected = contextvars.ContextVar("kiln_inductor warnings", default=None)


@contextlib.contextmanager
def collect_warnings() -> Iterator[list[tuple[str, str]]]:
    """The ``(key, message)`` of every ``warn_once`` call inside the block, warned or not."""
    notes: list[tuple[str, str]] = []
    token = _collected.set(notes)
    try:
        yield notes
    finally:
        _collected.reset(token)


def warn_once(key: str, message: str) -> None:
    """Log ``message`` once per process (e.g. once per op that falls back to eager)."""
    notes = _collected.get()
    if notes is not None:
        notes.append((key, message))
    if key in _warned:
        return
    _warned.add(key)
    _logger.warning(message, extra={"topic": "warning"})  # KILN_LOG's handler prints topics
    log("fallbacks", message)
