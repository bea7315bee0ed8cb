"""Guards of inputs with symbolic sizes, generated as one Python function per cache entry.

Design note: "shape guards"
---------------------------
Tensors whose sizes are all static keep the native tensor check (guards.py). Those with
symbolic sizes are checked by one generated function, called as the last condition of
the entry's guard function (so every other guard, the inputs' types included, passed):

1. each tensor's dtype, device, number of dimensions and ``requires_grad``;
2. each symbol bound from its first source (``s0 = x.size(0)``), later sources of the
   same symbol (a duck-sized one) compared with it, static sizes compared with their value;
3. each tensor's strides equal to its symbolic strides (products of sizes: dense, in
   the example's dimension order);
4. each symbol in its range (``[2, inf)``, or the range ``mark_dynamic`` declared);
5. every guard the trace recorded in the ShapeEnv (``s1 > 8``, ``s2 % 4 == 0``), as
   Python (``kiln_shapes.python_expr``).

The function returns None when everything holds, else the number of the first check
that failed; ``first_failure`` turns that into text naming the check, its source line
and the symbols' values. Cache hits call a faster form (``_native``): steps 1-4 and the
guards that equate two symbols in one native call, the remaining guards in Python.
Building the function checks both forms on the example inputs: a guard that rejects its
own example would recompile forever, so it is a capture bug.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SymbolicTensor:
    expr: str  # the source expression of the tensor
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    size: list[Any]  # sympy expressions as the trace made them (before replacements)
    stride: list[Any]
    example: torch.Tensor | None  # dropped once the guard is built


def _namespace(consts: list[object]) -> dict:
    return {"__k_C": consts, "math": math}


@dataclass
class ShapeGuards:
    env: Any  # kiln_shapes.ShapeEnv
    tensors: list[SymbolicTensor] = field(default_factory=list)
    ints: list[tuple[str, Any, int | None]] = field(
        default_factory=list
    )  # (source, symbol, example)
    checks: list[str] = field(default_factory=list)  # what check i is, as text
    fn: types.FunctionType | None = None  # the generated check (first_failure reads it)
    call: types.FunctionType | None = None  # what cache hits call: _native's, else fn
    _source: str = ""
    _consts: list[object] = field(default_factory=list)  # the entry's GuardSet.consts

    def add(self, expr: str, t: torch.Tensor, size: list[Any], stride: list[Any]) -> None:
        self.tensors.append(
            SymbolicTensor(expr, t.dtype, t.device, t.requires_grad, list(size), list(stride), t)
        )

    def add_int(self, expr: str, symbol: Any, example: int) -> None:
        """An int input whose value is ``symbol`` (a size handed to a continuation)."""
        self.ints.append((expr, symbol, example))

    def exprs(self) -> list[str]:
        return [t.expr for t in self.tensors] + [e for e, _, _ in self.ints]

    def tensor_source(self, symbol: Any) -> tuple[str, int] | None:
        """A tensor input and dimension whose size is ``symbol``."""
        for t in self.tensors:
            for d, s in enumerate(t.size):
                if s == symbol:
                    return t.expr, d
        return None

    # -- generation ----------------------------------------------------------------------

    def _lines(self, const) -> list[str]:
        from kiln_shapes import python_expr

        lines: list[str] = []
        self.checks = []

        def check(cond: str, what: str) -> None:
            lines.append(f"if not ({cond}): FAIL({len(self.checks)})")
            self.checks.append(what)

        bound: dict[Any, str] = {}
        for i, t in enumerate(self.tensors):
            check(
                f"__t{i}.dtype is {const(t.dtype)} and __t{i}.device == {const(t.device)} "
                f"and __t{i}.requires_grad is {t.requires_grad} and __t{i}.dim() == {len(t.size)}",
                f"{t.expr}: {str(t.dtype)[6:]} on {t.device}, {len(t.size)} dims, "
                f"requires_grad={t.requires_grad}",
            )
            lines.append(f"__z{i} = __t{i}.size()")
            for d, s in enumerate(t.size):
                src = f"{t.expr}.size({d})"
                if s.is_Integer:
                    check(f"__z{i}[{d}] == {int(s)}", f"{src} == {int(s)}")
                elif s in bound:
                    check(
                        f"__z{i}[{d}] == {s}",
                        f"{src} == {bound[s]} (both are the symbol {s})",
                    )
                else:
                    lines.append(f"{s} = __z{i}[{d}]")
                    bound[s] = src
            # a dimension of size 1 may have any stride (eager's contiguity ignores it)
            kept = [d for d, n in enumerate(t.size) if n != 1]
            strides = "".join(f"{python_expr(t.stride[d])}, " for d in kept)
            if len(kept) == len(t.size):
                read = f"__t{i}.stride()"
            else:
                read = "(" + "".join(f"__s{i}[{d}], " for d in kept) + ")"
                lines.append(f"__s{i} = __t{i}.stride()")
            check(
                f"{read} == ({strides})",
                f"{t.expr} is dense like the example: strides ({strides.rstrip(', ')})",
            )
        for j, (expr, s, _) in enumerate(self.ints):
            check(f"type(__i{j}) is int", f"type({expr}) is int")
            if s in bound:
                check(f"__i{j} == {s}", f"{expr} == {bound[s]} (the same size at the break)")
            else:
                lines.append(f"{s} = __i{j}")
                bound[s] = expr
        for s, info in self.env.symbols.items():
            if info.unbacked:  # a value of the data: the compiled code binds it, no guard
                continue
            declared = " (declared with mark_dynamic)" if info.declared else ""
            hi = "inf" if info.hi == math.inf else info.hi
            cond = f"{s} >= {info.lo}" + (f" and {s} <= {info.hi}" if info.hi != math.inf else "")
            check(cond, f"{s} ({info.sources[0]}) in [{info.lo}, {hi}]{declared}")
        for g in self.env.guards:
            where = f" (at {g.where})" if g.where else ""
            check(python_expr(g.expr), f"{python_expr(g.expr)}{where}")
        return lines

    def build(self, const, consts: list[object]) -> str:
        """Generate the check (``const(value)`` names a constant of the entry's list
        ``consts``); returns the guard condition that calls it as ``__k_shapes``."""
        lines = self._lines(const)
        params = ", ".join(
            [f"__t{i}" for i in range(len(self.tensors))]
            + [f"__i{j}" for j in range(len(self.ints))]
        )
        body = "".join(f"    {line}\n" for line in lines)
        self._source = f"def __shapes({params}):\n{body}    return None\n"
        self._consts = consts
        self.fn = self._compile("return {}")
        self.call, passed = self._native(params) or (self.fn, "is None")
        examples = [t.example for t in self.tensors] + [v for _, _, v in self.ints]
        for t in self.tensors:
            t.example = None  # the cache entry must not keep the example alive
        failed = self.fn(*examples)
        got = self.call(*examples)
        if failed is not None or (got is not None if passed == "is None" else got is not True):
            raise RuntimeError(
                "kiln: the shape guards reject their own example: "
                f"{self.checks[failed] if failed is not None else 'native check'}\n" + self._source
            )
        return f"__k_shapes({', '.join(self.exprs())}) {passed}"

    def _native(self, params: str) -> Any:
        """The hot-path check: a native ``ShapeBinder`` (tensor_guards.cpp) does steps 1-4
        of the design note, and the trace's guards that equate two symbols by sharing one
        slot; the other guards run in Python over the values it returns. Returns what
        cache hits call and the condition on its result, or None (the generated function
        serves) without the extension or for strides that are not dense products of sizes."""
        from kiln_capture.guards import ShapeBinder

        if ShapeBinder is None:
            return None
        import sympy
        from kiln_shapes import python_expr

        # symbols a guard equates share a slot (union-find over ``s_a == s_b`` guards)
        rep: dict[Any, Any] = {}

        def find(s: Any) -> Any:
            while rep.get(s, s) is not s:
                s = rep[s]
            return s

        rest = []
        for g in self.env.guards:
            e = g.expr
            if isinstance(e, sympy.Eq) and e.lhs.is_Symbol and e.rhs.is_Symbol:
                a, b = find(e.lhs), find(e.rhs)
                if a is not b:
                    rep[b] = a
                continue
            rest.append(g)
        slots: dict[Any, int] = {}  # class representative -> slot, in binding order

        def dim(s: Any) -> tuple[int, int, bool] | None:
            if s.is_Integer:
                return int(s), -1, False
            if not s.is_Symbol:
                return None
            r = find(s)
            first = r not in slots
            return 0, slots.setdefault(r, len(slots)), first

        specs = []
        for t in self.tensors:
            sizes = [dim(s) for s in t.size]
            strides = _dense_strides(t)
            if None in sizes or strides is None:
                return None
            specs.append((t.example, sizes, strides))
        ints = [dim(s) for _, s, _ in self.ints]
        symbols = {s for s, info in self.env.symbols.items() if not info.unbacked}
        if None in ints or any(d[1] < 0 for d in ints) or {find(s) for s in symbols} - set(slots):
            return None
        binder = ShapeBinder(len(slots))
        for example, sizes, strides in specs:
            binder.add_tensor(example, sizes, strides)
        for _, slot, first in ints:
            binder.add_int(slot, first)
        ranges: dict[int, tuple[float, float]] = {}
        for s, info in self.env.symbols.items():
            if info.unbacked:
                continue
            lo, hi = ranges.get(slots[find(s)], (0, math.inf))
            ranges[slots[find(s)]] = (max(lo, info.lo), min(hi, info.hi))
        for slot, (lo, hi) in ranges.items():
            binder.set_range(slot, int(lo), -1 if hi == math.inf else int(hi))
        if not rest:
            return binder.check, "is True"
        # every symbol a remaining guard reads, from its class's slot
        read = sorted({s for g in rest for s in g.expr.free_symbols}, key=str)
        lines = [f"__v = __k_bind({params})", "if __v is None: return -1"]
        lines += [f"{s} = __v[{slots[find(s)]}]" for s in read]
        first = len(self.checks) - len(self.env.guards)  # the trace's guards' check numbers
        lines += [
            f"if not ({python_expr(g.expr)}): return {first + self.env.guards.index(g)}"
            for g in rest
        ]
        src = f"def __shapes({params}):\n" + "".join(f"    {ln}\n" for ln in lines)
        src += "    return None\n"
        ns = {**_namespace(self._consts), "__k_bind": binder.bind}
        exec(compile(src, "<kiln shape guard>", "exec"), ns)
        fn = ns["__shapes"]
        fn.__kiln_source__ = src
        return fn, "is None"

    def _compile(self, fail: str) -> types.FunctionType:
        """The generated function, each ``FAIL(i)`` written as ``fail.format(i)``."""
        out = []
        for line in self._source.splitlines():
            if line.endswith(")") and "FAIL(" in line:
                head, num = line.rsplit("FAIL(", 1)
                line = head + fail.format(num[:-1])
            out.append(line)
        src = "\n".join(out) + "\n"
        ns = _namespace(self._consts)
        exec(compile(src, "<kiln shape guard>", "exec"), ns)
        fn = ns["__shapes"]
        fn.__kiln_source__ = src
        return fn

    def first_failure(self, tensors: list[object]) -> str | None:
        """Text for the first check ``tensors`` fail (None when they pass)."""
        if self.fn is None:
            return None
        try:
            explain = self._compile("return {}, dict(locals())")
            got = explain(*tensors)
        except Exception as e:
            return f"the shape guard raised {type(e).__name__}: {e}"
        if got is None:
            return None
        index, values = got
        names = {str(s) for s in self.env.symbols}
        shown = ", ".join(f"{k} = {v}" for k, v in values.items() if k in names)
        return f"shape guard {self.checks[index]}" + (f" [with {shown}]" if shown else "")

    def describe(self) -> tuple[list[str], list[str]]:
        """The symbols with their ranges and sources, and the shape guards with the lines
        that made them (for explain and the guards log)."""
        symbols = [info.describe() for info in self.env.symbols.values()]
        symbols += [f"{a} -> {b} (by a guard)" for a, b in self.env.replacements.items()]
        return symbols, [str(g) for g in self.env.guards]


def _dense_strides(t: SymbolicTensor) -> list[list[int] | None] | None:
    """Per dimension, the dimensions whose sizes multiply to its stride (dense in the
    example's order; None for size-1 dimensions, never checked), or None when a stride is
    something else."""
    import sympy

    ex = t.example
    if ex is None:
        return None
    kept = [d for d, n in enumerate(t.size) if n != 1]
    out: list[list[int] | None] = [None] * len(t.size)
    for d in kept:
        inner = [e for e in kept if ex.stride(e) < ex.stride(d)]
        if any(ex.stride(e) == ex.stride(d) for e in kept if e != d):
            return None
        want = sympy.Mul(*[t.size[e] for e in inner])
        if sympy.expand(want - t.stride[d]) != 0:
            return None
        out[d] = inner
    return out


__all__ = ["ShapeGuards"]
