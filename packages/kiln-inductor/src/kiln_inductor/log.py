"""Opt-in logging by topic: ``KILN_LOG=kernels,graphs,timings,fallbacks,layouts``."""

from __future__ import annotations

import logging
import sys

from .config import read_config

_logger = logging.getLogger("kiln_inductor")
_warned: set[str] = set()


def enabled(topic: str) -> bool:
    return topic in read_config().log_topics


def log(topic: str, message: str) -> None:
    """Log ``message`` under ``topic`` on the ``kiln_inductor`` logger (the record carries
    ``topic``, which ``python -m kiln report`` sorts by); printed to stderr when ``topic``
    is switched on by KILN_LOG, a debug record otherwise."""
    if enabled(topic):
        if not _logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("[kiln:%(topic)s] %(message)s"))
            _logger.addHandler(handler)
            _logger.setLevel(logging.INFO)
        _logger.info(message, extra={"topic": topic})
    else:
        _logger.debug("[%s] %s", topic, message)


def warn_once(key: str, message: str) -> None:
    """Log ``message`` once per process (e.g. once per op that falls back to eager)."""
    if key in _warned:
        return
    _warned.add(key)
    _logger.warning(message, extra={"topic": "warning"})  # KILN_LOG's handler prints topics
    log("fallbacks", message)
