"""Typed settings of kiln-capture, read from the environment in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Setting:
    env: str
    default: object
    help: str
    affects_cache: bool


SETTINGS: dict[str, Setting] = {
    "cache_size_limit": Setting(
        "KILN_CACHE_SIZE_LIMIT",
        8,
        "cache entries per code object; past it the frame runs eagerly (logged)",
        affects_cache=True,
    ),
    "loop_resume_limit": Setting(
        "KILN_LOOP_RESUME_LIMIT",
        64,
        "graph breaks inside one loop resumed in a chain of continuations; past it the rest "
        "of the frame runs eagerly (logged)",
        affects_cache=True,
    ),
    "raise_internal": Setting(
        "KILN_CAPTURE_RAISE_INTERNAL",
        False,
        "raise kiln-capture's own bugs instead of running the frame eagerly (tests set it)",
        affects_cache=False,
    ),
    "log": Setting(
        "KILN_LOG",
        "",
        "comma-separated log topics: graphs, guards, breaks, recompiles",
        affects_cache=False,
    ),
}


@dataclass
class CaptureConfig:
    cache_size_limit: int = 8
    loop_resume_limit: int = 64
    log_topics: frozenset[str] = field(default_factory=frozenset)
    raise_internal: bool = False


def _read() -> CaptureConfig:
    limit = int(
        os.environ.get(SETTINGS["cache_size_limit"].env, SETTINGS["cache_size_limit"].default)
    )
    topics = os.environ.get(SETTINGS["log"].env, "")
    return CaptureConfig(
        raise_internal=os.environ.get(SETTINGS["raise_internal"].env, "0") == "1",
        cache_size_limit=limit,
        loop_resume_limit=int(
            os.environ.get(SETTINGS["loop_resume_limit"].env, SETTINGS["loop_resume_limit"].default)
        ),
        log_topics=frozenset(t.strip() for t in topics.split(",") if t.strip()),
    )


config: CaptureConfig = _read()
