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

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sympy
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


def index_check(
    dim: int,
    size: Any,
    *,
    wrap: bool,
    error: type[Exception] = IndexError,
    message: str = OUT_OF_BOUNDS,
    index: Any = None,
) -> IndexCheck | None:
    """The check of an indirect access made by the op being lowered now, or None when
    checks are off (``KILN_CHECK_INDICES=0``), when ``index`` (the index TensorValue) is
    provably in range (positions from ``arange``, clamped values: ``value_range``), or when
    the node says its indices were checked against this bound before
    (``meta["kiln_indices_checked"]``: kiln-aot marks a backward's ``embedding_dense_backward``
    whose forward ``embedding`` read the same indices from the same table)."""
    if not read_config().check_indices:
        return None
    from .lowering.context import current_node

    node = current_node()
    if node is not None and node.meta.get("kiln_indices_checked"):
        return None
    if index is not None and sympy.sympify(size).is_Integer:
        bounds = value_range(index)
        low = -int(size) if wrap else 0
        if bounds is not None and low <= bounds[0] and bounds[1] < int(size):
            return None
    op = str(node.target) if node is not None else "an indexing op"
    return IndexCheck(op, dim, size, wrap, error, message, source_line(node))


def check_number(checks: list[IndexCheck], check: IndexCheck) -> int:
    """The 1-based number of ``check`` among a kernel's ``checks`` (appended if new): what a
    failing kernel reports and ``raise_index_error`` looks up."""
    if check not in checks:
        checks.append(check)
    return checks.index(check) + 1


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
    report does not depend on timing).

    The wrapper calls ``start()`` right after the last kernel that writes a row: on a GPU it
    queues a copy of the rows into page-locked host memory and records an event, without
    waiting. It calls ``finish()`` just before the graph returns: the host waits for that
    event only, so the rest of the graph is already queued behind it and the device never
    idles for the check (an embedding, a graph's first kernel, is long done by the time the
    host has queued the rest). A failed check raises there, before the call returns its
    outputs; kernels clamp bad indices, so the kernels still queued read and write only
    inside their tensors. During CUDA graph capture both are skipped; the runner calls
    ``check()`` after each replay. On the CPU (the Triton interpreter) ``finish()`` reads
    the rows directly."""

    def __init__(
        self, device: torch.device, kernels: Sequence[tuple[Sequence[IndexCheck], Sequence[str]]]
    ):
        self.device = torch.device(device)
        self.tensor = torch.zeros(len(kernels), 2, dtype=torch.int64, device=device)
        self.rows = list(self.tensor)  # the kernels' arguments
        self.kernels = list(kernels)  # (checks, inputs written in place) per row
        self.host = None
        self.event: Any = None
        self.reader: Any = _UNSET  # a backend's native reader (register_host_reader)
        if self.tensor.is_cuda:
            self.host = torch.zeros(len(kernels), 2, dtype=torch.int64, pin_memory=True)
            self.event = torch.cuda.Event()
            try:
                self.host_codes: Any = self.host.numpy()[:, 0]
            except RuntimeError:  # torch without numpy
                self.host_codes = self.host[:, 0]

    def __reduce__(self) -> tuple:
        # a compiled graph kept on disk (runtime/artifacts.py) gets fresh rows, host memory
        # and event; its wrapper reaches the rows through this object (``rows[k]``)
        return (DeviceIndexErrors, (self.device, self.kernels))

    def _native(self) -> Any:
        if self.reader is _UNSET:
            factory = _HOST_READERS.get(self.device.type)
            self.reader = factory(self.host, self.tensor) if factory is not None else None
        return self.reader

    def start(self) -> None:
        """Queue the copy of the rows to the host (GPU); does not wait."""
        if self.host is None:
            return
        native = self._native()
        if native is not None:
            native.start()
            return
        if torch.cuda.is_current_stream_capturing():
            return
        self.host.copy_(self.tensor, non_blocking=True)
        self.event.record(torch.cuda.current_stream(self.device))

    def finish(self) -> None:
        """Wait for the copy ``start()`` queued and raise the first failed check's error."""
        t = self.tensor
        if self.host is None:  # CPU tensors (the Triton interpreter): read them directly
            self._raise_failed(t.tolist())
            return
        native = self._native()
        if native is not None:
            failed = native.finish()
            if failed:
                self._raise_failed(self.host.tolist())
            if failed is not None:
                return
        if torch.cuda.is_current_stream_capturing():
            deferred = getattr(_capture, "deferred", None)
            if deferred is not None and self not in deferred:
                deferred.append(self)
            return
        if native is not None:  # nothing was queued outside a capture: read now
            self.host.copy_(t)
        else:
            self.event.synchronize()
        if self.host_codes.any():
            self._raise_failed(self.host.tolist())

    def check(self) -> None:
        """``start()`` and ``finish()`` at once (after a CUDA graph replay)."""
        self.start()
        self.finish()

    def _raise_failed(self, rows: list[list[int]]) -> None:
        for row, (code, value) in enumerate(rows):
            if code:
                self.tensor.zero_()
                sites, written = self.kernels[row]
                raise_index_error(sites, code, value, written)


_capture = threading.local()
_UNSET = object()
_HOST_READERS: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {}


def register_host_reader(
    device_type: str, factory: Callable[[torch.Tensor, torch.Tensor], Any]
) -> None:
    """A backend's native read of error rows on ``device_type``: ``factory(host, rows)``
    (page-locked host memory and the device rows, both ``(n, 2)`` int64) returns an object
    whose ``start()`` queues the rows' copy to ``host`` and an event on the current stream
    (nothing while the stream is being captured) and whose ``finish()`` waits for it and
    returns whether a check failed (None when ``start()`` queued nothing), or None to keep
    torch's copy and event. kiln-triton registers its C reader for "cuda"."""
    _HOST_READERS[device_type] = factory


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


# -- value ranges: indices no check is needed for ------------------------------------------


class _Unknown(Exception):
    pass


_ANY = (-math.inf, math.inf)


class _RangeHandler:
    """Evaluates a body to the interval ``(low, high)`` of its values, for integer-valued
    bodies: constants, index expressions (loop variables in their ranges), arithmetic,
    casts, min/max (so clamps) and selects, and loads of computed buffers (their own bodies,
    recursively); other loads are unbounded. An op that may make a value non-integral
    (division, a fractional constant, transcendental functions) makes it unknown."""

    def __init__(self, ranges: dict[sympy.Symbol, tuple[int, int]], buffers: dict, depth: int):
        self.ranges, self.buffers, self.depth = ranges, buffers, depth

    def constant(self, value: Any, dtype: Any) -> tuple[float, float]:
        v = float(value)
        if not v.is_integer():
            raise _Unknown
        return v, v

    def index_expr(self, expr: Any, dtype: Any) -> tuple[float, float]:
        expr = sympy.expand(sympy.sympify(expr))
        low = high = 0
        for term in sympy.Add.make_args(expr):
            coeff, rest = term.as_coeff_Mul()
            if rest == 1:
                low, high = low + int(coeff), high + int(coeff)
            elif rest in self.ranges and coeff.is_Integer:
                a, b = (int(coeff) * v for v in self.ranges[rest])
                low, high = low + min(a, b), high + max(a, b)
            else:
                raise _Unknown
        return low, high

    def load(self, name: str, index: Any) -> tuple[float, float]:
        from .ir.nodes import ComputedBuffer, Pointwise

        buf = self.buffers.get(name)
        if isinstance(buf, ComputedBuffer) and isinstance(buf.body, Pointwise):
            bounds = value_range(buf.body, self.buffers, self.depth + 1)
            if bounds is not None:
                return bounds
        if buf is not None and (buf.dtype.is_floating_point or buf.dtype == torch.bool):
            raise _Unknown  # may hold fractions
        return _ANY

    def to_dtype(
        self, x: tuple[float, float], dtype: Any, src_dtype: Any = None
    ) -> tuple[float, float]:
        if dtype == torch.bool:
            raise _Unknown
        exact = 2.0**24 if dtype in (torch.float32,) else 2.0**53
        if dtype in (torch.float16, torch.bfloat16):
            exact = 2.0**8
        if dtype.is_floating_point and max(abs(x[0]), abs(x[1])) > exact:
            raise _Unknown  # no longer exact integers
        if not dtype.is_floating_point:
            info = torch.iinfo(dtype)
            if x[0] < info.min or x[1] > info.max:
                return (info.min, info.max)  # wraps around
        return x

    def add(self, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
        return a[0] + b[0], a[1] + b[1]

    def sub(self, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
        return a[0] - b[1], a[1] - b[0]

    def mul(self, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
        products = [0.0 if 0 in (x, y) else x * y for x in a for y in b]
        return min(products), max(products)

    def neg(self, a: tuple[float, float]) -> tuple[float, float]:
        return -a[1], -a[0]

    def minimum(self, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
        return min(a[0], b[0]), min(a[1], b[1])

    def maximum(self, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
        return max(a[0], b[0]), max(a[1], b[1])

    def where(self, c: Any, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
        return min(a[0], b[0]), max(a[1], b[1])

    def remainder(self, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
        if b[0] > 0:  # Python's (and torch's) sign: the divisor's
            return (0, b[1] - 1) if a[0] < 0 or a[1] >= b[0] else a
        raise _Unknown

    def abs(self, a: tuple[float, float]) -> tuple[float, float]:
        if a[0] >= 0:
            return a
        return (0 if a[1] >= 0 else -a[1]), max(-a[0], a[1])

    def __getattr__(self, name: str) -> Any:
        def other(*args: Any, **kwargs: Any) -> Any:
            if name in ("lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or",
                        "logical_not", "isnan"):  # fmt: skip
                return (0, 1)  # a condition: only ``where`` reads it
            raise _Unknown

        return other


def value_range(value: Any, buffers: dict | None = None, depth: int = 0) -> tuple[int, int] | None:
    """The interval ``(low, high)`` every element of ``value`` (a TensorValue, or the body
    of a computed buffer) lies in, or None when it cannot be shown."""
    from .ir.ops import ops_handler
    from .ir.symbols import index_vars

    if depth > 8:
        return None
    if buffers is None:
        from .lowering.context import current_graph

        buffers = current_graph().ir.buffers
    size = [sympy.sympify(s) for s in value.size]
    if not all(s.is_Integer for s in size) or any(int(s) == 0 for s in size):
        return None
    ivars = index_vars("vr", len(size))
    ranges = {v: (0, int(s) - 1) for v, s in zip(ivars, size)}
    try:
        with ops_handler(_RangeHandler(ranges, buffers, depth)):
            out = value.make_loader()(list(ivars))
    except _Unknown:
        return None
    if not isinstance(out, tuple) or not all(math.isfinite(v) for v in out):
        return None
    return int(out[0]), int(out[1])


# -- library ops with indices, on devices whose kernels assert ------------------------------

aten = torch.ops.aten
# op packet -> (where its index tensors are, whether negative indices wrap): "list" for an
# ``indices`` list (dimension k of self), an int for the position of one index tensor
# (dimension ``dim``, the argument after self), "flat" for take (self's numel)
LIBRARY_INDEX_OPS: dict[Any, tuple[Any, bool]] = {
    aten.index: ("list", True),
    aten.index_put: ("list", True),
    aten._unsafe_index: ("list", True),
    aten._unsafe_index_put: ("list", True),
    aten.gather: (2, False),
    aten.scatter: (2, False),
    aten.scatter_add: (2, False),
    aten.scatter_reduce: (2, False),
    aten.index_select: (2, False),
    aten.index_add: (2, False),
    aten.index_copy: (2, False),
    aten.index_fill: (2, False),
    aten.index_reduce: (2, False),
    aten.take: ("flat", True),
}


def library_op_checks_indices(op: Any, device: torch.device) -> bool:
    """Whether the wrapper checks ``op``'s indices before calling it: on devices whose
    kernels answer a bad index with a device-side assert (CUDA), which ends the process's
    use of the device. CPU kernels raise eager's exception themselves."""
    return device.type != "cpu" and getattr(op, "overloadpacket", None) in LIBRARY_INDEX_OPS


def check_library_indices(op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Check a library op's index tensors against their dimensions (one device
    synchronization); a bad one raises the exception the op's CPU kernel raises. The
    wrapper calls it only where checks were on when it was generated."""
    self = args[0]
    if self.is_cuda and torch.cuda.is_current_stream_capturing():
        return  # a CUDA graph capture cannot read values (library ops are left unchecked)
    where, wrap = LIBRARY_INDEX_OPS[op.overloadpacket]
    pairs: list[tuple[torch.Tensor, int]] = []
    if where == "list":
        pairs = [(t, self.shape[k]) for k, t in enumerate(args[1]) if t is not None]
    elif where == "flat":
        pairs = [(args[1], self.numel())]
    else:
        dim = args[1] % max(self.dim(), 1)
        pairs = [(args[where], self.shape[dim] if self.dim() else 1)]
    pairs = [(t, n) for t, n in pairs if t.numel() and t.dtype not in (torch.bool, torch.uint8)]
    if not pairs:
        return
    bad = torch.stack([((t < (-n if wrap else 0)) | (t >= n)).any() for t, n in pairs]).any()
    if bool(bad):
        cpu = [
            [x.cpu() if isinstance(x, torch.Tensor) else x for x in a]
            if isinstance(a, (list, tuple))
            else a.cpu()
            if isinstance(a, torch.Tensor)
            else a
            for a in args
        ]
        op(*cpu, **kwargs)  # raises the CPU kernel's exception, with eager's message
        raise IndexError(f"kiln: an index of {op} is out of range")
