"""Helpers for testing kiln-triton without a GPU.

``use_triton_for_cpu()`` routes CPU tensors to the Triton backend for the duration of a
``with`` block, so graphs of CPU tensors compile to Triton kernels that Triton's
interpreter runs (``TRITON_INTERPRET=1`` must be set before triton is imported). The
previous "cpu" backend (kiln-cpp, if imported) is restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kiln_inductor import register_backend, registered_backends
from kiln_inductor.errors import NoBackendError

from .backend import TritonBackend


class _NoBackend:
    """Stands in for "no backend registered" (kiln-inductor has no unregister)."""

    name = "none"

    def __init__(self, device_type: str):
        self.device_type = device_type

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise NoBackendError(self.device_type)

    codegen_kernel = load_kernels = call_line = _fail


@contextmanager
def use_triton_for_cpu() -> Iterator[TritonBackend]:
    previous = registered_backends().get("cpu")
    backend = TritonBackend()
    register_backend("cpu", backend)
    try:
        yield backend
    finally:
        register_backend("cpu", previous if previous is not None else _NoBackend("cpu"))
