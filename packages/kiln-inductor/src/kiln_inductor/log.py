"""Opt-in logging by topic: ``KILN_LOG=kernels,graphs,timings,fallbacks``."""

from __future__ import annotations

import logging
import sys

from .config import read_config

_logger = logging.getLogger("kiln_inductor")
_warned: set[str] = set()


def enabled(topic: str) -> bool:
    return topic in read_config().log_topics


def log(topic: str, message: str) -> None:
    """Print ``message`` to stderr when ``topic`` is switched on by KILN_LOG."""
    if enabled(topic):
        print(f"[kiln:{topic}] {message}", file=sys.stderr)


def warn_once(key: str, message: str) -> None:
    """Log ``message`` once per process (e.g. once per op that falls back to eager)."""
    if key in _warned:
        return
    _warned.add(key)
    _logger.warning(message)
    log("fallbacks", message)
