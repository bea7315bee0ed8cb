"""Per-topic logging, the same in every package: ``KILN_LOG=graphs,breaks`` (``all`` turns
every topic on). A package makes one ``TopicLog`` with its logger's name, the prefix its
lines carry and where its enabled topics come from (its settings, read per call)::

    _log = TopicLog("kiln_aot", "[kiln_aot %(topic)s]", lambda: settings.log)
    enabled, log = _log.enabled, _log.log

A record carries its ``topic`` (``python -m kiln report`` sorts by it); a topic that is
off still goes to the logger at debug level, for whoever configured logging themselves.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Collection


class TopicLog:
    def __init__(self, name: str, prefix: str, topics: Callable[[], Collection[str]]):
        self.logger = logging.getLogger(name)
        self.prefix = prefix
        self.topics = topics

    def enabled(self, topic: str) -> bool:
        on = self.topics()
        return topic in on or "all" in on

    def log(self, topic: str, message: str) -> None:
        """Log ``message`` under ``topic``; printed to stderr when the topic is enabled."""
        if self.enabled(topic):
            if not self.logger.handlers:
                handler = logging.StreamHandler(sys.stderr)
                handler.setFormatter(logging.Formatter(f"{self.prefix} %(message)s"))
                self.logger.addHandler(handler)
                self.logger.setLevel(logging.INFO)
            self.logger.info(message, extra={"topic": topic})
        else:
            self.logger.debug("[%s] %s", topic, message)


__all__ = ["TopicLog"]
