"""KernelOpsHandler: the ops handler of one kernel, sharing expensive values between its loops.

Values computed once per row
----------------------------
A fused group runs several inner loops per outer iteration (softmax: max, then the sum of
``exp(x - max)``, then ``exp(x - max) / sum``). Each loop is its own C++ scope, so plain
CSE cannot see that the last loop recomputes the ``exp`` of the second. Here:

- blocks whose loops have the same extents use the same C++ loop variables (the kernel
  renames them), so equal values have equal *structural keys*: the expression with every
  operand replaced by its own key, not by its C++ name;
- a first generation pass records, for each expensive value (a libm call) computed
  unconditionally in a block's innermost loop, which later block of the same extents
  computes it again;
- the second pass stores such a value into a per-row scratch array (``scr<k>[flat]``, on
  the stack, L1-resident) where it is first computed and loads it in the later blocks.

Division by a value that does not change along the innermost loop (softmax's sum) becomes
a multiplication by its reciprocal, computed once (the way ATen's softmax kernel does it);
GCC hoists the reciprocal out of the loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from kiln_inductor.ir.symbols import FloorDiv, ModIndex, simplify_index

from .cpp_ops import CppOpsHandler, CppValue, ctype, literal, print_index
from .prelude import SIMD_MATH_BINARY, SIMD_MATH_DOUBLE, SIMD_MATH_FLOAT

_IDENT = re.compile(r"[A-Za-z_]\w*")
_TEMP = re.compile(r"tmp\d+")  # a generated value (defs holds those defined by an expression)
_CALL = re.compile(r"^([A-Za-z_]\w*)\(")
EXPENSIVE_CALLS = frozenset(
    SIMD_MATH_FLOAT + SIMD_MATH_DOUBLE + list(SIMD_MATH_BINARY) + ["kiln_expf"]
)
MAX_SCRATCH_BYTES = 128 * 1024  # per scratch array, on each thread's stack


@dataclass
class LoopScope:
    """The innermost loop nest being emitted: its block, extents class and flat index."""

    block: int
    cls: int
    loop_names: frozenset[str]
    flat: str  # C++ flat index of the nest's variables (the scratch index)
    scratch_ok: bool  # a constant extent small enough for a stack array


@dataclass
class RowSharing:
    """What pass 1 found (``wanted``) and pass 2 uses: struct key -> (array, producer block)."""

    produced: dict[str, tuple[int, int, torch.dtype]] = field(default_factory=dict)
    wanted: dict[str, tuple[int, int, torch.dtype]] = field(default_factory=dict)
    arrays: dict[str, tuple[str, int]] = field(default_factory=dict)

    @staticmethod
    def from_pass(first: RowSharing) -> RowSharing:
        out = RowSharing()
        for k, key in enumerate(sorted(first.wanted)):
            block, cls, _ = first.wanted[key]
            out.arrays[key] = (f"scr{k}", block)
        out.wanted = dict(first.wanted)
        return out


class KernelOpsHandler(CppOpsHandler):
    """Simplifies load indices with the current loop ranges; shares values across loops."""

    def __init__(self, pointer_of: Any, emit: Any, sharing: RowSharing):
        super().__init__(pointer_of, emit)
        self.ranges: dict[sympy.Symbol, Any] = {}
        self.forwarded_exprs: dict[tuple[str, Any], CppValue] = {}
        self.sharing = sharing
        self.scope: LoopScope | None = None
        self.struct: dict[str, str] = {}  # C++ name -> structural id
        self.interned: dict[str, str] = {}  # structural key -> id
        self.variant: set[str] = set()  # names that change along the innermost loop
        self.masked_depth = 0
        self.literals: set[str] = set()  # names of compile-time constants
        # where index checks invariant in a block's loops go (CppKernel sets it inside the
        # outer loops' body), and those already emitted there
        self.hoist: Any = None
        self.hoisted: dict[tuple, str] = {}
        self.hoist_loops: frozenset[str] = frozenset()  # loop variables below the hoist point
        # loads of one element of an input (a step count, a learning rate as a 0-d tensor),
        # read once at the kernel's start (``prologue``, CppKernel.function)
        self.prologue: list[str] = []
        self.invariant_loads: dict[tuple[str, int], CppValue] = {}

    def constant(self, value: Any, dtype: torch.dtype) -> CppValue:
        v = super().constant(value, dtype)
        self.literals.add(v.name)
        return v

    def index_expr(self, expr: Any, dtype: torch.dtype) -> CppValue:
        if isinstance(expr, sympy.Basic) and expr.has(FloorDiv, ModIndex):
            expr = simplify_index(sympy.expand(expr), self.ranges)
        return super().index_expr(expr, dtype)

    def load(self, name: str, index: Any) -> CppValue:
        index = simplify_index(sympy.expand(index), self.ranges)
        key = (name, index)
        if key in self.forwarded_exprs:
            return self.forwarded_exprs[key]
        if isinstance(index, sympy.Integer) and int(index) >= 0 and not self.masked_depth:
            v = self._invariant_load(name, int(index))
            if v is not None:
                return v
        return super().load(name, index)

    def _invariant_load(self, name: str, index: int) -> CppValue | None:
        """One element of an input the kernel does not write, as a value read at the
        kernel's start. Read inside the loops, it kept every value computed from it there:
        an output written over an input drops ``__restrict__``, so GCC must assume a store
        may change the element, and AdamW's bias corrections (``powf(beta, step)``) ran
        once per element (a compiled AdamW step 4x torch.compile's)."""
        ptr, dtype = self.pointer_of(name)
        if not ptr.startswith("in_ptr") or (name, print_index(index)) in self.forwarded:
            return None
        # read at the kernel's start only where the loops around the load run: an input
        # of no elements (x[:0] + x[:0], an expand to size 0) may have no element 0 at all
        extents = [r for r in self.ranges.values() if not (isinstance(r, sympy.Integer) and r > 0)]
        if any(isinstance(r, sympy.Integer) for r in extents):
            return None  # a loop of no iteration: the load never runs
        key = (ptr, index)
        if key not in self.invariant_loads:
            element = f"{ptr}[{index}L]"
            if dtype == torch.bfloat16:
                element = f"kiln_bf16_to_f32({element})"
            elif dtype == torch.float16:
                element = f"kiln_f16_to_f32({element})"
            if extents:  # sizes known at run time: read only when every loop runs
                ran = " && ".join(f"({print_index(r)}) > 0" for r in extents)
                element = f"(({ran}) ? {element} : {ctype(dtype)}(0))"
            cname = f"kc{len(self.invariant_loads)}"
            self.prologue.append(self.declare(cname, element, dtype))
            self.defs[cname] = element
            self.invariant_loads[key] = CppValue(cname, dtype)
        return self.invariant_loads[key]

    # -- index checks hoisted out of a block's loops ----------------------------------------
    def indirect_indexing(self, value: CppValue, size: Any, check: Any = None) -> sympy.Symbol:
        """A checked index that does not change along the block's loops (an embedding's id,
        read once per row) is checked once per outer iteration, before the loops: in the
        innermost loop the check's branch kept GCC from vectorizing the row as well."""
        hoist = self.hoist
        if check is None or hoist is None or self.masked_depth:
            return super().indirect_indexing(value, size, check)
        expr = self._inline(value.name)
        if expr is None or set(_IDENT.findall(expr)) & self.hoist_loops:
            return super().indirect_indexing(value, size, check)
        size_s = print_index(size)
        key = (expr, size_s, check.wrap, self.check_code(check))
        name = self.hoisted.get(key)
        if name is None:
            name = f"hk{len(self.hoisted)}"
            code = key[3]
            w = f"({name}_v < 0 ? {name}_v + {size_s} : {name}_v)" if check.wrap else f"{name}_v"
            hoist(
                [
                    f"const int64_t {name}_v = static_cast<int64_t>({expr});",
                    f"const int64_t {name}_w = {w};",
                    f"const bool {name}_b = static_cast<uint64_t>({name}_w) >= static_cast<uint64_t>({size_s});",
                    f"if (__builtin_expect({name}_b, 0)) kiln_index_fail(&kiln_err, {code}L, {name}_v);",
                    f"const int64_t {name} = {name}_b ? 0L : {name}_w;",
                ]
            )
            self.hoisted[key] = name
        if self.bad_lanes is not None:
            self.bad_lanes.append(f"{name}_b")
        return sympy.Symbol(name, integer=True, nonnegative=True)

    def _inline(self, name: str, depth: int = 0) -> str | None:
        """The expression of ``name`` with every value it uses written out (so it can be
        computed before the loops that emitted it), or None when it reads something a loop
        defines (a scratch array, an accumulator)."""
        expr = self.defs.get(name)
        if expr is None or depth > 32:
            return None
        out = []
        pos = 0
        for m in _IDENT.finditer(expr):
            ident = m.group()
            out.append(expr[pos : m.start()])
            pos = m.end()
            if ident in self.defs:
                inner = self._inline(ident, depth + 1)
                if inner is None:
                    return None
                out.append(f"({inner})")
            elif (
                ident in self.variant
                or ident.startswith(("acc", "scr", "wm", "wn", "cm"))
                or _TEMP.fullmatch(ident)
            ):
                # a value a loop defines (an accumulator, a scratch array, a masked
                # value's variable): not computable before the loops
                return None
            else:
                out.append(ident)
        out.append(expr[pos:])
        return "".join(out)

    def masked(self, mask: CppValue, body: Any, other: Any) -> CppValue:
        self.masked_depth += 1
        try:
            out = super().masked(mask, body, other)
        finally:
            self.masked_depth -= 1
        self.variant.add(out.name)  # conservative: its inputs are not tracked
        return out

    # -- structural keys ---------------------------------------------------------------------
    def _skey(self, expr: str, dtype: torch.dtype) -> str:
        return f"{dtype}:" + _IDENT.sub(lambda m: self.struct.get(m.group(), m.group()), expr)

    def _is_variant(self, expr: str) -> bool:
        scope = self.scope
        names = set(_IDENT.findall(expr))
        return bool(names & self.variant) or (scope is not None and bool(names & scope.loop_names))

    def _value(self, expr: str, dtype: torch.dtype) -> CppValue:
        key = f"{dtype}:{expr}"
        if key in self.cache:
            return self.cache[key]
        skey = self._skey(expr, dtype)
        variant = self._is_variant(expr)
        scope = self.scope
        shared = self.sharing.arrays.get(skey) if scope is not None else None
        if shared is not None and scope is not None and shared[1] != scope.block and variant:
            name = self.fresh()
            self.emit(f"const {ctype(dtype)} {name} = {shared[0]}[{scope.flat}];")
            v = CppValue(name, dtype)
        else:
            v = super()._value(expr, dtype)
            if scope is not None and variant:
                self._record(expr, skey, v, scope, shared)
        self.cache[key] = v
        self.struct[v.name] = self.interned.setdefault(skey, f"@{len(self.interned)}")
        if variant:
            self.variant.add(v.name)
        return v

    def _record(
        self, expr: str, skey: str, v: CppValue, scope: LoopScope, shared: tuple[str, int] | None
    ) -> None:
        m = _CALL.match(expr)
        if m is None or m.group(1) not in EXPENSIVE_CALLS or not scope.scratch_ok:
            return
        if shared is not None and shared[1] == scope.block:
            self.emit(f"{shared[0]}[{scope.flat}] = {v.name};")
            return
        produced = self.sharing.produced.get(skey)
        if produced is None:
            if self.masked_depth == 0:
                self.sharing.produced[skey] = (scope.block, scope.cls, v.dtype)
        elif produced[0] != scope.block and produced[1] == scope.cls:
            self.sharing.wanted[skey] = produced

    # -- division by a loop invariant --------------------------------------------------------
    def truediv(self, a: CppValue, b: CppValue) -> CppValue:
        if (
            self.scope is not None
            and a.dtype in (torch.float32, torch.float64)
            and b.dtype == a.dtype
            and self._is_variant(a.name)
            and not self._is_variant(b.name)
            and b.name not in self.literals  # x / 3.0 stays a division, as in eager
        ):
            r = self._value(f"({literal(1, b.dtype)} / {b})", b.dtype)
            return self._bin(a, r, "*")
        return super().truediv(a, b)
