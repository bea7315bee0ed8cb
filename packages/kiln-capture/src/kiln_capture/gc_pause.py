"""The cyclic garbage collector paused while kiln-capture captures and compiles a frame.

Design note: "no full collections during a capture"
---------------------------------------------------
Capture and its backend allocate hundreds of thousands of short-lived objects (AST nodes,
FX nodes, meta tensors, sympy expressions), and most of what survives lives as long as
the compiled entry. Left on, the collector runs its young generations hundreds of times
during one capture, and once the survivors add up it runs a full collection, which walks
every object of the process (~400k after importing torch and transformers: ~0.2 s on
a loaded CPU). Whether a capture meets a full collection depends on how much it
allocates, so a deeper model paid for it and a shallower one did not (HF GPT-2 at 24
layers did, at 6 layers did not: most of why its cold first call grew with depth
beyond the work itself).

``paused()`` turns automatic collection off for the outermost capture on any thread and
back on when the last one ends, if it was on when the first began; nothing is collected
on the way out (the collector's own thresholds decide when it next runs, as they would
have without kiln). Garbage made in a capture that sits in reference cycles (a restarted
trace's graph) waits for that next collection: a capture's own size, never more.
``KILN_CAPTURE_GC_PAUSE=0`` leaves the collector alone.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0  # captures (and passes that pause it) running now, on every thread
_was_enabled = False  # whether the collector was on when the outermost one began


@contextlib.contextmanager
def paused(enabled: bool = True) -> Iterator[None]:
    """Automatic cyclic collection off inside the block (nested and concurrent blocks
    share one pause; the last to leave restores the collector's state)."""
    global _depth, _was_enabled
    if not enabled:
        yield
        return
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
