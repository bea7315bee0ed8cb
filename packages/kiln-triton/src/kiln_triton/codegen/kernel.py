"""generate_triton_kernel: one ``@triton.jit`` function for one fused group.

Kernel shapes
-------------
Every group's outer loops (shared by all members) are flattened into the ``x`` dimension:
each program handles ``XBLOCK`` consecutive outer iterations (``xindex``), unflattened into
the outer variables by ``//`` and ``%``. What sits inside the outer loops decides the shape:

* ``pointwise``: every block is pointwise with no inner loop, so the kernel is 1-D:
  ``xindex = xoffset + tl.arange(0, XBLOCK)``.
* ``persistent``: 2-D tiles ``[XBLOCK, RBLOCK]`` with ``RBLOCK`` covering the longest inner
  extent (a row fits a block). Each block (a reduction over its row, or a pointwise loop
  nest inside the outer loops) reads its row once; blocks over equal ranges use the same
  row variables, so a row loaded by the first block is reused by the next ones (softmax
  and layer_norm load ``x`` once). Reductions are ``tl.sum``/``tl.reduce`` over axis 1.
* ``looped``: like persistent, but each block loops over its extent in chunks of
  ``RBLOCK`` with ``[XBLOCK, RBLOCK]`` accumulators reduced at the end; Welford
  mean/variance takes two passes (sum, then squared deviations from the mean) so it is
  exact and cheap to combine.
* a scan (cumsum, cumprod) is a group of its own, shaped like a reduction over its
  scanned axis: persistent when that fits a block, looped with a carry otherwise
  (``codegen/scan.py``).
* a scatter (index_put, scatter_add, embedding_dense_backward...) is a group of its own
  and a pointwise kernel over its updates, one per lane (its serial loops outermost):
  ``tl.atomic_add`` or ``tl.store`` at the target element (``scatter``).

A reduction block with non-reduced inner ranges runs them as a sequential scalar loop
inside the program. Reduction results are ``[XBLOCK, 1]`` values that later blocks of the
same kernel read without touching memory (``forwarded``); a load of a buffer the kernel
stored earlier is preceded by a barrier. bfloat16/float16 values stay in their type
until a body converts them; indices are int32 unless a size or storage span needs int64.

Symbolic sizes
--------------
Sizes may be expressions of kiln_shapes' size symbols (``s0``, ``s1``, ...). A kernel takes
the symbols its text uses as int arguments after its pointers (and error row), converted
to int64 on entry; ``xnumel``, row lengths, masks and index arithmetic are expressions of
them, so one kernel serves every size. What was chosen from static sizes is chosen so
that it holds for every size: indexing is int64 (the symbols' ranges reach 2**63 - 2),
and masks are never dropped for a symbolic extent (nothing is known to divide it). The
launcher computes the grid from the sizes of each call (``runtime/launcher.py``).

Rows of symbolic length get two kernels in one module: ``kernel``, looped (any length),
and ``kernel_persistent``, persistent with the row masked by its length. A persistent
kernel needs ``RBLOCK`` (a compile-time constant) to cover the row, so the launcher picks
per size bucket: ``kernel_persistent`` with ``RBLOCK`` the bucket's row length when that
is within ``meta["persistent_limit"]`` (``persistent_limit``: the static rule's bounds),
``kernel`` otherwise. Both take the same arguments.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sympy
import torch

from kiln_inductor.index_check import check_number
from kiln_inductor.ir.nodes import Buffer, ComputedBuffer, Scatter
from kiln_inductor.ir.ops import ops_handler
from kiln_inductor.ir.symbols import (
    coefficients,
    is_size_symbol,
    product,
    simplify_index,
    size_symbols_in,
)
from kiln_inductor.scheduler.fuse import Block, FusedGroup

from ..errors import TritonCodegenError
from ..runtime.configs import looped_rows_divide, xblocks_divide
from .index import host_expr, print_index
from .triton_ops import TritonOpsHandler, TritonValue

HEADER = """import triton
import triton.language as tl

from kiln_triton.runtime import libm

"""
INT32_LIMIT = 2**31 - 1
_EVICT = "@evict@"  # marks a load in an r loop until its eviction hint is known
XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)


def _int(expr: Any, what: str) -> int:
    """``expr`` as an int, for code that has no symbolic form (matmul templates, which the
    backend refuses for symbolic shapes: ``TritonBackend.template_accepts``)."""
    expr = sympy.sympify(expr)
    if not expr.is_Integer:
        raise TritonCodegenError(
            f"a kernel over symbolic size {expr} ({what})",
            "this kernel shape is specialized to static sizes",
            "report it; meanwhile mark the dimension static (kiln.mark_static)",
        )
    return int(expr)


def is_static(expr: Any) -> bool:
    return bool(sympy.sympify(expr).is_Integer)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def block_extent(block: Block) -> sympy.Expr:
    """Elements of the block's r dimension: its inner loops (pointwise) or reduction."""
    ranges = block.inner if block.kind == "pointwise" else block.rranges
    return sympy.sympify(product(ranges))


def max_extent(extents: list[sympy.Expr]) -> sympy.Expr:
    """The longest of the rows (an int when all are static, else a sympy ``Max``)."""
    if all(is_static(e) for e in extents):
        return sympy.Integer(max([int(e) for e in extents], default=1))
    return sympy.Max(*extents) if len(extents) > 1 else extents[0]


def contiguous(sizes: list[sympy.Expr]) -> list[sympy.Expr]:
    """Row-major strides of ``sizes`` (static zeros count as one; a symbolic size that is
    zero at run time leaves no element to index)."""
    strides: list[sympy.Expr] = []
    acc: sympy.Expr = sympy.Integer(1)
    for n in reversed(sizes):
        strides.append(acc)
        acc = acc * (sympy.Integer(max(int(n), 1)) if is_static(n) else n)
    return list(reversed(strides))


# rows wider than this many bytes (of the widest input) are reduced in a loop: on the H200 a
# float32 layer_norm over (32768, 4096) took 0.262 ms persistent against 0.254 ms looped with
# eviction hints (torch.compile 0.259, a copy of the same bytes 0.259); bfloat16 rows of
# 4096 (8 KiB) stay persistent, 1.39x (layer_norm) and 2.3x (softmax) faster than torch.compile
PERSISTENT_MAX_BYTES = 8192


def persistent_limit(group: FusedGroup, persistent_max: int, buffers: dict[str, Buffer]) -> int:
    """The longest row (a power of two) a persistent kernel of ``group`` may reduce in one
    block under the rules of ``kernel_kind``; 0 where its rows always loop."""
    from .scan import scan_across_memory

    if scan_across_memory(group):
        return 0
    limit = persistent_max
    if group.inputs and not any(b.kind == "scan" for b in group.blocks):
        width = max(buffers[n].dtype.itemsize for n in group.inputs)
        limit = min(limit, PERSISTENT_MAX_BYTES // width)
    return 1 << (max(limit, 1).bit_length() - 1)  # a power of two at most the limit


def column_reduction(group: FusedGroup) -> bool:
    """Whether the group reduces along a strided axis while the innermost axis of its
    outputs is contiguous in the buffers it reads (sums over the rows of a row-major matrix:
    bias and norm-weight gradients, the pieces of a split reduction). Its loads coalesce
    along x, not along the row: launch configurations with wide XBLOCKs read whole lines
    (``runtime.configs``, ``meta["columns"]``)."""
    inner = [v for v, n in zip(group.outer_vars, group.outer) if n != 1]
    if not inner:
        return False
    x = inner[-1]
    found = False
    for block in group.blocks:
        if block.kind not in ("reduction", "welford") or not block.rvars:
            continue
        for node in block.nodes:
            for _, index in group.bound[node.name][3]:
                rvars = [v for v in block.rvars if index.has(v)]
                if not rvars:
                    continue
                if any(sympy.diff(index, v) == 1 for v in rvars) or sympy.diff(index, x) != 1:
                    return False
                found = True
    return found


def is_scatter(group: FusedGroup) -> bool:
    return bool(group.blocks) and group.blocks[0].kind == "scatter"


def kernel_kind(
    group: FusedGroup, persistent_max: int, buffers: dict[str, Buffer] | None = None
) -> str:
    if is_scatter(group) or all(b.kind == "pointwise" and not b.inner for b in group.blocks):
        return "pointwise"
    from .scan import scan_across_memory

    extents = [block_extent(b) for b in group.blocks]
    if not all(is_static(e) for e in extents):
        # a row of symbolic length loops: a persistent row needs RBLOCK >= its length, and
        # RBLOCK is a constant of the compiled kernel, the length one of the call
        return "looped"
    extent = max(int(e) for e in extents)
    if extent > persistent_max or scan_across_memory(group):
        return "looped"
    if buffers is not None and group.inputs:
        width = max(buffers[n].dtype.itemsize for n in group.inputs)
        if extent * width > PERSISTENT_MAX_BYTES and not any(
            b.kind == "scan" for b in group.blocks
        ):
            return "looped"
    return "persistent"


class TritonKernel:
    def __init__(
        self,
        group: FusedGroup,
        buffers: dict[str, Buffer],
        persistent_max: int,
        kind: str | None = None,
        name: str = "kernel",
    ):
        """``kind``: the kernel shape (default: ``kernel_kind``'s); ``name``: the
        function's (a module holds ``kernel`` and, for rows of symbolic length, the
        persistent ``kernel_persistent``)."""
        self.group, self.buffers, self.name = group, buffers, name
        self.kind = kind or kernel_kind(group, persistent_max, buffers)
        self.xnumel: sympy.Expr = sympy.sympify(product(group.outer))
        self.extent = max_extent([block_extent(b) for b in group.blocks])
        if is_scatter(group):  # one lane per update: its serial loops are x too
            self.xnumel = sympy.sympify(product([*group.outer, *group.blocks[0].rranges]))
            self.extent = sympy.Integer(1)
        # whether launch configurations and masks may be chosen from the sizes
        self.static = is_static(self.xnumel) and is_static(self.extent)
        self.rblock = next_power_of_2(max(int(self.extent), 1)) if is_static(self.extent) else 0
        self.size_args: tuple[str, ...] = ()  # the size symbols it takes (``generate``)
        # for rows of symbolic length: the longest row ``kernel_persistent`` takes (0: none)
        self.persistent_limit = 0
        self.lines: list[str] = []
        self.depth = 1
        self.ptrs: dict[str, tuple[str, torch.dtype]] = {}
        for k, name in enumerate(group.inputs):
            self.ptrs[name] = (f"in_ptr{k}", buffers[name].dtype)
        for k, name in enumerate(group.outputs):
            self.ptrs[name] = (f"out_ptr{k}", buffers[name].dtype)
        self.h = TritonOpsHandler(self, self.emit)
        self.forward: dict[tuple[str, Any], TritonValue] = {}
        self.extra_mask: str | None = None
        self.ctx_r: str | None = None  # the r mask of the current context, None: x only
        self.subs: dict[sympy.Symbol, Any] = {}
        self.ranges: dict[sympy.Symbol, Any] = {}
        self.xsyms: set[sympy.Symbol] = set()
        self.rsyms: set[sympy.Symbol] = set()
        self.scalar_syms: set[sympy.Symbol] = set()
        self.canon: dict[tuple[Any, ...], list[Any]] = {}
        self.outer_strides: dict[sympy.Symbol, Any] = {}
        self.unsynced: set[str] = set()  # stored since the last barrier
        self.int64 = self._needs_int64()
        self.source = ""
        # loads in r loops: (buffer, loop) -> whether the index varies with x (rows); the
        # eviction hint of each is decided once the whole kernel is known (``_evictions``)
        self.loop = -1  # the r loop being generated (-1: none)
        self.loops = 0
        self.loop_loads: dict[tuple[str, int], bool] = {}
        self.checks: list[Any] = []  # index checks (kiln_inductor.index_check), numbered from 1

    def meta(self) -> dict[str, Any]:
        """What launch configurations depend on (``runtime.configs``): ints, or for sizes
        that are symbolic, Python expressions of the size arguments the launcher evaluates
        on each call (``runtime.launcher.SizedLaunch``)."""

        def value(e: sympy.Expr) -> int | str:
            return int(e) if is_static(e) else host_expr(e)

        meta = {
            "kind": self.kind,
            "xnumel": value(self.xnumel),
            "rblock": self.rblock,
            "extent": value(self.extent),
        }
        if self.kind != "pointwise" and column_reduction(self.group):
            meta["columns"] = True
        return meta

    def _needs_int64(self) -> bool:
        spans = [sympy.sympify(self.buffers[n].layout.storage_span()) for n in self.ptrs]
        numel = self.xnumel * sympy.Max(self.extent, 1)
        if not all(is_static(v) for v in (numel, *spans)):
            return True  # symbols range up to 2**63 - 2: no size is provably small
        return max([int(numel), *[int(v) for v in spans]]) > INT32_LIMIT

    # -- emitting ----------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    @contextmanager
    def scope(self, header: str) -> Iterator[None]:
        self.emit(header)
        self.depth += 1
        saved = (dict(self.h.cache), dict(self.forward), dict(self.canon))
        try:
            yield
        finally:
            self.h.cache, self.forward, self.canon = saved
            self.depth -= 1

    # -- indices, loads and stores -----------------------------------------------------------
    def _canonical(self, index: Any) -> Any:
        expr = simplify_index(sympy.expand(sympy.sympify(index).xreplace(self.subs)), self.ranges)
        # size symbols are scalars of the program (its arguments), like a scalar loop's
        self.scalar_syms |= {s for s in expr.free_symbols if is_size_symbol(s)}
        return self._flatten_outer(expr)

    def _flatten_outer(self, expr: Any) -> Any:
        """Write ``sum(stride_k * x_k)`` over all outer variables with their contiguous
        strides as ``xindex`` itself: the common contiguous case, where re-deriving the
        flat index from ``//`` and ``%`` would hide its contiguity."""
        if len(self.outer_strides) < 2:
            return expr
        co = coefficients(expr, list(self.outer_strides))
        if co is None or any(co[0][k] != st for k, st in enumerate(self.outer_strides.values())):
            return expr
        return XINDEX + co[1]

    def index_text(self, index: Any) -> str:
        """``index`` printed and broadcast to the current context's shape."""
        expr = self._canonical(index)
        text = print_index(expr)
        syms = expr.free_symbols - self.scalar_syms
        known = self.xsyms | self.rsyms
        full = any(s not in known for s in syms)  # an indirect index: a loaded value
        has_x = full or bool(syms & self.xsyms)
        has_r = full or bool(syms & self.rsyms)
        if self.ctx_r is None:
            return text if has_x else f"({text} + xzero)"
        return text if has_x and has_r else f"({text} + xrzero)"

    def mask_text(self) -> str:
        mask = "xmask" if self.ctx_r is None else f"(xmask & {self.ctx_r})"
        return mask if self.extra_mask is None else f"({mask} & {self.extra_mask})"

    def forwarded(self, name: str, index: Any) -> TritonValue | None:
        return self.forward.get((name, self._canonical(index)))

    def load_expr(self, name: str, index: Any) -> tuple[str, str, torch.dtype]:
        if name not in self.ptrs:
            raise TritonCodegenError(
                f"a load of {name}",
                "the kernel reads a register-only buffer at an index it was not computed at",
                "this is a kiln-triton bug; please report it with KILN_DEBUG_DIR dumps",
            )
        if name in self.unsynced:
            # another thread of this program may have stored it: wait for all stores
            self.emit("tl.debug_barrier()")
            self.unsynced.clear()
        ptr, dtype = self.ptrs[name]
        text = self.index_text(index)
        mask = self.mask_text()
        if self.loop >= 0:
            key = (name, self.loop)
            syms = self._canonical(index).free_symbols - self.scalar_syms
            per_row = any(s not in self.rsyms for s in syms)  # x, or a loaded value
            self.loop_loads[key] = self.loop_loads.get(key, False) or per_row
            mask += f"{_EVICT}{name}:{self.loop}{_EVICT}"
        return f"{ptr} + {text}", mask, dtype

    def _evictions(self, source: str) -> str:
        """Eviction hints of loads in r loops (a looped reduction reads its rows once per
        loop): a buffer read again in a later loop of this kernel, or read by every row
        (weights), is kept in L2 (``evict_last``); its last read of per-row data streams
        through (``evict_first``)."""
        last = {}
        for name, loop in self.loop_loads:
            last[name] = max(last.get(name, -1), loop)
        for (name, loop), per_row in self.loop_loads.items():
            keep = not per_row or loop < last[name]
            hint = f', eviction_policy="{"evict_last" if keep else "evict_first"}"'
            marker = f"{_EVICT}{name}:{loop}{_EVICT}, other=0)"
            source = source.replace(marker, f", other=0{hint})")
        return source

    def store(self, node: ComputedBuffer, value: TritonValue, index: Any) -> None:
        value = self.h.to_dtype(value, node.dtype)
        self.forward[(node.name, self._canonical(index))] = value
        if node.name in self.group.local:
            return
        ptr, _ = self.ptrs[node.name]
        self.emit(f"tl.store({ptr} + {self.index_text(index)}, {value}, {self.mask_text()})")
        self.unsynced.add(node.name)

    # -- the kernel --------------------------------------------------------------------------
    def check_code(self, check: Any) -> int:
        return check_number(self.checks, check)

    def generate(self) -> str:
        g = self.group
        with ops_handler(self.h):
            self.prologue()
            for k, block in enumerate(g.blocks):
                self.block(k, block)
        self.size_args = size_symbols_in("\n".join(self.lines))
        return HEADER + self.render(self.size_args)

    def render(self, size_args: tuple[str, ...]) -> str:
        """The ``@triton.jit`` function (after ``generate``) taking ``size_args``."""
        # sizes that vary between calls (kiln_shapes' symbols) are int arguments, int64
        # in the kernel: Triton passes small ints as int32, and products of them overflow
        widen = [f"    {s} = tl.cast({s}, tl.int64)" for s in size_args]
        params = [
            *(p for p, _ in self.ptrs.values()),
            # a kernel with index checks takes its error row (int64 [check, index]) after
            # its tensors, then its sizes
            *(["index_err"] if self.checks else []),
            *size_args,
            "XBLOCK: tl.constexpr",
            "RBLOCK: tl.constexpr",
        ]
        head = f"@triton.jit\ndef {self.name}({', '.join(params)}):\n"
        return self._evictions(head + "\n".join([*widen, *self.lines]) + "\n")

    def prologue(self) -> None:
        pid = "tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)"
        shape = "[XBLOCK]" if self.kind == "pointwise" else "[XBLOCK, 1]"
        arange = "tl.arange(0, XBLOCK)" + ("" if self.kind == "pointwise" else "[:, None]")
        self.emit(f"xoffset = {pid} * XBLOCK")
        self.emit(f"xindex = xoffset + {arange}")
        if self.static and xblocks_divide(self.meta()):
            # constant: Triton drops it from loads and stores
            self.emit(f"xmask = tl.full({shape}, 1, tl.int1)")
        else:
            self.emit(f"xmask = xindex < {print_index(self.xnumel)}")
        self.emit(f"xzero = tl.zeros({shape}, tl.int32)")
        if self.kind != "pointwise":
            self.emit("rbase = tl.arange(0, RBLOCK)[None, :]")
            self.emit("xrzero = tl.zeros([XBLOCK, RBLOCK], tl.int32)")
        if is_scatter(self.group):
            self.define_scatter_vars()
            return
        self.define_outer_vars()

    def define_scatter_vars(self) -> None:
        """A scatter's lanes: its serial loops outermost, then its outer loops (an
        embedding gradient's lanes along the contiguous row, not across ids)."""
        g, block = self.group, self.group.blocks[0]
        syms = [*block.rvars, *g.outer_vars]
        sizes = [sympy.sympify(s) for s in (*block.rranges, *g.outer)]
        for v, n in zip(syms, sizes):
            self.ranges[v] = n
        self._define_vars("xindex", syms, sizes, self.xsyms)
        self.xsyms.add(XINDEX)
        self.ranges[XINDEX] = (
            sympy.Integer(max(int(self.xnumel), 1)) if is_static(self.xnumel) else self.xnumel
        )

    def define_outer_vars(self) -> sympy.Expr:
        """Emit the outer variables from ``xindex``; returns their flat contiguous index."""
        g = self.group
        sizes = [sympy.sympify(s) for s in g.outer]
        for v, n in zip(g.outer_vars, sizes):
            self.ranges[v] = n
        self._define_vars("xindex", list(g.outer_vars), sizes, self.xsyms)
        strides = contiguous(sizes)
        self.outer_strides = {v: st for v, n, st in zip(g.outer_vars, sizes, strides) if n != 1}
        self.xsyms.add(XINDEX)
        self.ranges[XINDEX] = (
            sympy.Integer(max(int(self.xnumel), 1)) if is_static(self.xnumel) else self.xnumel
        )
        return sum((v * st for v, st in zip(g.outer_vars, strides)), sympy.Integer(0))

    def _define_vars(
        self, flat: str, syms: list[sympy.Symbol], sizes: list[Any], into: set[sympy.Symbol]
    ) -> None:
        """Emit ``sym = flat // stride % size`` for each dimension; size-1 dims become 0
        (a symbolic size is never assumed to be 1: its ``% size`` is emitted)."""
        sizes = [sympy.sympify(n) for n in sizes]
        strides = contiguous(sizes)
        nontrivial = [k for k, n in enumerate(sizes) if n != 1]
        for k, (v, n, st) in enumerate(zip(syms, sizes, strides)):
            if n == 1:
                self.subs[v] = sympy.Integer(0)
                continue
            expr = flat if st == 1 else f"({flat} // {print_index(st)})"
            if k != nontrivial[0]:
                expr = f"({expr} % {print_index(n)})"
            self.emit(f"{v.name} = {expr}")
            into.add(v)

    # -- blocks ------------------------------------------------------------------------------
    def block(self, k: int, block: Block) -> None:
        if block.kind == "scatter":
            self.scatter(block)
            return
        if block.kind == "pointwise":
            if not block.inner:
                self.pointwise(block, {})
            else:
                self.r_region(k, block, list(block.vars), list(block.inner), self.pointwise)
            return
        if not block.inner:
            self.reduction(k, block)
            return
        sizes = [sympy.sympify(s) for s in block.inner]
        with self.scope(f"for yflat{k} in range(0, {print_index(product(sizes))}):"):
            for v, n in zip(block.vars, sizes):
                self.ranges[v] = n
            scalars: set[sympy.Symbol] = set()
            self._define_vars(f"yflat{k}", list(block.vars), sizes, scalars)
            self.scalar_syms |= scalars
            self.reduction(k, block)

    def r_region(self, k: int, block: Block, syms: list[Any], ranges: list[Any], body: Any) -> None:
        """Run ``body(block, subs)`` over the r dimension of ``block`` (its ``syms`` over
        ``ranges``): once with a full row (persistent) or in a loop of RBLOCK chunks."""
        sizes = [sympy.sympify(s) for s in ranges]
        n = sympy.sympify(product(sizes))
        if self.kind == "persistent":  # a row of symbolic length: RBLOCK covers it too
            key = tuple(sizes)
            if key not in self.canon:
                t = len(self.canon)
                canon = [
                    sympy.Symbol(f"r{t}_{j}", integer=True, nonnegative=True)
                    for j in range(len(sizes))
                ]
                for c, s in zip(canon, sizes):
                    self.ranges[c] = s
                self.emit(f"rmask{t} = rbase < {print_index(n)}")
                self._define_vars("rbase", canon, sizes, self.rsyms)
                self.canon[key] = [self.subs.get(c, c) for c in canon] + [f"rmask{t}", "rbase"]
            *canon, mask, flat = self.canon[key]
            subs = dict(zip(syms, canon))
            saved, self.ctx_r = self.ctx_r, mask
            try:
                body(block, subs, flat)
            finally:
                self.ctx_r = saved
            return
        with self.scope(f"for roffset in range(0, {print_index(n)}, RBLOCK):"):
            self.emit("rindex = roffset + rbase")
            if (
                is_static(self.extent)
                and is_static(n)
                and looped_rows_divide(int(n), int(self.extent))
            ):
                # constant: Triton drops it from loads
                self.emit("rmask = tl.full([1, RBLOCK], 1, tl.int1)")
            else:
                self.emit(f"rmask = rindex < {print_index(n)}")
            for v, s in zip(syms, sizes):
                self.ranges[v] = s
            self._define_vars("rindex", syms, sizes, self.rsyms)
            saved, self.ctx_r = self.ctx_r, "rmask"
            outer_loop, self.loop = self.loop, self.loops
            self.loops += 1
            try:
                body(block, {}, "rindex")
            finally:
                self.ctx_r, self.loop = saved, outer_loop

    def _vars(self, node: ComputedBuffer, subs: dict[Any, Any]) -> tuple[list[Any], list[Any], Any]:
        vars_, rvars, store, _ = self.group.bound[node.name]
        allsubs = {**self.subs, **subs}
        # a node's index is a block variable or, for an access fusion reordered, an
        # expression of several (``(128*y1_0 + 256*x0 + y1_1) // 32768 % 2``): substituted
        # inside, not only looked up (a looked-up expression kept the block's own variables,
        # undefined where the block runs in the r dimension of a persistent kernel)
        vs = [sympy.sympify(v).xreplace(allsubs) for v in vars_]
        rvs = [sympy.sympify(v).xreplace(allsubs) for v in rvars]
        return vs, rvs, sympy.sympify(store).xreplace(subs)

    def pointwise(self, block: Block, subs: dict[Any, Any], flat: str = "") -> None:
        # outputs written over an input of the kernel (``group.aliases``) are stored after
        # every member of the block read what it needs (kiln-cpp's pointwise_body)
        deferred = []
        for node in block.nodes:
            vs, _, store = self._vars(node, subs)
            value = node.body.inner_fn(vs)  # type: ignore[union-attr]
            if node.name in self.group.aliases and node.name not in self.group.local:
                value = self.h.to_dtype(value, node.dtype)
                self.forward[(node.name, self._canonical(store))] = value
                deferred.append((node, value, store))
            else:
                self.store(node, value, store)
        for node, value, store in deferred:
            self.store(node, value, store)

    def scatter(self, block: Block) -> None:
        """One update per lane (kiln_inductor.lowering.scatter): ``tl.atomic_add`` (lanes
        of one program, or of two, may reach one element) or ``tl.store``; a lane with a
        bad index writes nothing."""
        (node,) = block.nodes
        body = node.body
        assert isinstance(body, Scatter)
        vs, _, _ = self._vars(node, {})
        target, value, bad = self.h.scatter_update(body, vs)
        value = self.h.to_dtype(value, node.dtype)
        ptr, _ = self.ptrs[node.name]
        at = self.index_text(node.layout.index(target))
        mask = self.mask_text()
        if bad:
            mask = f"({mask} & ({' | '.join(bad)} == 0))"
        if body.mode == "add":
            self.emit(f'tl.atomic_add({ptr} + {at}, {value}, {mask}, sem="relaxed")')
        else:
            self.emit(f"tl.store({ptr} + {at}, {value}, {mask})")

    # -- reductions --------------------------------------------------------------------------
    def reduction(self, k: int, block: Block) -> None:
        """A reduction or scan block (their loops over the r dimension are the same)."""
        from .reduction import ReductionCodegen
        from .scan import ScanCodegen

        gen = ScanCodegen if block.kind == "scan" else ReductionCodegen
        gen(self, k, block).generate()


def generate_triton_kernel(
    group: FusedGroup, buffers: dict[str, Buffer], persistent_max: int
) -> TritonKernel:
    """The group's kernel; for rows of symbolic length, its module also holds the persistent
    variant ``kernel_persistent`` (module docstring, "Symbolic sizes")."""
    kernel = TritonKernel(group, buffers, persistent_max)
    kernel.source = kernel.generate()
    limit = persistent_limit(group, persistent_max, buffers)
    if kernel.kind != "looped" or is_static(kernel.extent) or limit < 2:
        return kernel
    variant = TritonKernel(group, buffers, persistent_max, "persistent", "kernel_persistent")
    variant.generate()
    if variant.checks != kernel.checks:  # the error rows' numbering must be the same
        return kernel
    sizes = size_symbols_in(" ".join([*kernel.size_args, *variant.size_args]))
    kernel.source = HEADER + kernel.render(sizes) + "\n\n" + variant.render(sizes)
    kernel.size_args, kernel.persistent_limit = sizes, limit
    return kernel
