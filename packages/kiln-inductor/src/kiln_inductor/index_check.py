"""Bounds checks of indirect accesses: what a kernel checks, and the error the caller gets.

An indirect access is a load whose address depends on loaded data (gather, index_select,
embedding, advanced indexing). A lowering that makes one passes an ``IndexCheck`` to
``ops.indirect_indexing(value, size, check)``: the op, the dimension, whether negative
indices wrap (``x[i]`` does, ``gather`` does not), and the exception eager PyTorch raises
(its type and message). Backends then generate, for every such access:

- the wrap (``i < 0 ? i + size : i``) where eager wraps;
- the check ``0 <= i < size``; a failing lane records the check's number and the bad value
  in the kernel's error slot and reads element 0 instead, so that no kernel ever reads
  outside a tensor;
- the report: kiln-cpp's kernel returns the check's number (0: every index was in range),
  kiln-triton's kernel writes it to the graph's error tensor; the wrapper turns it into
  eager's exception, naming the op and the user's source line (``raise_index_error``).

An index check never changes a result computed from good indices, and the compiled
function keeps working after a bad call. ``KILN_CHECK_INDICES=0`` (or
``options={"check_indices": False}``) turns the checks off; they are on by default.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .config import read_config
from .errors import source_line

OUT_OF_BOUNDS = "index {index} is out of bounds for dimension {dim} with size {size}"


@dataclass(frozen=True)
class IndexCheck:
    """One checked indirect access of a lowered op."""

    op: str  # the ATen op, e.g. "aten.gather.default"
    dim: int  # the dimension the index selects in
    size: Any  # that dimension's size (an int or a sympy expression)
    wrap: bool  # negative indices count from the end, as eager's indexing does
    error: type[Exception]  # what eager raises: IndexError or RuntimeError
    message: str  # eager's message, formatted with index, dim and size
    where: str = ""  # the user's source line

    def exception(self, value: int | None, note: str = "") -> Exception:
        text = self.message.format(
            index="?" if value is None else value, dim=self.dim, size=self.size
        )
        text += f"\n  (kiln: checked in the compiled kernel of {self.op}"
        if self.where:
            text += f" at {self.where}"
        text += ")"
        if note:
            text += f"\n  {note}"
        return self.error(text)

    def cache_text(self) -> str:
        """What kernel source depends on (not the source line: kernels are shared)."""
        return f"{self.dim}:{self.size}:{int(self.wrap)}"


def index_check(
    dim: int,
    size: Any,
    *,
    wrap: bool,
    error: type[Exception] = IndexError,
    message: str = OUT_OF_BOUNDS,
) -> IndexCheck | None:
    """The check of an indirect access made by the op being lowered now, or None when
    checks are off (``KILN_CHECK_INDICES=0``)."""
    if not read_config().check_indices:
        return None
    from .lowering.context import current_node

    node = current_node()
    op = str(node.target) if node is not None else "an indexing op"
    return IndexCheck(op, dim, size, wrap, error, message, source_line(node))


def raise_index_error(
    sites: Sequence[IndexCheck], code: int, value: int | None, written: Sequence[str] = ()
) -> None:
    """Raise the exception of check ``code`` (1-based in ``sites``) for ``value``.

    ``written``: graph inputs the failing kernel writes in place; they may be partly
    updated, which the message says."""
    note = ""
    if written:
        note = (
            f"the compiled graph writes its input(s) {', '.join(written)} in place in the same "
            "kernel: they may be partly updated"
        )
    if not 1 <= code <= len(sites):
        raise RuntimeError(f"kiln: an index check failed (code {code}) in a compiled kernel")
    raise sites[code - 1].exception(value, note)


class DeviceIndexErrors:
    """The error slots of a graph's GPU kernels that check indices: one row ``[check number,
    bad index]`` (int64, on the device) per such kernel, which the kernel receives as its
    last argument. A failing lane writes its row (atomic max of the check number, so the
    report does not depend on timing); the wrapper reads all rows once at the end of each
    call (one device synchronization, only in graphs with checked accesses). During CUDA
    graph capture the read is skipped; the runner calls ``check()`` after each replay."""

    def __init__(
        self, device: torch.device, kernels: Sequence[tuple[Sequence[IndexCheck], Sequence[str]]]
    ):
        self.tensor = torch.zeros(len(kernels), 2, dtype=torch.int64, device=device)
        self.rows = list(self.tensor)  # the kernels' arguments
        self.kernels = list(kernels)  # (checks, inputs written in place) per row

    def check(self) -> None:
        t = self.tensor
        if t.is_cuda and torch.cuda.is_current_stream_capturing():
            deferred = getattr(_capture, "deferred", None)
            if deferred is not None and self not in deferred:
                deferred.append(self)
            return
        for row, (code, value) in enumerate(t.tolist()):
            if code:
                t.zero_()
                sites, written = self.kernels[row]
                raise_index_error(sites, code, value, written)


_capture = threading.local()


@contextmanager
def deferred_checks() -> Iterator[list[DeviceIndexErrors]]:
    """Collect the index checks skipped while a CUDA graph is being captured: whoever
    replays the graph calls ``check()`` on each after every replay."""
    saved = getattr(_capture, "deferred", None)
    _capture.deferred = found = []
    try:
        yield found
    finally:
        _capture.deferred = saved
