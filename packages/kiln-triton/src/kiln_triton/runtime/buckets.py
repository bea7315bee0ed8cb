"""Sizes of kernels with symbolic sizes: what a launch computes from the size arguments.

A kernel generated for symbolic sizes takes them as int arguments after its tensors
(``KernelSource.size_args``); its metadata holds ``xnumel`` and ``extent`` as Python
expressions of them (``codegen.index.host_expr``). On each call the launcher evaluates
them for the grid, and keys what it chose by the call's *bucket*: the next power of two
of each size. Autotuning runs once per bucket (winners cached on disk per bucket), so a
sequence length that grows one token at a time tunes about log2(n) times, not n times.

Triton compiles one binary per specialization of its int arguments (1 as a constant,
int32 or int64, divisible by 16 or not); ``int_specialization`` mirrors it, so a direct
launch replays the binary that was compiled for sizes like the current ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .configs import _np2

INT32 = 2**31
INT64 = 2**63


def bucket_of(sizes: Sequence[int]) -> tuple[int, ...]:
    """The next power of two of each size (0 and 1 are buckets of their own)."""
    return tuple(v if v <= 1 else _np2(v) for v in sizes)


def int_specialization(sizes: Sequence[int]) -> tuple[Any, ...]:
    """Triton's specialization of int kernel arguments, as its JIT decides it
    (``native_specialize_impl``): 1 becomes a constant; otherwise the type the value fits
    (int32, int64, uint64) and whether it is a multiple of 16."""
    out: list[Any] = []
    for v in sizes:
        if v == 1:
            out.append(1)
        else:
            kind = "i32" if -INT32 <= v < INT32 else "i64" if -INT64 <= v < INT64 else "u64"
            out.append((kind, v % 16 == 0))
    return tuple(out)


class SizedMeta:
    """``meta`` of a kernel with size arguments, evaluated at given sizes."""

    def __init__(self, meta: dict[str, Any]):
        self.meta = meta
        self.names: tuple[str, ...] = tuple(meta["size_args"])
        xnumel, extent = meta["xnumel"], meta.get("extent", 1)
        # expressions kiln-triton generated (codegen.index.host_expr) over the size names
        source = f"lambda {', '.join(self.names)}: ({xnumel}, {extent})"
        self._numels = eval(source, {"max": max, "min": min, "__builtins__": {}})

    def numels(self, sizes: Sequence[int]) -> tuple[int, int]:
        """(xnumel, longest row) at ``sizes``."""
        x, e = self._numels(*sizes)
        return int(x), int(e)

    def at(self, sizes: Sequence[int], looped: bool = False) -> dict[str, Any]:
        """``meta`` with ints for ``xnumel`` and ``extent`` at ``sizes`` (runtime.configs),
        and the function to run there: ``variant`` "kernel_persistent" (``kind``
        "persistent", ``rblock`` covering the rows) where the module has one whose
        ``persistent_limit`` the rows fit, unless ``looped``; else "kernel"."""
        x, e = self.numels(sizes)
        meta = {**self.meta, "xnumel": x, "extent": e, "variant": "kernel"}
        rblock = _np2(max(e, 1))
        if not looped and rblock <= self.meta.get("persistent_limit", 0):
            meta.update(kind="persistent", rblock=rblock, variant="kernel_persistent")
        return meta
