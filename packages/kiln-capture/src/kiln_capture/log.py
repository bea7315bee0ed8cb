"""Per-topic logging: ``KILN_LOG=graphs,guards,breaks,recompiles``."""

from __future__ import annotations

import logging

from kiln_capture.config import config

_logger = logging.getLogger("kiln_capture")
TOPICS = ("graphs", "guards", "breaks", "recompiles")


def enabled(topic: str) -> bool:
    return topic in config.log_topics or "all" in config.log_topics


def log(topic: str, message: str) -> None:
    """Log ``message`` under ``topic``; printed to stderr when the topic is enabled."""
    if enabled(topic):
        if not _logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[kiln %(topic)s] %(message)s"))
            _logger.addHandler(handler)
            _logger.setLevel(logging.INFO)
        _logger.info(message, extra={"topic": topic})
    else:
        _logger.debug("[%s] %s", topic, message)
