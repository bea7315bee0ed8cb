"""Helpers for testing kiln-triton without a GPU.

``use_triton_for_cpu()`` routes CPU tensors to the Triton backend for the duration of a
``with`` block, so graphs of CPU tensors compile to Triton kernels that Triton's
interpreter runs (``TRITON_INTERPRET=1`` must be set before triton is imported). The
previous "cpu" backend (kiln-cpp, if imported) is restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kiln_inductor import register_backend, unregister_backend

from .backend import TritonBackend


@contextmanager
def use_triton_for_cpu() -> Iterator[TritonBackend]:
    backend = TritonBackend()
    previous = register_backend("cpu", backend)
    try:
        yield backend
    finally:
        if previous is None:
            unregister_backend("cpu")
        else:
            register_backend("cpu", previous)
