"""ScanCodegen: the scan block of a Triton kernel (cumsum, cumprod).

A scan group is one ``Scan`` node: its outer loops (the other dimensions) are the kernel's
``x`` dimension and the scanned axis is its ``r`` dimension, as for a reduction. The body
(``inner_fn``, with any pointwise prologue the lowering inlined: ``cumsum(x * 2)``) is
evaluated over ``[XBLOCK, RBLOCK]`` tiles; lanes outside the masks hold the identity of
the combine (0 for sum, 1 for prod), so they change no valid prefix.

* persistent (the scanned extent fits one block): ``tl.cumsum``/``tl.cumprod`` over axis 1
  of the whole row, stored in the r context.
* looped (the extent does not fit, or the scanned axis is not the contiguous one: see
  ``scan_across_memory``): a ``[XBLOCK, 1]`` carry (the combine of every earlier chunk) is combined into
  each chunk's scan before it is stored, then replaced by the chunk's last lane. Masked
  lanes hold the identity, so the last lane is the chunk's total even in the tail chunk;
  it is read out exactly with a one-hot ``tl.sum`` (adding zeros), so the carry equals
  the value just stored.

Sub-32-bit integer and bool accumulators scan in int32 (what ``tl.cumsum`` promotes them
to) and are converted back: two's complement sums and products agree modulo 2**bits, and
a nonzero int32 sum or product of bools is their OR or AND.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kiln_inductor.ir.nodes import Scan
from kiln_inductor.ir.symbols import coefficients
from kiln_inductor.scheduler.fuse import Block, FusedGroup

from .triton_ops import TritonValue, literal, tl_type

if TYPE_CHECKING:
    from .kernel import TritonKernel

SCAN_FUNCTIONS = {"sum": "tl.cumsum", "prod": "tl.cumprod"}
COMBINE = {"sum": "+", "prod": "*"}
IDENTITY = {"sum": 0, "prod": 1}


def scan_across_memory(group: FusedGroup) -> bool:
    """Whether ``group`` scans along an axis that is not contiguous in its output while
    its outer loops are (``cumsum(x, 0)``). Such a scan loops even when its extent fits a
    block: a persistent ``[1, extent]`` tile would read one strided column per program,
    while looped ``[XBLOCK, RBLOCK]`` chunks read XBLOCK neighbouring elements per row."""
    if len(group.blocks) != 1 or group.blocks[0].kind != "scan":
        return False
    block = group.blocks[0]
    (node,) = block.nodes
    store = group.bound[node.name][2]
    co = coefficients(store, [*block.rvars, *group.outer_vars])
    if co is None or not group.outer_vars:
        return False
    r_stride, outer_strides = co[0][0], co[0][1:]
    return r_stride != 1 and any(st == 1 for st in outer_strides)


def scan_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type the scan runs in for an accumulator of ``dtype``."""
    if dtype == torch.bool or (not dtype.is_floating_point and dtype.itemsize < 4):
        return torch.int32
    return dtype


class ScanCodegen:
    def __init__(self, kernel: TritonKernel, k: int, block: Block):
        (node,) = block.nodes
        assert isinstance(node.body, Scan), node.name
        self.kernel, self.k, self.block, self.node = kernel, k, block, node
        self.body: Scan = node.body
        self.dtype = scan_dtype(self.body.dtype)
        self.identity = literal(IDENTITY[self.body.scan_type], self.dtype)

    def _tile(self, subs: dict[Any, Any]) -> tuple[TritonValue, Any]:
        """The body over the current tile, the identity where masked; and the store index."""
        kern, h = self.kernel, self.kernel.h
        vs, _, store = kern._vars(self.node, subs)
        v = h.to_dtype(h.to_dtype(self.body.inner_fn(vs), self.body.dtype), self.dtype)
        tile = h.value(f"tl.where({kern.mask_text()}, {v}, {self.identity})", self.dtype)
        return tile, store

    def _scan(self, tile: TritonValue) -> TritonValue:
        fn = SCAN_FUNCTIONS[self.body.scan_type]
        return self.kernel.h.value(f"{fn}({tile}, 1)", self.dtype)

    def _region(self, body: Any) -> None:
        b = self.block
        self.kernel.r_region(self.k, b, list(b.rvars), list(b.rranges), body)

    def generate(self) -> None:
        kern = self.kernel
        if kern.kind == "persistent":

            def persistent(block: Block, subs: dict[Any, Any], flat: str) -> None:
                tile, store = self._tile(subs)
                kern.store(self.node, self._scan(tile), store)

            self._region(persistent)
            return
        carry = f"carry{kern.h.count}"
        kern.h.count += 1
        kern.emit(f"{carry} = tl.full([XBLOCK, 1], {self.identity}, {tl_type(self.dtype)})")
        op = COMBINE[self.body.scan_type]

        def looped(block: Block, subs: dict[Any, Any], flat: str) -> None:
            tile, store = self._tile(subs)
            out = kern.h.value(f"({carry} {op} {self._scan(tile)})", self.dtype)
            kern.store(self.node, out, store)
            last = f"tl.where(rbase == RBLOCK - 1, {out}, 0)"
            kern.emit(f"{carry} = tl.sum({last}, 1)[:, None]")

        self._region(looped)
