"""Typed settings of kiln-capture, declared once in ``CaptureConfig`` with kiln-shapes'
settings helper.

``config.<name>`` reads the environment when asked (never a snapshot taken at import);
``config.scope(name=value)`` overrides settings for a block, and assigning
``config.<name>`` (tests' ``monkeypatch.setattr``) overrides one for the process. Only the
capture path reads them (cache misses, graph breaks, logging), never a cache hit.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln_shapes.settings import Setting, Settings, setting


@dataclass(frozen=True)
class CaptureConfig:
    cache_size_limit: int = setting(
        "KILN_CACHE_SIZE_LIMIT",
        8,
        "cache entries per code object; past it the frame runs eagerly (logged)",
        affects_cache=True,
    )
    loop_resume_limit: int = setting(
        "KILN_LOOP_RESUME_LIMIT",
        64,
        "graph breaks inside one loop resumed in a chain of continuations; past it the rest "
        "of the frame runs eagerly (logged)",
        affects_cache=True,
    )
    raise_internal: bool = setting(
        "KILN_CAPTURE_RAISE_INTERNAL",
        False,
        "raise kiln-capture's own bugs instead of running the frame eagerly (tests set it)",
    )
    cache_dir: str = setting(
        "KILN_CACHE_DIR",
        "",
        "kiln's cache directory (unset: $XDG_CACHE_HOME/kiln, else ~/.cache/kiln); "
        "kiln-capture keeps generated guard code under its capture/ folder",
    )
    capture_cache: bool = setting(
        "KILN_CAPTURE_CACHE",
        True,
        "keep generated guard and entry code on disk (code_cache.py), so that a process "
        "meeting the same frame again loads it instead of generating and compiling it; "
        "0: make it in every process",
    )
    capture_frames: bool = setting(
        "KILN_CAPTURE_FRAMES",
        True,
        "keep whole captures on disk (frame_store.py): a process meeting the same frame "
        "with the same code and guards runs its compiled graph without tracing it; 0: "
        "capture in every process (KILN_CAPTURE_CACHE=0 turns this off too)",
    )
    gc_pause: bool = setting(
        "KILN_CAPTURE_GC_PAUSE",
        True,
        "no automatic cyclic garbage collection while a frame is captured and compiled "
        "(gc_pause.py: a full collection walks every object of the process); 0: the "
        "collector runs as it would without kiln",
    )
    reuse_calls: bool = setting(
        "KILN_CAPTURE_REUSE_CALLS",
        True,
        "a module call of the same class, forward and argument metadata as an earlier "
        "call in the same capture (a transformer's next layer) is replayed from that "
        "call's recording instead of evaluated again (call_reuse.py); 0: every call is "
        "evaluated",
        affects_cache=True,
    )
    log_topics: frozenset[str] = setting(
        "KILN_LOG", frozenset(), "comma-separated log topics: graphs, guards, breaks, recompiles"
    )


config: Settings[CaptureConfig] = Settings("kiln-capture", CaptureConfig)
SETTINGS: dict[str, Setting] = config.declared


def _read() -> CaptureConfig:
    """Every setting as the environment gives it now (no overrides)."""
    return config.read()
