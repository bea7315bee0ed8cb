"""generate_cpp_kernel: one C++ function for one fused group.

Shape of the code::

    extern "C" int64_t kernel(const float* __restrict__ in_ptr0, ..., float* __restrict__ out_ptr0)
    {
      #pragma omp parallel for collapse(k) if(work >= PARALLEL_WORK)   // the outer loops
      for (x0 ...) ... {
        // one inner loop nest per block, in order
        #pragma omp simd                                     // pointwise block
        for (y0_0 ...) { ...; out_ptr0[...] = tmp; }
        float acc3 = 0;                                      // reduction block
        #pragma omp simd reduction(+:acc3)
        for (z1_0 ...) { ...; acc3 = acc3 + tmp; }
      }
    }

Innermost loops carry ``#pragma omp simd`` (reductions with their reduction clause) so
that GCC vectorizes them; libmvec supplies vector math. A group without outer loops (a
reduction to a scalar) runs its reduction in a parallel region with per-thread partials
combined at the end. Welford reductions run in chunks: an exact two-pass mean/M2 per chunk
(vectorized), merged with Chan's formula.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sympy
import torch

from kiln_inductor.ir.nodes import Buffer, ComputedBuffer, Reduction, Scan
from kiln_inductor.ir.ops import ops_handler
from kiln_inductor.ir.symbols import coefficients, contiguous_strides, product, size_symbols_in
from kiln_inductor.scheduler.fuse import Block, FusedGroup, loop_var_ranges

from .config import read_cpp_config, stream_threshold
from .cpp_ops import STORAGE_TYPES, CppValue, ctype, literal, print_index
from .prefetch import plan_row_prefetch
from .prelude import PRELUDE
from .row_values import MAX_SCRATCH_BYTES, KernelOpsHandler, LoopScope, RowSharing
from .scatter import emit_scatter
from .streaming import plan_streamed_rows

PARALLEL_WORK = 32768  # elements of work below which a kernel runs on one thread
CHUNK = 256  # reduction chunk (Welford blocks and per-thread partials)
PARTIAL_LANES = 32  # partial sums of a row's float sum reductions (4 AVX2 vectors)
COLUMN_TILE = 64  # columns per tile of a column reduction (a cache line is 16 floats)


def canonical_loop_vars(group: FusedGroup) -> tuple[dict[sympy.Symbol, sympy.Symbol], list[int]]:
    """Blocks whose loops have equal extents get equal loop variables (``q<class>_<j>``), so
    that their equal values have equal keys (see row_values). Returns the renaming and each
    block's extents class."""
    classes: dict[tuple[str, ...], int] = {}
    rename: dict[sympy.Symbol, sympy.Symbol] = {}
    of_block: list[int] = []
    for block in group.blocks:
        extents = (*block.inner, *block.rranges)
        key = (block.kind == "welford", *(str(e) for e in extents))
        c = classes.setdefault(key, len(classes))
        of_block.append(c)
        for j, v in enumerate((*block.vars, *block.rvars)):
            rename[v] = sympy.Symbol(f"q{c}_{j}", integer=True, nonnegative=True)
    return rename, of_block


def _renamed(group: FusedGroup, rename: dict[sympy.Symbol, sympy.Symbol]) -> FusedGroup:
    def sub(e: Any) -> Any:
        return sympy.sympify(e).xreplace(rename)

    blocks = [
        dataclasses.replace(
            b, vars=tuple(rename[v] for v in b.vars), rvars=tuple(rename[v] for v in b.rvars)
        )
        for b in group.blocks
    ]
    bound = {
        name: (
            [sub(v) for v in vars_],
            [sub(v) for v in rvars],
            sub(store),
            [(b, sub(e)) for b, e in loads],
        )
        for name, (vars_, rvars, store, loads) in group.bound.items()
    }
    return dataclasses.replace(group, blocks=blocks, bound=bound)


class CppKernel:
    def __init__(
        self, group: FusedGroup, buffers: dict[str, Buffer], sharing: RowSharing | None = None
    ):
        self.rename, self.block_class = canonical_loop_vars(group)
        group = _renamed(group, self.rename)
        self.group, self.buffers = group, buffers
        self.lines: list[str] = []
        self.depth = 1
        self.ptrs: dict[str, tuple[str, torch.dtype]] = {}
        params = []
        for k, name in enumerate(group.inputs):
            dt = buffers[name].dtype
            self.ptrs[name] = (f"in_ptr{k}", dt)
            restrict = "" if name in group.aliases else " __restrict__"
            params.append(f"const {STORAGE_TYPES[dt]}*{restrict} in_ptr{k}")
        for k, name in enumerate(group.outputs):
            dt = buffers[name].dtype
            self.ptrs[name] = (f"out_ptr{k}", dt)
            restrict = "" if name in group.aliases else " __restrict__"
            params.append(f"{STORAGE_TYPES[dt]}*{restrict} out_ptr{k}")
        self.params = params
        self.streamed = plan_streamed_rows(group, buffers, stream_threshold(read_cpp_config()))
        self.sharing = sharing or RowSharing()
        self.h = KernelOpsHandler(self._pointer_of, self.emit, self.sharing)
        self.h.ranges = dict(zip(group.outer_vars, group.outer))

    def _pointer_of(self, name: str) -> tuple[str, torch.dtype]:
        if name not in self.ptrs:
            raise KeyError(
                f"kernel reads {name}, which is neither an argument nor computed before it"
            )
        return self.ptrs[name]

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    @contextmanager
    def scope(self, header: str | None = None, pragma: str | None = None) -> Iterator[None]:
        if pragma:
            self.emit(pragma)
        if header:
            self.emit(header + " {")
        else:
            self.emit("{")
        self.depth += 1
        saved = (dict(self.h.cache), dict(self.h.forwarded_exprs))
        try:
            yield
        finally:
            self.h.cache, self.h.forwarded_exprs = saved
            self.depth -= 1
            self.emit("}")

    # -- the kernel --------------------------------------------------------------------------
    def generate(self) -> str:
        g = self.group
        with ops_handler(self.h):
            if g.blocks and g.blocks[0].kind == "scatter":
                emit_scatter(self, g.blocks[0])
            elif not g.outer:
                for block in g.blocks:
                    self.block(block, parallel=True)
            elif self._column_tile():
                self.column_reduction(self._column_tile())
            else:
                self.outer_loops()
        # the kernel returns 0, or the number of the first index check that failed; sizes
        # that vary between calls (kiln_shapes' symbols) come after the pointers
        self.size_args = size_symbols_in("\n".join(self.lines))
        return PRELUDE + "\n" + self.function('extern "C" int64_t kernel')

    def function(self, head: str) -> str:
        """The generated function (after ``generate``) under the name and linkage
        ``head``."""
        body = [*("  " + line for line in self.h.prologue), *self.lines]
        if self.h.checks:
            body = ["  int64_t kiln_err = 0;", *body, "  return kiln_err;"]
        else:
            body = [*body, "  return 0;"]
        return f"{head}({', '.join(self.parameters())})\n{{\n" + "\n".join(body) + "\n}\n"

    def parameters(self) -> list[str]:
        """The pointers, then the sizes that vary between calls (kiln_shapes' symbols)."""
        return [*self.params, *(f"const int64_t {s}" for s in self.size_args)]

    def _work(self) -> Any:
        g = self.group
        inner = [product(b.inner) * product(b.rranges) for b in g.blocks] or [1]
        return (
            product(g.outer) * sympy.Max(*inner) if len(inner) > 1 else product(g.outer) * inner[0]
        )

    def outer_loops(self) -> None:
        g = self.group
        n = len(g.outer)
        flat = all(b.kind == "pointwise" and not b.inner for b in g.blocks)
        cond = f"if({print_index(self._work())} >= {PARALLEL_WORK})"
        loops = [
            f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})"
            for v, s in zip(g.outer_vars, g.outer)
        ]
        if flat and n == 1:
            pragmas = [f"#pragma omp parallel for simd {cond}"]
        elif flat:
            pragmas = (
                [f"#pragma omp parallel for collapse({n - 1}) {cond}"]
                + [None] * (n - 2)
                + ["#pragma omp simd"]
            )
        else:
            pragmas = [f"#pragma omp parallel for collapse({n}) {cond}"] + [None] * (n - 1)

        def blocks() -> None:
            for b in g.blocks:
                self.block(b, parallel=False)

        def body() -> None:
            self.scratch_declarations()
            self.prefetch_next_rows()
            # index checks invariant in every block's loops go here, once per outer
            # iteration (row_values.KernelOpsHandler.indirect_indexing)
            inner = {str(v) for b in g.blocks for v in (*b.vars, *b.rvars)}
            self.hoisting(inner, blocks)

        if flat and n > 1:
            # the last outer loop is the simd loop: checks invariant in it go before it
            last = str(g.outer_vars[-1])

            def outer_body() -> None:
                self.hoisting(
                    {last}, lambda: self._nest(loops[-1:], pragmas[-1:], lambda: blocks())
                )

            self._nest(loops[:-1], pragmas[:-1], outer_body)
            return
        self._nest(loops, pragmas, body)

    def _column_tile(self) -> int:
        """Columns per tile when the group is a column reduction (0: it is not): one block of
        float sums whose loads step 1 along the last outer loop and further along the
        innermost reduction loop (a bias gradient's sum over the rows of (N*T, C), a
        channel's sum over N of NCHW with H*W = 1). Looping over each column's elements
        in turn reads one element per cache line a column away (HF GPT-2's (256, 1024) bias
        sums, like torch's (2048, 4096).sum(0): 100 ms against eager's 5); a tile of
        columns walks the rows once, each row's tile in one vector loop."""
        g = self.group
        if not g.blocks or not g.outer or self.h.checks:
            return 0
        b = g.blocks[0]
        if b.kind != "reduction" or b.inner or not b.rranges:
            return 0
        if any(e.kind != "pointwise" or e.inner for e in g.blocks[1:]):
            return 0  # only an epilogue per column may follow
        width = g.outer[-1]
        if not width.is_number or int(width) < 2 * COLUMN_TILE:
            return 0
        for n in b.nodes:
            body = n.body
            if body.reduction_type != "sum" or body.dtype not in (torch.float32, torch.float64):  # type: ignore[union-attr]
                return 0
        x, r = g.outer_vars[-1], b.rvars[-1]
        loads = [e for n in b.nodes for _, e in g.bound[n.name][3]]
        if not loads:
            return 0
        for e in loads:
            co = coefficients(e, [x, r])
            if co is None or co[0][0] != 1 or not (co[0][1].is_number and int(co[0][1]) > 1):
                return 0
        return COLUMN_TILE

    def column_reduction(self, tile: int) -> None:
        """The column reduction of ``_column_tile``: per tile of ``tile`` columns, one
        accumulator per column (``acc<k>_c[]``), the reduction loops outside and a vector
        loop over the tile's columns inside, then each column's result stored and the
        group's pointwise epilogue computed from it."""
        g = self.group
        b = g.blocks[0]
        self.h.ranges = loop_var_ranges(g, b)
        x, width = g.outer_vars[-1], print_index(g.outer[-1])
        cond = f"if({print_index(self._work())} >= {PARALLEL_WORK})"
        loops = [
            f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})"
            for v, s in zip(g.outer_vars[:-1], g.outer[:-1])
        ]
        loops.append(f"for (int64_t t_{x} = 0; t_{x} < {width}; t_{x} += {tile})")
        pragmas: list[str | None] = [f"#pragma omp parallel for collapse({len(loops)}) {cond}"]
        pragmas += [None] * (len(loops) - 1)
        accs = [_Acc(self, n, self.h.count + k) for k, n in enumerate(b.nodes)]
        self.h.count += len(b.nodes)
        columns = f"for (int64_t {x} = t_{x}; {x} < e_{x}; ++{x})"

        def tile_body() -> None:
            self.emit(f"const int64_t e_{x} = kiln::min<int64_t>(t_{x} + {tile}, {width});")
            for a in accs:
                self.emit(f"{a.t} {a.name}_c[{tile}] = {{}};")

            def update() -> None:
                with self.scope(columns, "#pragma omp simd"):
                    for a in accs:
                        vars_, rvars, _, _ = g.bound[a.node.name]
                        v = self.h.to_dtype(a.node.body.inner_fn(vars_, rvars), a.dtype)  # type: ignore[union-attr]
                        lane = f"{a.name}_c[{x} - t_{x}]"
                        self.emit(f"{lane} = {lane} + {v};")

            rloops = [
                f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})"
                for v, s in zip(b.rvars, b.rranges)
            ]
            self._nest(rloops, [None] * len(rloops), update)
            with self.scope(columns):
                for a in accs:
                    self.emit(f"const {a.t} {a.name} = {a.name}_c[{x} - t_{x}];")
                for a in accs:
                    self.store(a.node, a.final(""), g.bound[a.node.name][2])
                for epilogue in g.blocks[1:]:
                    self.h.ranges = loop_var_ranges(g, epilogue)
                    self.pointwise_body(epilogue)

        self._nest(loops, pragmas, tile_body)

    def hoisting(self, loop_names: set[str], emit: Any) -> None:
        """Run ``emit`` with index checks that do not depend on ``loop_names`` (the loops
        ``emit`` opens) emitted here, before them (KernelOpsHandler.indirect_indexing)."""
        at, indent = len(self.lines), "  " * self.depth
        inserted: list[str] = []

        def hoist(lines: list[str]) -> None:
            pos = at + len(inserted)
            self.lines[pos:pos] = [indent + ln for ln in lines]
            inserted.extend(lines)

        saved = (self.h.hoist, self.h.hoisted, self.h.hoist_loops)
        self.h.hoist, self.h.hoisted, self.h.hoist_loops = hoist, {}, frozenset(loop_names)
        try:
            emit()
        finally:
            self.h.hoist, self.h.hoisted, self.h.hoist_loops = saved

    def _nest(self, loops: list[str], pragmas: list[str | None], body: Any) -> None:
        if not loops:
            body()
            return
        with self.scope(loops[0], pragmas[0]):
            self._nest(loops[1:], pragmas[1:], body)

    def block(self, block: Block, parallel: bool) -> None:
        self.h.ranges = loop_var_ranges(self.group, block)
        if block.kind == "pointwise":
            loops = [
                f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})"
                for v, s in zip(block.vars, block.inner)
            ]
            pragmas: list[str | None] = [None] * len(loops)
            if loops:
                pragmas[-1] = "#pragma omp simd"
            if not loops:
                self.pointwise_body(block)
                return
            self._nest(
                loops, pragmas, lambda: self.in_scope(block, lambda: self.pointwise_body(block))
            )
            for node in block.nodes:
                row = self.streamed.get(node.name)
                if row is not None:
                    ptr = self.ptrs[node.name][0]
                    base, n = print_index(row.base), print_index(row.length)
                    self.emit(f"kiln_stream_f32({ptr} + {base}, {row.array}, {n});")
            return
        loops = [
            f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})"
            for v, s in zip(block.vars, block.inner)
        ]
        work = self.scan if block.kind == "scan" else self.reduction
        self._nest(loops, [None] * len(loops), lambda: work(block, parallel))

    def in_scope(self, block: Block, body: Any) -> None:
        """Emit ``body`` as the innermost loop nest of ``block`` (see row_values.LoopScope)."""
        k = self.group.blocks.index(block)
        loop_vars = (*block.vars, *block.rvars)
        extents = (*block.inner, *block.rranges)
        flat = sum(
            (v * s for v, s in zip(loop_vars, contiguous_strides(extents))), sympy.Integer(0)
        )
        n = product(extents)
        self.h.scope = LoopScope(
            block=k,
            cls=self.block_class[k],
            loop_names=frozenset(v.name for v in loop_vars),
            flat=print_index(flat),
            # a symbolic extent too: its kernel runs the scratch version only for rows that
            # fit (generate_cpp_kernel)
            scratch_ok=not n.is_number or int(n) * 8 <= MAX_SCRATCH_BYTES,
        )
        try:
            body()
        finally:
            self.h.scope = None

    def scratch_declarations(self) -> None:
        """Per-row scratch arrays of the values shared between loops (row_values)."""
        for key, (array, block) in sorted(self.sharing.arrays.items(), key=lambda kv: kv[1][0]):
            dtype = self.sharing.wanted[key][2]
            n = self._extent(block)
            align = "alignas(64) " if n.is_number else ""  # (a variable-length array)
            self.emit(f"{align}{ctype(dtype)} {array}[{print_index(n)}];")
        for row in self.streamed.values():
            self.emit(f"alignas(64) float {row.array}[{print_index(row.length)}];")

    def symbolic_scratch_rows(self) -> list[Any]:
        """The symbolic lengths of this kernel's scratch arrays."""
        out = []
        for _, block in self.sharing.arrays.values():
            n = self._extent(block)
            if not n.is_number and n not in out:
                out.append(n)
        return out

    def _extent(self, block: int) -> Any:
        """The elements of one row of block ``block``'s loops (a scratch array's length)."""
        b = self.group.blocks[block]
        return product((*b.inner, *b.rranges))

    def prefetch_next_rows(self) -> None:
        """Prefetch the rows the next outer iteration reads (see prefetch.py)."""
        g = self.group
        last, extent = g.outer_vars[-1], g.outer[-1]
        for row in plan_row_prefetch(g, self.buffers):
            ptr = self.ptrs[row.buffer][0]
            base, n = print_index(row.next_base), print_index(row.length)
            self.emit(
                f"if ({last} + 1 < {print_index(extent)}) "
                f"for (int64_t pf = 0; pf < {n}; pf += {row.step}) "
                f"__builtin_prefetch({ptr} + ({base}) + pf);"
            )

    # -- pointwise ---------------------------------------------------------------------------
    def pointwise_body(self, block: Block) -> None:
        # an output written over one of the kernel's inputs (``group.aliases``: plan_memory's
        # in-place and donated outputs) is stored after every member of the block has read
        # what it needs, so a later member may still read the old value at that index (SGD:
        # the parameter update reads the momentum buffer that the new momentum replaces)
        deferred = []
        for node in block.nodes:
            vars_, _, store, _ = self.group.bound[node.name]
            value = node.body.inner_fn(vars_)  # type: ignore[union-attr]
            if node.name in self.group.aliases and node.name not in self.group.local:
                value = self.h.to_dtype(value, node.dtype)
                self.h.forwarded_exprs[(node.name, sympy.expand(store))] = value
                deferred.append((node, value, store))
            else:
                self.store(node, value, store)
        for node, value, store in deferred:
            self.store(node, value, store)

    def store(self, node: ComputedBuffer, value: CppValue, store: Any) -> None:
        value = self.h.to_dtype(value, node.dtype)
        self.h.forwarded_exprs[(node.name, sympy.expand(store))] = value
        row = self.streamed.get(node.name)
        if row is not None and self.h.scope is not None:
            self.emit(f"{row.array}[{self.h.scope.flat}] = {value};")
        elif node.name not in self.group.local:
            ptr, dt = self.ptrs[node.name]
            self.emit(f"{ptr}[{print_index(store)}] = {self.h.store_expr(value, dt)};")

    # -- scans -------------------------------------------------------------------------------
    def scan(self, block: Block, parallel: bool) -> None:
        """A sequential loop along the scanned axis: accumulate, store every step."""
        (node,) = block.nodes
        body = node.body
        assert isinstance(body, Scan)
        acc = f"acc{self.h.count}"
        self.h.count += 1
        self.emit(
            f"{ctype(body.dtype)} {acc} = {literal(1 if body.scan_type == 'prod' else 0, body.dtype)};"
        )
        op = "*" if body.scan_type == "prod" else "+"
        index, _, store, _ = self.group.bound[node.name]

        def step() -> None:
            v = self.h.to_dtype(body.inner_fn(index), body.dtype)
            self.emit(f"{acc} = {acc} {op} {v};")
            self.store(node, CppValue(acc, body.dtype), store)

        loops = [
            f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})"
            for v, s in zip(block.rvars, block.rranges)
        ]
        self._nest(loops, [None] * len(loops), step)

    # -- reductions --------------------------------------------------------------------------
    def reduction(self, block: Block, parallel: bool) -> None:
        nodes = block.nodes
        types = [n.body.reduction_type for n in nodes]  # type: ignore[union-attr]
        work = product(block.rranges)
        if any(t.startswith("welford") for t in types):
            return self.welford(block, parallel, work)
        accs = [_Acc(self, n, self.h.count + k) for k, n in enumerate(nodes)]
        self.h.count += len(nodes)
        partial = not parallel and self._partial_lanes(block, accs)
        if partial and len(block.rranges) == 1:
            # 32 float partial sums of one row are accurate enough (and eager's way); over
            # several dimensions (batch norm's N, H*W) each partial still adds thousands
            for a in accs:
                a.in_float()
        simd = not any(t.startswith("arg") for t in types)
        chunked = parallel and bool(block.rranges)
        if parallel:
            for a in accs:
                a.declare("g")
            self.emit(f"#pragma omp parallel if({print_index(work)} >= {PARALLEL_WORK})")
            self.emit("{")
            self.depth += 1
            # values emitted in the region are out of scope after it (scope() does this)
            saved = (dict(self.h.cache), dict(self.h.forwarded_exprs))
        for a in accs:
            a.declare("")
        clauses = " ".join(c for a in accs for c in a.clauses())
        simd_pragma = f"#pragma omp simd {clauses}" if simd else None

        def body() -> None:
            for a in accs:
                vars_, rvars, _, _ = self.group.bound[a.node.name]
                v = a.node.body.inner_fn(vars_, rvars)  # type: ignore[union-attr]
                a.update(v, rvars)

        if partial:
            self.partial_sums(block, accs)
            for a in accs:
                self.store(a.node, a.final(""), self.group.bound[a.node.name][2])
            return

        self._rnest(
            block,
            parallel,
            chunked,
            simd_pragma,
            body if parallel else lambda: self.in_scope(block, body),
        )
        if parallel:
            self.emit("#pragma omp critical")
            with self.scope():
                for a in accs:
                    a.combine()
            self.depth -= 1
            self.emit("}")
            self.h.cache, self.h.forwarded_exprs = saved
        for a in accs:
            self.store(a.node, a.final("g" if parallel else ""), self.group.bound[a.node.name][2])

    @staticmethod
    def _partial_lanes(block: Block, accs: list[_Acc]) -> int:
        """Lanes of the partial sums of a row's sum reductions (0: keep one accumulator)."""
        if not block.rranges or not all(
            a.type == "sum" and a.dtype in (torch.float32, torch.float64) for a in accs
        ):
            return 0
        n = block.rranges[-1]
        lanes = PARTIAL_LANES
        if not n.is_number:  # a symbolic length: whole chunks, then a tail (partial_sums)
            return lanes
        if int(n) < 2 * lanes or int(n) % lanes:
            return 0
        return lanes

    def partial_sums(self, block: Block, accs: list[_Acc]) -> None:
        """A row's float sums into ``PARTIAL_LANES`` partial sums (``acc<k>_p[]``), added up
        after the loop. One ``omp simd`` accumulator is a chain of dependent vector adds, 3-4
        cycles each for 8 floats of an L1-resident row; four vector partials are independent
        (layer_norm over (4096, 1024), one thread: ~12% less CPU time). A symbolic length
        runs its whole chunks so, then its tail (fewer than ``lanes`` elements) into the
        first partials: the same vector code for every length."""
        lanes = self._partial_lanes(block, accs)
        for a in accs:
            self.emit(f"{a.t} {a.name}_p[{lanes}] = {{}};")
        rv, rr = block.rvars, block.rranges
        loops = [f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})" for v, s in zip(rv, rr)]
        last, n = rv[-1], print_index(rr[-1])
        symbolic = not rr[-1].is_number
        whole = f"({n} - {n} % {lanes})" if symbolic else n
        loops[-1] = f"for (int64_t c_{last} = 0; c_{last} < {whole}; c_{last} += {lanes})"

        def body(start: str) -> Any:
            def emit() -> None:
                for a in accs:
                    vars_, rvars, _, _ = self.group.bound[a.node.name]
                    v = self.h.to_dtype(a.node.body.inner_fn(vars_, rvars), a.dtype)  # type: ignore[union-attr]
                    lane = f"{a.name}_p[{last} - {start}]"
                    self.emit(f"{lane} = {lane} + {v};")

            return emit

        def lane_loop() -> None:
            header = f"for (int64_t {last} = c_{last}; {last} < c_{last} + {lanes}; ++{last})"
            with self.scope(header, "#pragma omp simd"):
                self.in_scope(block, body(f"c_{last}"))

        def chunks_then_tail() -> None:
            with self.scope(loops[-1]):
                lane_loop()
            header = f"for (int64_t {last} = {whole}; {last} < {n}; ++{last})"
            with self.scope(header, "#pragma omp simd"):
                self.in_scope(block, body(whole))

        if symbolic:
            self._nest(loops[:-1], [None] * (len(loops) - 1), chunks_then_tail)
        else:
            self._nest(loops, [None] * len(loops), lane_loop)
        red = " ".join(f"reduction(+:{a.name})" for a in accs)
        with self.scope(f"for (int64_t j = 0; j < {lanes}; ++j)", f"#pragma omp simd {red}"):
            for a in accs:
                self.emit(f"{a.name} = {a.name} + {a.name}_p[j];")

    def _rnest(
        self,
        block: Block,
        parallel: bool,
        chunked: bool,
        last_pragma: str | None,
        body: Any,
        chunk_body: Any = None,
    ) -> None:
        rv, rr = block.rvars, block.rranges
        loops: list[str] = []
        pragmas: list[str | None] = []
        for k, (v, s) in enumerate(zip(rv, rr)):
            last = k == len(rv) - 1
            if last and chunked:
                loops.append(f"for (int64_t c_{v} = 0; c_{v} < {print_index(s)}; c_{v} += {CHUNK})")
                pragmas.append("#pragma omp for nowait" if parallel and k == 0 else None)
            else:
                loops.append(f"for (int64_t {v} = 0; {v} < {print_index(s)}; ++{v})")
                pragmas.append(
                    ("#pragma omp for nowait" if parallel and k == 0 else None)
                    if not last
                    else last_pragma
                )

        def innermost() -> None:
            if chunked:
                v, s = rv[-1], rr[-1]
                self.emit(
                    f"const int64_t e_{v} = kiln::min<int64_t>(c_{v} + {CHUNK}, {print_index(s)});"
                )
                if chunk_body is not None:
                    chunk_body(v)
                    return
                with self.scope(f"for (int64_t {v} = c_{v}; {v} < e_{v}; ++{v})", last_pragma):
                    body()
            else:
                body()

        if not loops:
            body()
            return
        self._nest(loops, pragmas, innermost)

    def welford(self, block: Block, parallel: bool, work: Any) -> None:
        nodes = block.nodes
        dt = ctype(nodes[0].body.src_dtype)  # type: ignore[union-attr]
        # nodes over the same body share one accumulator
        keys: list[int] = []
        firsts: dict[int, int] = {}
        for n in nodes:
            key = id(n.body.inner_fn)  # type: ignore[union-attr]
            firsts.setdefault(key, len(firsts))
            keys.append(firsts[key])
        base = self.h.count
        self.h.count += len(firsts)
        keys = [base + k for k in keys]
        uniq = sorted(set(keys))
        pre = "g" if parallel else ""
        names = {u: (f"wm{u}", f"wm2{u}", f"wn{u}") for u in uniq}
        if parallel:
            for u in uniq:
                m, m2, c = names[u]
                self.emit(f"{dt} g{m} = 0; {dt} g{m2} = 0; int64_t g{c} = 0;")
            self.emit(f"#pragma omp parallel if({print_index(work)} >= {PARALLEL_WORK})")
            self.emit("{")
            self.depth += 1
            saved = (dict(self.h.cache), dict(self.h.forwarded_exprs))
        for u in uniq:
            m, m2, c = names[u]
            self.emit(f"{dt} {m} = 0; {dt} {m2} = 0; int64_t {c} = 0;")
        reps = {u: nodes[keys.index(u)] for u in uniq}

        def value(u: int) -> CppValue:
            node = reps[u]
            vars_, rvars, _, _ = self.group.bound[node.name]
            return node.body.inner_fn(vars_, rvars)  # type: ignore[union-attr]

        def chunk(v: Any) -> None:
            loop = f"for (int64_t {v} = c_{v}; {v} < e_{v}; ++{v})"
            for u in uniq:
                self.emit(f"{dt} ws{u} = 0; {dt} q{u} = 0;")
            red = " ".join(f"reduction(+:ws{u})" for u in uniq)
            with self.scope(loop, f"#pragma omp simd {red}"):
                for u in uniq:
                    self.emit(f"ws{u} = ws{u} + {value(u)};")
            self.emit(f"const int64_t n_{v} = e_{v} - c_{v};")
            for u in uniq:
                self.emit(f"const {dt} cm{u} = ws{u} / static_cast<{dt}>(n_{v});")
            red = " ".join(f"reduction(+:q{u})" for u in uniq)
            with self.scope(loop, f"#pragma omp simd {red}"):
                for u in uniq:
                    self.emit(f"const {dt} d{u} = {value(u)} - cm{u}; q{u} = q{u} + d{u} * d{u};")
            for u in uniq:
                m, m2, c = names[u]
                self.emit(f"kiln_welford_merge<{dt}>({m}, {m2}, {c}, cm{u}, q{u}, n_{v});")

        self._rnest(block, parallel, True, None, lambda: None, chunk_body=chunk)
        if parallel:
            self.emit("#pragma omp critical")
            with self.scope():
                for u in uniq:
                    m, m2, c = names[u]
                    self.emit(f"kiln_welford_merge<{dt}>(g{m}, g{m2}, g{c}, {m}, {m2}, {c});")
            self.depth -= 1
            self.emit("}")
            self.h.cache, self.h.forwarded_exprs = saved
        for node, u in zip(nodes, keys):
            m, m2, _ = names[u]
            var = pre + (m if node.body.reduction_type == "welford_mean" else m2)  # type: ignore[union-attr]
            self.store(node, CppValue(var, node.body.src_dtype), self.group.bound[node.name][2])  # type: ignore[union-attr]


_INIT = {"sum": 0, "prod": 1, "any": False, "all": True}


class _Acc:
    """One accumulator of a (non-Welford) reduction: declaration, update, combine, result."""

    def __init__(self, kernel: CppKernel, node: ComputedBuffer, k: int):
        body = node.body
        assert isinstance(body, Reduction)
        self.kernel, self.node, self.type = kernel, node, body.reduction_type
        self.dtype = (
            body.src_dtype
            if self.type.startswith("arg") or self.type in ("max", "min")
            else body.dtype
        )
        from kiln_inductor.lowering.values import compute_dtype

        self.dtype = compute_dtype(self.dtype)
        self.result_dtype = self.dtype
        if self.type == "sum" and self.dtype == torch.float32:
            # a float sum is accumulated in double: one float accumulator per row adds its
            # elements one after another, and its error grows with the row (eager's CPU sum
            # is a cascade of partial sums); a ResNet's batch-norm gradients over N*H*W
            # differed from float64's 1e-2 where eager's differed 1e-5. Rows summed into
            # 32 partial sums stay in float (``in_float``): accurate enough, and what eager
            # computes, which an optimizer like Adam, normalizing near-zero gradients,
            # amplifies any difference from
            self.dtype = torch.float64
            self.result_dtype = torch.float32  # what the rest of the kernel computes with
        self.t = ctype(self.dtype)
        # bool accumulators are ints: GCC does not vectorize a loop with a bool reduction
        self.flag = self.dtype == torch.bool and not self.type.startswith("arg")
        if self.flag:
            self.t = "int"
        self.name = f"acc{k}"
        self.rranges = body.reduction_ranges

    def in_float(self) -> None:
        """Accumulate in the result's type after all (partial sums of a row)."""
        self.dtype = self.result_dtype
        self.t = ctype(self.dtype)

    def _init(self) -> str:
        t, dt = self.t, self.dtype
        if self.flag:
            return "1" if self.type in ("all", "min") else "0"
        if self.type in _INIT:
            return literal(_INIT[self.type], dt)
        if dt == torch.bool:
            return "false" if self.type in ("max", "argmax") else "true"
        big = f"kiln::inf<{t}>()" if dt.is_floating_point else f"kiln::maxval<{t}>()"
        small = f"-kiln::inf<{t}>()" if dt.is_floating_point else f"kiln::lowest<{t}>()"
        return small if self.type in ("max", "argmax") else big

    def declare(self, pre: str) -> None:
        n = pre + self.name
        self.kernel.emit(f"{self.t} {n} = {self._init()};")
        if self.type in ("max", "min") and self.dtype.is_floating_point:
            # an int flag, not a bool: GCC does not vectorize a loop with a bool reduction
            self.kernel.emit(f"int {n}_nan = 0;")
        if self.type.startswith("arg"):
            self.kernel.emit(f"int64_t {n}_i = kiln::maxval<int64_t>();")

    def clauses(self) -> list[str]:
        op = {"sum": "+", "prod": "*", "max": "max", "min": "min", "any": "||", "all": "&&"}.get(
            self.type
        )
        if op is None:
            return []
        if self.flag:
            op = "|" if self.type in ("any", "max") else "&"
        out = [f"reduction({op}:{self.name})"]
        if self.type in ("max", "min") and self.dtype.is_floating_point:
            out.append(f"reduction(|:{self.name}_nan)")
        return out

    def update(self, v: CppValue, rvars: Any) -> None:
        v = self.kernel.h.to_dtype(v, self.dtype)
        n, e = self.name, self.kernel.emit
        if self.type == "sum":
            e(f"{n} = {n} + {v};")
        elif self.type == "prod":
            e(f"{n} = {n} * {v};")
        elif self.flag:
            op = "|" if self.type in ("any", "max") else "&"
            e(f"{n} = {n} {op} static_cast<int>({v});")
        elif self.type in ("max", "min"):
            f = "kiln::max" if self.type == "max" else "kiln::min"
            e(f"{n} = {f}<{self.t}>({n}, {v});")
            if self.dtype.is_floating_point:
                e(f"{n}_nan = {n}_nan | ({v} != {v});")
        else:
            flat = print_index(
                sum(
                    (r * s for r, s in zip(rvars, contiguous_strides(self.rranges))),
                    sympy.Integer(0),
                )
            )
            is_max = "true" if self.type == "argmax" else "false"
            e(
                f"if (kiln_arg_better<{self.t}>({is_max}, {v}, {flat}, {n}, {n}_i)) {{ {n} = {v}; {n}_i = {flat}; }}"
            )

    def combine(self) -> None:
        n, g, e = self.name, "g" + self.name, self.kernel.emit
        if self.type == "sum":
            e(f"{g} = {g} + {n};")
        elif self.type == "prod":
            e(f"{g} = {g} * {n};")
        elif self.flag:
            op = "|" if self.type in ("any", "max") else "&"
            e(f"{g} = {g} {op} {n};")
        elif self.type in ("max", "min"):
            f = "kiln::max" if self.type == "max" else "kiln::min"
            e(f"{g} = {f}<{self.t}>({g}, {n});")
            if self.dtype.is_floating_point:
                e(f"{g}_nan = {g}_nan | {n}_nan;")
        else:
            is_max = "true" if self.type == "argmax" else "false"
            e(
                f"if (kiln_arg_better<{self.t}>({is_max}, {n}, {n}_i, {g}, {g}_i)) {{ {g} = {n}; {g}_i = {n}_i; }}"
            )

    def final(self, pre: str) -> CppValue:
        n = pre + self.name
        if self.flag:
            return self.kernel.h._value(f"({n} != 0)", torch.bool)
        if self.type.startswith("arg"):
            return self.kernel.h._value(
                f"({n}_i == kiln::maxval<int64_t>() ? 0 : {n}_i)", torch.int64
            )
        if self.type in ("max", "min") and self.dtype.is_floating_point:
            return self.kernel.h._value(f"({n}_nan ? kiln::nan<{self.t}>() : {n})", self.dtype)
        if self.result_dtype != self.dtype:
            return self.kernel.h.to_dtype(CppValue(n, self.dtype), self.result_dtype)
        return CppValue(n, self.dtype)


def generate_cpp_kernel(
    group: FusedGroup, buffers: dict[str, Buffer]
) -> tuple[str, list[Any], tuple[str, ...]]:
    """The kernel's source, its index checks (kiln_inductor.index_check), numbered from 1
    in the order of the list, and the size symbols it takes after its pointers. Two passes
    when a later loop recomputes an expensive value of an earlier one (see row_values): the
    first finds them, the second keeps them in per-row scratch arrays."""
    first = CppKernel(group, buffers)
    source = first.generate()
    if not first.sharing.wanted:
        return source, first.h.checks, first.size_args
    second = CppKernel(group, buffers, RowSharing.from_pass(first.sharing))
    shared = second.generate()
    rows = second.symbolic_scratch_rows()
    if not rows:
        return shared, second.h.checks, second.size_args
    # Scratch rows of a symbolic length live on each thread's stack: the kernel runs the
    # version that keeps them for rows that fit (MAX_SCRATCH_BYTES), else the first pass's
    # version, which recomputes the values instead.
    if first.size_args != second.size_args or len(first.h.checks) != len(second.h.checks):
        return source, first.h.checks, first.size_args
    fits = " && ".join(f"({print_index(n)}) * 8 <= {MAX_SCRATCH_BYTES}" for n in rows)
    params = second.parameters()
    args = ", ".join(p.rsplit(" ", 1)[-1] for p in params)
    combined = (
        f"{PRELUDE}\n{second.function('static int64_t kernel_rows')}\n"
        f"{first.function('static int64_t kernel_recompute')}\n"
        f'extern "C" int64_t kernel({", ".join(params)})\n{{\n'
        f"  if ({fits}) return kernel_rows({args});\n"
        f"  return kernel_recompute({args});\n}}\n"
    )
    return combined, second.h.checks, second.size_args
