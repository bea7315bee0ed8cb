"""Per-topic logging: ``KILN_LOG=graphs,partition,timings`` (``all`` enables every topic;
kiln-shapes' ``TopicLog``)."""

from __future__ import annotations

from kiln_shapes.logs import TopicLog

from kiln_aot import config as _config

_log = TopicLog("kiln_aot", "[kiln_aot %(topic)s]", lambda: _config.settings.log)
enabled, log = _log.enabled, _log.log
