"""Opt-in logging by topic: ``KILN_LOG=kernels,graphs,timings,fallbacks,layouts`` (``all``
enables every topic; kiln-shapes' ``TopicLog``)."""

from __future__ import annotations

from kiln_shapes.logs import TopicLog
from kiln_shapes.settings import parse_set

from .config import settings

_log = TopicLog("kiln_inductor", "[kiln:%(topic)s]", lambda: parse_set(settings.log))
_logger = _log.logger
_warned: set[str] = set()
enabled, log = _log.enabled, _log.log


def warn_once(key: str, message: str) -> None:
    """Log ``message`` once per process (e.g. once per op that falls back to eager)."""
    if key in _warned:
        return
    _warned.add(key)
    _logger.warning(message, extra={"topic": "warning"})  # KILN_LOG's handler prints topics
    log("fallbacks", message)
