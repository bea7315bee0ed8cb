"""Per-topic logging: ``KILN_LOG=graphs,guards,breaks,recompiles`` (``all`` enables every
topic; kiln-shapes' ``TopicLog``)."""

from __future__ import annotations

from kiln_shapes.logs import TopicLog

from kiln_capture.config import config

TOPICS = ("graphs", "guards", "breaks", "recompiles")
_log = TopicLog("kiln_capture", "[kiln %(topic)s]", lambda: config.log_topics)
enabled, log = _log.enabled, _log.log
