"""Per-topic logging: ``KILN_LOG=graphs,partition,timings`` (``all`` enables every topic)."""

from __future__ import annotations

import logging

from kiln_aot import config as _config

_logger = logging.getLogger("kiln_aot")


def enabled(topic: str) -> bool:
    topics = _config.settings.log
    return topic in topics or "all" in topics


def log(topic: str, message: str) -> None:
    """Log ``message`` under ``topic``; printed to stderr when the topic is enabled."""
    if enabled(topic):
        if not _logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[kiln_aot %(topic)s] %(message)s"))
            _logger.addHandler(handler)
            _logger.setLevel(logging.INFO)
        _logger.info(message, extra={"topic": topic})
    else:
        _logger.debug("[%s] %s", topic, message)
