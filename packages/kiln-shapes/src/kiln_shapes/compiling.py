"""Whether one of kiln's compilers is running on this thread.

# Compiling outside the backend call

A capture engine calls its backend with capture off. kiln-aot compiles a training plan's
backward later, on its first call (kiln-aot's backward_variants.py), from inside
autograd, which may run in code a capture engine watches (the ``loss.backward()`` of a
captured frame, run eagerly after a break): the compiler's own Python (sympy, Triton)
must not be captured there. The compiler runs inside ``compiler_running()``, and
kiln-capture's frame hook leaves every frame alone while ``compiling()`` is true.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_tls = threading.local()


def compiling() -> bool:
    """True inside ``compiler_running()`` on this thread."""
    return getattr(_tls, "depth", 0) > 0


@contextmanager
def compiler_running() -> Iterator[None]:
    _tls.depth = getattr(_tls, "depth", 0) + 1
    try:
        yield
    finally:
        _tls.depth -= 1
