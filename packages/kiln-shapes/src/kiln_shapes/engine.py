"""The shape engine: symbols with ranges and hints, symbolic ints, and the guards they leave.

A ``ShapeEnv`` owns the symbols of one compilation. Each symbol stands for one input size,
keeps the example's value as its *hint* and a value range (``[2, inf)`` unless declared
otherwise: sizes 0 and 1 stay specialized, as in torch.compile), and the *source* it is read
from at call time (``L['x'].size(1)``).

``SymNode`` is kiln's symbolic node class behind ``torch.SymInt`` / ``SymFloat`` /
``SymBool``: a sympy expression, its Python type and the env. Meta tensors made with
``ShapeEnv.meta_tensor`` carry symbolic sizes and strides, so ATen's meta functions compute
output shapes symbolically through these nodes (``add``, ``mul``, ``int_floordiv``, ...).

Whenever code needs a concrete answer (``if t > 1``, ``bool(a == b)`` inside a meta
function's broadcast check, ``int(n)``), the env first tries to decide it for every value in
the symbols' ranges (``statically_known``). Only if that fails does it answer from the
hints and record a *guard*: the relation, with the truth value it had, that must hold
again before the compiled code may be reused. An equality guard between a symbol and an
expression also *replaces* the symbol, so later expressions use one name for one size.

# Unbacked symbols

A value known only at run time (``t.item()``, the length of ``nonzero``'s output, of
``masked_select``'s, of ``unique``'s) is an *unbacked* symbol (``create_unbacked``): a
range (sizes ``>= 0``; an upper bound where one is known: ``nonzero``'s count is at most
``numel``) and no example value. Reasoning about it uses the range (``statically_known``);
where the range cannot decide, ``evaluate`` and ``specialize`` raise ``DataDependentError``
instead of guessing, so a capture engine breaks the graph at that line and no guard ever
names an unbacked symbol. ``guard_or_false``/``guard_or_true`` (torch's decompositions'
"fast path if provable") answer False/True there; ``torch._check`` (``expect_true``) is
taken as a fact (recorded in ``ShapeEnv.assumptions``). Unbacked symbols are named like
input sizes (``s7``) so that compilers bind and pass them as they do sizes: a compiler
binds one from the result of the op that made it. ``SymbolInfo.hint`` of an unbacked
symbol is a fallback for heuristics only (``ShapeEnv.fallback_hint``).
"""

from __future__ import annotations

import contextlib
import math
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from .functions import FloorDiv, ModIndex

Expr = sympy.Expr
INF = sympy.oo
MAX_SIZE = sympy.Integer(2**63 - 2)


class ShapeGuardError(RuntimeError):
    """A size fell outside a range declared with ``mark_dynamic(min=, max=)``."""


class AssumptionFailed(RuntimeError):
    """Raised by compiled code when a call's data takes the other side of a branch that was
    compiled speculating (``ShapeEnv.speculating``: narrow's start assumed >= 0, cov's
    weights assumed non-negative). A capture engine runs that call's graph eagerly instead
    (kiln-capture: eager's result, or eager's own error)."""


class DataDependentError(RuntimeError):
    """A question about a value known only at run time (an unbacked symbol: ``.item()``'s
    value, ``nonzero``'s length) that its range cannot answer. It has no example value to
    guard on, so the caller must stop there (kiln-capture breaks the graph at that line)."""

    def __init__(self, expr: Any, what: str = "decide"):
        self.expr = expr
        super().__init__(
            f"kiln: cannot {what} {python_expr(expr)}: it depends on tensor data "
            f"(unbacked {', '.join(sorted(str(s) for s in _free(expr)))})"
        )


@dataclass
class SymbolInfo:
    symbol: sympy.Symbol
    hint: int
    lo: int
    hi: int | float  # math.inf when unbounded
    sources: list[str] = field(default_factory=list)
    declared: bool = False  # the range came from the user (mark_dynamic)
    # known only at run time ("unbacked symbols" below): ``hint`` is then a fallback
    # for heuristics (tile sizes, orders), never for a decision about the value
    unbacked: bool = False
    pytype: type = int

    def describe(self) -> str:
        hi = "inf" if self.hi == math.inf else str(self.hi)
        src = ", ".join(self.sources)
        if self.unbacked:
            return f"{self.symbol} in [{self.lo}, {hi}] (unbacked) from {src}"
        return f"{self.symbol} in [{self.lo}, {hi}] (hint {self.hint}) from {src}"


@dataclass(frozen=True)
class Guard:
    """A relation between sizes that held when the graph was built and must hold again."""

    expr: sympy.Basic  # a relational (or boolean) expression that must be True
    where: str  # the user's source line that asked, or the op inside torch

    def __str__(self) -> str:
        return f"{python_expr(self.expr)}  # {self.where}" if self.where else python_expr(self.expr)


def python_expr(expr: sympy.Basic) -> str:
    """Python source for an expression over symbols (``//`` and ``%`` for the floor
    functions and ``Mod``, ``abs``, ``min``/``max``, ``and``/``or``, ``math.floor``/``math.ceil``;
    operands of ``//`` and ``%`` parenthesized)."""
    return _PythonPrinter().doprint(expr)


class _PythonPrinter(sympy.printing.str.StrPrinter):
    def _operand(self, e) -> str:
        """``e`` as an operand of ``//``/``%``: parenthesized unless it is an atom."""
        text = self._print(e)
        return text if e.is_Atom or isinstance(e, FloorDiv | ModIndex) else f"({text})"

    def _print_FloorDiv(self, e):
        return f"({self._operand(e.args[0])} // {self._operand(e.args[1])})"

    def _print_ModIndex(self, e):
        return f"({self._operand(e.args[0])} % {self._operand(e.args[1])})"

    def _print_Mod(self, e):
        return f"({self._operand(e.args[0])} % {self._operand(e.args[1])})"

    def _print_Abs(self, e):
        return f"abs({self._print(e.args[0])})"

    def _print_Max(self, e):
        return f"max({', '.join(self._print(a) for a in e.args)})"

    def _print_Min(self, e):
        return f"min({', '.join(self._print(a) for a in e.args)})"

    def _print_And(self, e):
        return "(" + " and ".join(self._print(a) for a in e.args) + ")"

    def _print_Or(self, e):
        return "(" + " or ".join(self._print(a) for a in e.args) + ")"

    def _print_Equivalent(self, e):
        return "(" + " == ".join(f"bool({self._print(a)})" for a in e.args) + ")"

    def _print_Xor(self, e):
        return "(" + " != ".join(f"bool({self._print(a)})" for a in e.args) + ")"

    def _print_Abs(self, e):
        return f"abs({self._print(e.args[0])})"

    def _print_Not(self, e):
        return f"(not {self._print(e.args[0])})"

    def _print_Relational(self, e):
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[e.rel_op]
        if e.rel_op in ("==", "!=") and _has_fraction(e):
            # a float specialized to its value (batch norm's n / (n - 1) over symbolic
            # sizes): Python's float arithmetic may round the expression differently
            # from sympy's exact value, so equality holds within a relative 1e-12
            close = f"math.isclose({self._print(e.lhs)}, {self._print(e.rhs)}, rel_tol=1e-12)"
            return close if e.rel_op == "==" else f"(not {close})"
        return f"{self._print(e.lhs)} {op} {self._print(e.rhs)}"

    def _print_Float(self, e):
        return repr(float(e))  # every digit: sympy's str keeps 15

    def _print_floor(self, e):
        return f"math.floor({self._print(e.args[0])})"

    def _print_ceiling(self, e):
        return f"math.ceil({self._print(e.args[0])})"

    def _print_Pow(self, e, rational=False):
        return f"({self._print(e.base)} ** {self._print(e.exp)})"

    def _print_Piecewise(self, e):
        (a, c), (b, _) = e.args[0], e.args[-1]
        return f"({self._print(a)} if {self._print(c)} else {self._print(b)})"


def _has_fraction(e: sympy.Basic) -> bool:
    """Whether an expression holds a non-integer number (its value may be a float)."""
    return any(a.is_Number and not a.is_Integer for a in e.atoms(sympy.Number))


def _user_frame() -> str:
    """The innermost stack frame outside torch, kiln and the standard library."""
    internal = ("/torch/", "/kiln_", "/kiln/", "/sympy/", "/lib/python3")
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not any(p in frame.filename for p in internal):
            return f"{frame.filename}:{frame.lineno}"
    return ""


class ShapeEnv:
    """Symbols, their ranges and hints, guards and replacements of one compilation."""

    def __init__(self, *, duck_sizing: bool = False):
        self.symbols: dict[sympy.Symbol, SymbolInfo] = {}
        self.guards: list[Guard] = []
        self.replacements: dict[sympy.Symbol, Expr] = {}
        # guarded values of expressions no symbol can be solved for: FloorDiv(s2 + 1, 2) -> 1
        self.expr_values: dict[Expr, Expr] = {}
        self.duck_sizing = duck_sizing
        # where a guard recorded without an explicit location comes from: a capture engine
        # that evaluates the user's code symbolically (so that the user's frame is not on
        # the Python stack) sets this to return the line it is evaluating
        self.locate: Callable[[], str | None] | None = None
        self._by_hint: dict[int, sympy.Symbol] = {}
        self.has_unbacked = False  # whether create_unbacked made a symbol here
        # facts about unbacked values the code asserted (torch._check), or that a
        # speculation took (``speculating``): not guards
        self.assumptions: list[sympy.Basic] = []
        # while set (``speculating``), what ``evaluate`` answers for an undecidable
        # condition on unbacked values, instead of raising
        self.speculate: Callable[[Any], bool] | None = None
        # while speculating: who checks a fact about unbacked values at run time (a
        # speculation's, or one torch._check asserts)
        self.on_assume: Callable[[Any], None] | None = None
        self._guard_keys: set[sympy.Basic] = set()
        # answers given while nothing they depend on changed since (``_answers``)
        self._memo: dict[Any, Any] = {}
        self._memo_state: tuple = ()
        self._ranges_moved = 0  # ranges changed outside ``assume`` (size_oblivious)

    # ----------------------------------------------------------------- symbols
    def create_symbol(
        self,
        hint: int,
        source: str,
        *,
        lo: int | None = None,
        hi: int | None = None,
        duck: bool | None = None,
    ) -> Expr:
        """A symbol for a size read from ``source`` whose example value is ``hint``.

        Sizes 0 and 1 stay specialized (an ``Integer``) unless a range that includes them
        is declared. With duck sizing (``duck=True``, or the env's ``duck_sizing``), a size
        with no declared range shares the symbol of an earlier size of equal hint: the
        guard that they stay equal is the binding itself. Tensor sizes are not ducked by
        default: a batch of 3 that equals 3 channels would become 3 when the channels are
        specialized; equal sizes are related by the guards that need them (``s1 == s0``
        replaces ``s1``). An int argument that was a size (capture's continuations) asks
        for duck sizing, to be bound to the tensor size it came from."""
        duck = self.duck_sizing if duck is None else duck
        hint = int(hint)
        declared = lo is not None or hi is not None
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"kiln: a dynamic dimension needs min <= max, got min={lo}, max={hi}")
        lo = 2 if lo is None else int(lo)
        top: int | float = math.inf if hi is None else int(hi)
        if hint < lo or hint > top:
            if not declared:
                return sympy.Integer(hint)
            raise ShapeGuardError(
                f"kiln: {source} is {hint}, outside its declared range [{lo}, {hi}]"
            )
        if duck and not declared and hint in self._by_hint:
            s = self._by_hint[hint]
            self.symbols[s].sources.append(source)
            return s
        s = sympy.Symbol(f"s{len(self.symbols)}", integer=True, positive=True)
        self.symbols[s] = SymbolInfo(s, hint, lo, top, [source], declared)
        if not declared:
            self._by_hint.setdefault(hint, s)
        return s

    def create_unbacked(
        self,
        source: str,
        *,
        pytype: type = int,
        lo: int | float | None = 0,
        hi: int | float | None = None,
    ) -> Expr:
        """A symbol for a value known only at run time (``source`` says what makes it:
        ``aten.nonzero`` at a line), in ``[lo, hi]`` (None: unbounded). Ints are sizes by
        default (``lo=0``); ``pytype=float`` makes a real symbol (``.item()`` of a float
        tensor); a bool is an int symbol in [0, 1] (``unbacked_value`` wraps it)."""
        lo_v: int | float = -math.inf if lo is None else lo
        hi_v: int | float = math.inf if hi is None else hi
        name = f"s{len(self.symbols)}"
        if pytype is float:
            s = sympy.Symbol(name, real=True)
        elif lo_v >= 1:
            s = sympy.Symbol(name, integer=True, positive=True)
        elif lo_v >= 0:
            s = sympy.Symbol(name, integer=True, nonnegative=True)
        else:
            s = sympy.Symbol(name, integer=True)
        fallback = _FALLBACK_HINT if lo_v <= _FALLBACK_HINT <= hi_v else lo_v
        if fallback in (-math.inf, math.inf):
            fallback = 0
        self.symbols[s] = SymbolInfo(
            s, int(fallback), lo_v, hi_v, [source], unbacked=True, pytype=pytype
        )
        self.has_unbacked = True
        return s

    def unbacked_value(self, source: str, pytype: type, **range_: Any) -> Any:
        """A fresh ``torch.SymInt``/``SymFloat``/``SymBool`` standing for a run-time value."""
        if pytype is bool:
            s = self.create_unbacked(source, pytype=int, lo=0, hi=1)
            self.symbols[s].pytype = bool
            return torch.SymBool(SymNode(self, sympy.Eq(s, 1), bool))
        s = self.create_unbacked(source, pytype=pytype, **range_)
        return torch.SymInt(SymNode(self, s, int)) if pytype is int else self.symfloat(s)

    def is_unbacked(self, s: Any) -> bool:
        info = self.symbols.get(s)
        return info is not None and info.unbacked

    def unbacked_in(self, expr: Any) -> set[sympy.Symbol]:
        """The unbacked symbols ``expr`` depends on (after replacements)."""
        if not self.has_unbacked:  # the common case: no data-dependent value in this env
            return set()
        free = getattr(sympy.sympify(expr), "free_symbols", set())
        return {s for s in free if self.is_unbacked(s)}

    def hints(self) -> dict[sympy.Symbol, int]:
        return {
            s: sympy.Integer(info.hint) for s, info in self.symbols.items() if not info.unbacked
        }

    def hint(self, expr: Any) -> Any:
        """The value of ``expr`` at the hints (an int, float or bool); DataDependentError
        when it depends on an unbacked symbol (whose value no example gives)."""
        if isinstance(expr, (int, float, bool)):
            return expr
        expr = sympy.sympify(expr)
        if self.unbacked_in(expr):
            raise DataDependentError(expr, "give a value for")
        return _to_python(expr.xreplace(self.hints()))

    def fallback_hint(self, expr: Any) -> Any:
        """``expr`` at the hints, unbacked symbols at their fallback value: for heuristics
        (a tile size, an order of loops), never for a decision about the value."""
        if isinstance(expr, (int, float, bool)):
            return expr
        values = {s: sympy.Integer(info.hint) for s, info in self.symbols.items()}
        return _to_python(sympy.sympify(expr).xreplace(values))

    def simplify(self, expr: Any) -> Any:
        expr = sympy.sympify(expr)
        if self.replacements and expr.free_symbols & self.replacements.keys():
            expr = expr.xreplace(self.replacements)
            expr = self.simplify(expr)
        if self.expr_values and expr.free_symbols:
            replaced = expr.xreplace(self.expr_values)
            if replaced != expr:
                expr = self.simplify(replaced)
        return expr

    # ----------------------------------------------------------------- symbolic values
    def symint(self, expr: Any) -> int | torch.SymInt:
        expr = self.simplify(expr)
        if expr.is_Integer:
            return int(expr)
        return torch.SymInt(SymNode(self, expr, int))

    def symfloat(self, expr: Any) -> float | torch.SymFloat:
        expr = self.simplify(expr)
        if expr.is_Number:
            return float(expr)
        return torch.SymFloat(SymNode(self, expr, float))

    def meta_tensor(
        self,
        size: Sequence[Any],
        stride: Sequence[Any],
        dtype: torch.dtype,
        *,
        storage_offset: Any = 0,
        requires_grad: bool = False,
    ) -> torch.Tensor:
        """A meta tensor whose sizes and strides are the given expressions."""
        t = torch.empty_strided(
            [self.symint(s) for s in size],
            [self.symint(s) for s in stride],
            dtype=dtype,
            device="meta",
        )
        off = self.symint(storage_offset)
        if not (isinstance(off, int) and off == 0):
            t = t.as_strided(t.shape, t.stride(), off)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def symbolic_sizes(
        self,
        t: torch.Tensor,
        source: str,
        dims: Iterable[int],
        ranges: dict[int, tuple[int | None, int | None]] | None = None,
    ) -> tuple[list[Expr], list[Expr]]:
        """Symbolic sizes and strides for tensor ``t`` read from ``source`` with the sizes of
        ``dims`` symbolic. Strides of a dense tensor (any dimension order) become products
        of the sizes of the faster dimensions; the sizes of a tensor that is not dense (a
        slice, an expanded view) stay specialized."""
        ranges = ranges or {}
        dims = sorted({d % t.dim() for d in dims}) if t.dim() else []
        size = [sympy.Integer(n) for n in t.shape]
        stride = [sympy.Integer(n) for n in t.stride()]
        if not dims:
            return size, stride
        order = _dense_order(t)
        if order is None:
            return size, stride
        for d in dims:
            lo, hi = ranges.get(d, (None, None))
            size[d] = self.create_symbol(t.shape[d], f"{source}.size({d})", lo=lo, hi=hi)
        acc: Expr = sympy.Integer(1)
        for d in order:  # fastest first
            stride[d] = acc
            acc = acc * (sympy.Max(size[d], 1) if size[d].is_Integer else size[d])
        return size, stride

    def symbolic_tensor(
        self,
        t: torch.Tensor,
        source: str,
        dims: Iterable[int] | None = None,
        ranges: dict[int, tuple[int | None, int | None]] | None = None,
    ) -> torch.Tensor:
        """A meta tensor like ``t`` with the sizes of ``dims`` (default: all) symbolic."""
        dims = range(t.dim()) if dims is None else dims
        size, stride = self.symbolic_sizes(t, source, dims, ranges)
        return self.meta_tensor(size, stride, t.dtype, requires_grad=t.requires_grad)

    # ----------------------------------------------------------------- reasoning
    def _answers(self) -> dict[Any, Any]:
        """Answers to questions about expressions (``statically_known``, ``evaluate``,
        comparisons), kept while the state they read is unchanged: the symbols and their
        ranges, the replacements, the expressions' guarded values and the assumptions
        only ever grow, so their sizes (and a count of ``size_oblivious``'s temporary
        ranges) tell whether anything changed. A model's repeated layers ask the same
        questions about the same sizes: each is answered once (the answer is sympy's
        interval and relational work, milliseconds each)."""
        state = (
            len(self.symbols),
            len(self.replacements),
            len(self.expr_values),
            len(self.assumptions),
            self._ranges_moved,
        )
        if state != self._memo_state:
            self._memo.clear()
            self._memo_state = state
        return self._memo

    def bounds(self, expr: Any) -> tuple[Any, Any]:
        """An interval [lo, hi] containing every value of ``expr`` over the symbols' ranges."""
        return _bounds(self.simplify(expr), self)

    def statically_known(self, cond: Any) -> bool | None:
        """True or False when ``cond`` has that value for every size in range, else None."""
        answers = self._answers()
        key = ("known", cond)
        got = answers.get(key, _UNKNOWN)
        if got is _UNKNOWN:
            got = answers[key] = self._statically_known(cond)
        return got

    def _statically_known(self, cond: Any) -> bool | None:
        cond = self.simplify(cond)
        if cond in (sympy.true, True):
            return True
        if cond in (sympy.false, False):
            return False
        if isinstance(cond, sympy.Not):
            inner = self.statically_known(cond.args[0])
            return None if inner is None else not inner
        if isinstance(cond, (sympy.Equivalent, sympy.Xor)):
            vals = [self.statically_known(a) for a in cond.args]
            if any(v is None for v in vals):
                return None
            same = all(v == vals[0] for v in vals)
            return same if isinstance(cond, sympy.Equivalent) else (sum(vals) % 2 == 1)
        if isinstance(cond, (sympy.And, sympy.Or)):
            vals = [self.statically_known(a) for a in cond.args]
            if isinstance(cond, sympy.And):
                if any(v is False for v in vals):
                    return False
                return True if all(v is True for v in vals) else None
            if any(v is True for v in vals):
                return True
            return False if all(v is False for v in vals) else None
        if not isinstance(cond, sympy.core.relational.Relational):
            return None
        if _is_truth(cond.lhs) or _is_truth(cond.rhs):
            return None  # a comparison of truth values: decided at the hints
        diff = sympy.expand(self.refine(cond.lhs - cond.rhs))
        if diff.is_Number:
            return bool(cond.func(diff, 0))
        lo, hi = _bounds(diff, self)
        op = cond.rel_op
        if op == "==":
            if lo > 0 or hi < 0:
                return False
            return None
        if op == "!=":
            if lo > 0 or hi < 0:
                return True
            return None
        if op == ">=":
            return True if lo >= 0 else False if hi < 0 else None
        if op == ">":
            return True if lo > 0 else False if hi <= 0 else None
        if op == "<=":
            return True if hi <= 0 else False if lo > 0 else None
        if op == "<":
            return True if hi < 0 else False if lo >= 0 else None
        return None

    def refine(self, expr: Any) -> Any:
        """``expr`` with Max/Min whose winner the ranges decide, and remainders and floor
        divisions of a smaller non-negative number by a larger one, resolved."""
        expr = self.simplify(expr)
        if not expr.has(sympy.Max, sympy.Min, ModIndex, FloorDiv):
            return expr

        def visit(e: Any) -> Any:
            if not e.args:
                return e
            args = [visit(a) for a in e.args]
            e = e.func(*args) if tuple(args) != e.args else e
            if isinstance(e, (sympy.Max, sympy.Min)) and len(e.args) == 2:
                a, b = e.args
                d = _bounds(sympy.expand(a - b), self)
                if d[0] >= 0:
                    return a if isinstance(e, sympy.Max) else b
                if d[1] <= 0:
                    return b if isinstance(e, sympy.Max) else a
            if isinstance(e, (ModIndex, FloorDiv)):
                base, div = e.args
                blo = _bounds(base, self)[0]
                gap = _bounds(sympy.expand(div - base), self)[0]
                if blo >= 0 and gap > 0:  # 0 <= base < div
                    return base if isinstance(e, ModIndex) else sympy.Integer(0)
            return e

        return visit(expr)

    @contextlib.contextmanager
    def speculating(
        self,
        on_assume: Callable[[Any], None] | None = None,
        choose: Callable[[], bool] | None = None,
    ) -> Iterator[None]:
        """Within this block, a branch on unbacked values that the ranges cannot decide
        takes the side ``choose()`` says, False by default (inside one torch op: the side
        where a check such as ``if (w < 0).any(): raise`` or ``if start < 0: start += n``
        does nothing; a capture engine that sees that side raise tries the other), and
        the fact it relies on is recorded in ``assumptions`` and handed to ``on_assume``,
        for a compiler to check at run time (kiln-aot emits ``aten._assert_scalar``).
        Never a guard, never a value from an example."""
        prev, prev_on_assume = self.speculate, self.on_assume

        def take(cond: Any) -> bool:
            side = choose() if choose is not None else False
            fact = self.simplify(cond if side else _negate(cond))
            self.assume(fact)  # later questions use it (``start >= 0`` narrows a range)
            if on_assume is not None:
                on_assume(fact)
            return side

        self.speculate, self.on_assume = take, on_assume
        try:
            yield
        finally:
            self.speculate, self.on_assume = prev, prev_on_assume

    def size_oblivious(self, cond: Any) -> bool | None:
        """``cond`` decided as if every unbacked size were at least 2 (torch's "size
        oblivious" reading: a size 0 or 1 takes no other branch of a meta function that
        asks), or None."""
        saved = {}
        for s, info in self.symbols.items():
            if info.unbacked and info.pytype is int and info.lo >= 0 and info.hi >= 2:
                saved[s] = info.lo
                info.lo = max(info.lo, 2)
        self._ranges_moved += 1  # answers under these ranges are not kept past them
        try:
            return self.statically_known(cond)
        finally:
            for s, lo in saved.items():
                self.symbols[s].lo = lo
            self._ranges_moved += 1

    def assume(self, cond: Any) -> None:
        """Take ``cond`` (about unbacked values) as a fact: ``s >= c`` / ``s <= c`` of one
        symbol narrow its range; others are recorded in ``assumptions`` only."""
        cond = self.simplify(cond)
        self.assumptions.append(cond)
        if not isinstance(cond, sympy.core.relational.Relational):
            return
        diff = sympy.expand(cond.lhs - cond.rhs)
        free = diff.free_symbols
        if len(free) != 1:
            return
        (sym,) = free
        info = self.symbols.get(sym)
        c = diff.coeff(sym, 1)
        rest = diff - c * sym
        if info is None or not info.unbacked or info.pytype is not int:
            return
        if c not in (1, -1) or not rest.is_Number:
            return
        bound = -rest / c  # cond is c*(sym - bound) REL 0
        op = (
            cond.rel_op
            if c == 1
            else {">": "<", ">=": "<=", "<": ">", "<=": ">="}.get(cond.rel_op, cond.rel_op)
        )
        if op == ">=":
            info.lo = max(info.lo, math.ceil(bound))
        elif op == ">":
            info.lo = max(info.lo, math.floor(bound) + 1)
        elif op == "<=":
            info.hi = min(info.hi, math.floor(bound))
        elif op == "<":
            info.hi = min(info.hi, math.ceil(bound) - 1)

    def _maybe_evaluate_static(self, expr: Any, **_: Any) -> Any:
        """torch's helper functions ask this: the value when the ranges decide it, else None."""
        known = self.statically_known(expr)
        return None if known is None else sympy.true if known else sympy.false

    def evaluate(self, cond: Any, where: str | None = None) -> bool:
        """The truth of ``cond``: static when the ranges decide it, else the hints' answer,
        recorded as a guard."""
        answers = self._answers()
        key = ("evaluate", cond)
        got = answers.get(key)
        if got is not None:  # decided (and guarded) before, nothing changed since
            return got
        cond = self.simplify(cond)
        known = self.statically_known(cond)
        if known is not None:
            answers[key] = known
            return known
        cond = self.refine(cond)
        if self.unbacked_in(cond):
            if self.speculate is not None:
                return self.speculate(cond)  # (a choice: asked again each time)
            raise DataDependentError(cond)
        value = bool(self.hint(cond))
        self.add_guard(cond if value else _negate(cond), where)
        self._answers()[key] = value  # (after the guard: a replacement it made clears)
        return value

    def specialize(self, expr: Any, where: str | None = None) -> int | float:
        """The concrete value of ``expr``, guarding that it stays that value."""
        expr = self.simplify(expr)
        if self.unbacked_in(expr):
            raise DataDependentError(expr, "specialize")
        value = self.hint(expr)
        if not expr.is_Number:
            self.add_guard(sympy.Eq(expr, value), where)
        return value

    def add_guard(self, cond: sympy.Basic, where: str | None = None) -> None:
        cond = self.simplify(cond)
        if cond in (sympy.true, True):
            return
        if cond in (sympy.false, False):
            raise AssertionError("kiln: a shape guard that can never hold was recorded")
        key = _guard_key(cond)
        if key in self._guard_keys:
            return
        self._guard_keys.add(key)
        if where is None and self.locate is not None:
            where = self.locate()
        self.guards.append(Guard(cond, _user_frame() if where is None else where))
        if isinstance(cond, sympy.Eq):
            self._replace(cond)

    def _replace(self, eq: sympy.Eq) -> None:
        """s_new == expr: later expressions use ``expr`` for the newer symbol. A linear
        relation is solved for its newest symbol (``s9 + 1 == s5 + 1``: ``s9 -> s5``)."""
        diff = sympy.expand(eq.lhs - eq.rhs)
        for a in sorted(diff.free_symbols & self.symbols.keys(), key=_index, reverse=True):
            c = diff.coeff(a, 1)
            rest = sympy.expand(diff - c * a)
            if c not in (1, -1) or a in rest.free_symbols:
                continue
            b = sympy.expand(-rest / c)
            self.replacements[a] = b
            for k, v in list(self.replacements.items()):
                self.replacements[k] = v.xreplace({a: b})
            return
        # no symbol to solve for: an expression guarded to a number is that number
        for lhs, rhs in ((eq.lhs, eq.rhs), (eq.rhs, eq.lhs)):
            if rhs.is_Number and not lhs.is_Number and not isinstance(lhs, sympy.Add):
                self.expr_values[lhs] = rhs
                return

    # ----------------------------------------------------------------- call time
    def check(self, values: dict[sympy.Symbol, int]) -> str | None:
        """None when ``values`` (one per symbol) satisfy the ranges and guards, else the
        first failing condition, as text."""
        for s, info in self.symbols.items():
            if info.unbacked:
                continue  # bound by the compiled code, not by its inputs
            v = values[s]
            if v < info.lo or v > info.hi:
                return f"{s} = {v} outside [{info.lo}, {info.hi}] ({info.sources[0]})"
        for g in self.guards:
            if not bool(g.expr.xreplace(values)):
                return (
                    f"{python_expr(g.expr)} (built at {g.where})"
                    if g.where
                    else python_expr(g.expr)
                )
        return None

    def describe(self) -> list[str]:
        lines = [info.describe() for info in self.symbols.values()]
        lines += [f"{a} -> {b}" for a, b in self.replacements.items()]
        return lines


_UNKNOWN = object()  # (a missing answer: None is an answer of statically_known)

# the value heuristics use for an unbacked symbol (ShapeEnv.fallback_hint)
_FALLBACK_HINT = 8


def _free(expr: Any) -> set:
    return set(getattr(sympy.sympify(expr), "free_symbols", set()))


def _index(s: sympy.Symbol) -> int:
    try:
        return int(s.name[1:])
    except ValueError:
        return -1


def _guard_key(cond: sympy.Basic) -> Any:
    """One key for ``a == b`` and ``b == a`` (and ``a < b``, ``b > a``)."""
    if not isinstance(cond, sympy.core.relational.Relational):
        return cond
    op = cond.rel_op
    diff = sympy.expand(cond.lhs - cond.rhs)
    if op in ("<", "<="):
        op, diff = {"<": ">", "<=": ">="}[op], -diff
    if op in ("==", "!=") and diff.could_extract_minus_sign():
        diff = -diff
    return (op, diff)


def _negate(cond: sympy.Basic) -> sympy.Basic:
    return (
        sympy.Not(cond) if not isinstance(cond, sympy.core.relational.Relational) else cond.negated
    )


def _to_python(value: sympy.Basic) -> Any:
    if value in (sympy.true, sympy.false):
        return bool(value)
    if isinstance(value, bool):
        return value
    if value.is_Integer:
        return int(value)
    if value.is_Number:
        return float(value)
    if isinstance(value, sympy.Basic) and not value.free_symbols:
        return _to_python(sympy.nsimplify(value) if value.is_Float else value.doit())
    raise ValueError(f"kiln: {value} has no value at the hints")


def _dense_order(t: torch.Tensor) -> list[int] | None:
    """Dimensions from fastest to slowest when ``t`` is non-overlapping and dense."""
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), -d))
    acc = 1
    for d in order:
        if t.shape[d] != 1 and t.stride(d) != acc:
            return None
        acc *= max(t.shape[d], 1)
    return order


def _bounds(expr: Any, env: ShapeEnv) -> tuple[Any, Any]:
    """Interval arithmetic over the symbols' ranges (sympy numbers, -oo/oo for unbounded)."""
    expr = sympy.sympify(expr)
    if expr.is_Number:
        return expr, expr
    if isinstance(expr, sympy.Symbol):
        info = env.symbols.get(expr)
        if info is None:
            return (0 if expr.is_nonnegative else -INF), INF
        if info.unbacked:
            lo = -INF if info.lo == -math.inf else sympy.Integer(info.lo)
            if info.hi == math.inf:  # a size below 2**63 - 1; a scalar unbounded
                return lo, (MAX_SIZE if info.lo >= 0 and info.pytype is int else INF)
            return lo, sympy.Integer(info.hi)
        # an unbounded size is still below 2**63 - 1 (sys.maxsize: a slice's "to the end")
        return sympy.Integer(info.lo), (MAX_SIZE if info.hi == math.inf else sympy.Integer(info.hi))
    if isinstance(expr, sympy.Add):
        lo, hi = sympy.Integer(0), sympy.Integer(0)
        for a in expr.args:
            alo, ahi = _bounds(a, env)
            lo, hi = lo + alo, hi + ahi
        if expr.has(FloorDiv, ModIndex):  # linear relaxations let sizes cancel
            rlo = sympy.expand(_relax(expr, upper=False))
            rhi = sympy.expand(_relax(expr, upper=True))
            if not rlo.has(FloorDiv, ModIndex) and not rhi.has(FloorDiv, ModIndex):
                lo, hi = max(lo, _bounds(rlo, env)[0]), min(hi, _bounds(rhi, env)[1])
        if lo <= 0 <= hi:  # sign undecided; terms may vary together: s0*s1 - s0 = s0*(s1 - 1)
            factored = sympy.factor(expr)
            if not isinstance(factored, sympy.Add):
                flo, fhi = _bounds(factored, env)
                lo, hi = max(lo, flo), min(hi, fhi)
        return lo, hi
    if isinstance(expr, sympy.Mul):
        lo, hi = sympy.Integer(1), sympy.Integer(1)
        for a in expr.args:
            alo, ahi = _bounds(a, env)
            cands = [_mul(x, y) for x in (lo, hi) for y in (alo, ahi)]
            lo, hi = min(cands), max(cands)
        return lo, hi
    if isinstance(expr, FloorDiv):
        (blo, bhi), (dlo, dhi) = _bounds(expr.args[0], env), _bounds(expr.args[1], env)
        if dlo > 0 and blo >= 0:
            return (sympy.floor(blo / dhi) if dhi != INF else 0), (
                INF if bhi == INF else sympy.floor(bhi / dlo)
            )
        return -INF, INF
    if isinstance(expr, ModIndex):
        _, dhi = _bounds(expr.args[1], env)
        bl, bh = _bounds(expr.args[0], env)
        hi = dhi - 1 if dhi != INF else INF
        if bl >= 0 and bh != INF:
            hi = min(hi, bh)
        return sympy.Integer(0), hi
    if isinstance(expr, (sympy.Max, sympy.Min)):
        bs = [_bounds(a, env) for a in expr.args]
        pick = max if isinstance(expr, sympy.Max) else min
        return pick(b[0] for b in bs), pick(b[1] for b in bs)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        blo, bhi = _bounds(expr.base, env)
        if blo >= 0:
            return blo**expr.exp, bhi**expr.exp
    return -INF, INF


def _relax(expr: Any, upper: bool) -> Any:
    """Replace the terms ``c*FloorDiv(a, k)`` of a sum (k a positive integer) by the linear
    bound ``a/k`` or ``(a-k+1)/k`` that keeps the sum an upper (lower) bound, and
    ``c*ModIndex(a, k)`` by 0 or k-1, so that sizes cancel (``s//2 - s <= 0``)."""
    out = []
    for term in sympy.Add.make_args(expr):
        c, rest = term.as_coeff_Mul()
        if isinstance(rest, (FloorDiv, ModIndex)) and rest.args[1].is_Integer and rest.args[1] > 0:
            a, k = rest.args
            big = (c > 0) == upper  # the bound of rest that pushes the sum the right way
            if isinstance(rest, FloorDiv):
                rest = a / k if big else (a - k + 1) / k
            else:
                rest = k - 1 if big else sympy.Integer(0)
        out.append(c * rest)
    return sympy.Add(*out)


def _mul(a: Any, b: Any) -> Any:
    if a == 0 or b == 0:
        return sympy.Integer(0)
    return a * b


_COMPARE = {
    "eq": sympy.Eq,
    "ne": sympy.Ne,
    "lt": sympy.Lt,
    "le": sympy.Le,
    "gt": sympy.Gt,
    "ge": sympy.Ge,
}


class SymNode:
    """kiln's node behind ``torch.SymInt``/``SymFloat``/``SymBool``: a sympy expression."""

    def __init__(self, env: ShapeEnv, expr: Any, pytype: type):
        self.env = env
        self.expr = sympy.sympify(expr)
        self.pytype = pytype

    def __repr__(self) -> str:
        return f"SymNode({self.expr}: {self.pytype.__name__})"

    # ---- what the C++ side and torch's magic methods ask
    def is_int(self) -> bool:
        return self.pytype is int

    def is_float(self) -> bool:
        return self.pytype is float

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_nested_int(self) -> bool:
        return False

    def is_symbolic(self) -> bool:
        return not self.is_constant()

    def is_constant(self) -> bool:
        # torch's magic methods call get_constant() on a constant node, which knows
        # SymInt and SymBool only: a float is never constant (``t ** 0.5`` once t == 16)
        if self.pytype is float:
            return False
        return bool(self.expr.is_Number) or self.expr in (sympy.true, sympy.false)

    def has_hint(self) -> bool:
        return not (self.env.has_unbacked and self.env.unbacked_in(self.env.simplify(self.expr)))

    @property
    def hint(self) -> Any:
        """The value at the example's sizes; None for a value of the data (torch's
        helpers read None as "no hint")."""
        if not self.has_hint():
            return None
        return self.env.hint(self.expr)

    # torch's helpers that decompositions call (statically_known_true, guard_or_false, ...)
    # read ``_hint``; with no ``shape_env`` attribute they take the path meant for other
    # engines' nodes and ask the node itself (guard_bool)
    _hint = hint

    @property
    def shape_env(self) -> _UnbackedQuestions:
        """Only for a value that depends on unbacked symbols: torch's ``guard_or_false`` /
        ``guard_or_true`` ask it for an answer with a default (their fast path when
        provable); every other node has none (AttributeError: torch asks the node)."""
        if not self.env.has_unbacked or not self.env.unbacked_in(self.env.simplify(self.expr)):
            raise AttributeError("shape_env")
        return _UnbackedQuestions(self.env)

    def maybe_as_int(self) -> int | None:
        e = self.env.simplify(self.expr)
        return int(e) if self.pytype is int and e.is_Integer else None

    def maybe_as_bool(self) -> bool | None:
        e = self.env.simplify(self.expr)
        return bool(e) if e in (sympy.true, sympy.false) else None

    def constant_int(self) -> int | None:
        return self.maybe_as_int()

    def str(self) -> str:
        return str(self.expr)

    def _graph_repr(self) -> str:
        return str(self.expr)

    def __str__(self) -> str:
        return str(self.expr)

    def clone(self) -> SymNode:
        return self

    def wrap_int(self, num: int) -> SymNode:
        return SymNode(self.env, sympy.Integer(num), int)

    def wrap_float(self, num: float) -> SymNode:
        return SymNode(self.env, sympy.Float(num), float)

    def wrap_bool(self, num: bool) -> SymNode:
        return SymNode(self.env, sympy.true if num else sympy.false, bool)

    # ---- concrete answers (guards)
    def guard_int(self, file: str = "", line: int = 0) -> int:
        return int(self.env.specialize(self.expr, _where(file, line)))

    def guard_float(self, file: str = "", line: int = 0) -> float:
        return float(self.env.specialize(self.expr, _where(file, line)))

    def guard_bool(self, file: str = "", line: int = 0) -> bool:
        return self.env.evaluate(self.expr, _where(file, line))

    def expect_true(self, file: str = "", line: int = 0) -> bool:
        """``torch._check(cond)``: a fact the code asserts. About unbacked values it is
        assumed (the op that computes them checks it at run time) and narrows a range."""
        if not self.env.unbacked_in(self.env.simplify(self.expr)):
            return self.guard_bool(file, line)
        if self.env.statically_known(self.expr) is not None:
            return self.guard_bool(file, line)
        self.env.assume(self.expr)
        if self.env.on_assume is not None:  # checked when the graph runs (kiln-aot)
            self.env.on_assume(self.env.simplify(self.expr))
        return True

    def expect_size(self, file: str = "", line: int = 0) -> bool:
        return SymNode(self.env, sympy.Ge(self.expr, 0), bool).expect_true(file, line)

    def guard_size_oblivious(self, file: str = "", line: int = 0) -> bool:
        if self.env.unbacked_in(self.env.simplify(self.expr)):
            known = self.env.statically_known(self.expr)
            if known is None:
                known = self.env.size_oblivious(self.expr)
            if known is not None:
                return known
        return self.guard_bool(file, line)

    def guard_or_false(self, file: str = "", line: int = 0) -> bool:
        return self._guard_or(False, file, line)

    def guard_or_true(self, file: str = "", line: int = 0) -> bool:
        return self._guard_or(True, file, line)

    def _guard_or(self, default: bool, file: str, line: int) -> bool:
        """A fast path's question (metadata, contiguity): about unbacked values the ranges
        answer it, else ``default`` (never a speculation, never an error)."""
        if self.env.has_unbacked and self.env.unbacked_in(self.env.simplify(self.expr)):
            known = self.env.statically_known(self.expr)
            return default if known is None else known
        return self.guard_bool(file, line)

    def statically_known_true(self, file: str = "", line: int = 0) -> bool:
        return self.env.statically_known(self.expr) is True

    def bool_(self) -> bool:
        return self.guard_bool()

    def int_(self) -> int:
        return self.guard_int()

    def float_(self) -> float:
        return self.guard_float()

    # ---- arithmetic
    def _new(self, expr: Any, pytype: type) -> SymNode:
        return SymNode(self.env, self.env.simplify(expr), pytype)

    def _binary(self, op: str, other: SymNode, make: Callable[[], Any], pytype: type) -> SymNode:
        """``make()``'s expression, simplified, as a node of ``pytype``; the same operation
        on the same expressions again is answered from ``ShapeEnv._answers``."""
        answers = self.env._answers()
        a, b = self.expr, other.expr
        key = (op, type(a), a, type(b), b, pytype)  # (types: 2 and 2.0 stay apart)
        expr = answers.get(key)
        if expr is None:
            expr = answers[key] = self.env.simplify(make())
        return SymNode(self.env, expr, pytype)

    def add(self, other: SymNode) -> SymNode:
        return self._binary("+", other, lambda: self.expr + other.expr, _num_type(self, other))

    def sub(self, other: SymNode) -> SymNode:
        return self._binary("-", other, lambda: self.expr - other.expr, _num_type(self, other))

    def mul(self, other: SymNode) -> SymNode:
        return self._binary("*", other, lambda: self.expr * other.expr, _num_type(self, other))

    def sym_sum(self, others: Sequence[SymNode]) -> SymNode:
        return self._new(sympy.Add(*(o.expr for o in others)), int)

    def neg(self) -> SymNode:
        return self._new(-self.expr, self.pytype)

    def abs(self) -> SymNode:
        return self._new(sympy.Abs(self.expr), self.pytype)

    def pos(self) -> SymNode:
        return self

    def int_floordiv(self, other: SymNode) -> SymNode:
        return self._binary("//", other, lambda: self._floordiv(other), int)

    def _floordiv(self, other: SymNode) -> Any:
        a, b = self.expr, other.expr
        nonneg = self.env.statically_known(sympy.Ge(a, 0)) and self.env.statically_known(
            sympy.Gt(b, 0)
        )
        return FloorDiv(a, b) if nonneg else sympy.floor(a / b)

    floordiv = int_floordiv

    def mod(self, other: SymNode) -> SymNode:
        a, b = self.expr, other.expr
        if self.env.statically_known(sympy.Ge(a, 0)) and self.env.statically_known(sympy.Gt(b, 0)):
            return self._binary("%", other, lambda: ModIndex(a, b), int)
        return self._binary("mod", other, lambda: sympy.Mod(a, b), _num_type(self, other))

    def truediv(self, other: SymNode) -> SymNode:
        return self._new(self.expr / other.expr, float)

    int_truediv = truediv
    float_truediv = truediv

    def pow_by_natural(self, other: SymNode) -> SymNode:
        return self._new(self.expr**other.expr, int)

    def float_pow(self, other: SymNode) -> SymNode:
        return self._new(self.expr**other.expr, float)

    def pow(self, other: SymNode) -> SymNode:
        return self._new(self.expr**other.expr, _num_type(self, other))

    def sym_min(self, other: SymNode) -> SymNode:
        return self._binary(
            "min", other, lambda: sympy.Min(self.expr, other.expr), _num_type(self, other)
        )

    def sym_max(self, other: SymNode) -> SymNode:
        return self._binary(
            "max", other, lambda: sympy.Max(self.expr, other.expr), _num_type(self, other)
        )

    def sym_float(self) -> SymNode:
        return SymNode(self.env, self.expr, float)

    def sym_int(self) -> SymNode:
        return self._new(sympy.floor(self.expr) if self.pytype is float else self.expr, int)

    def floor(self) -> SymNode:
        return self._new(sympy.floor(self.expr), int)

    def ceil(self) -> SymNode:
        return self._new(sympy.ceiling(self.expr), int)

    def trunc(self) -> SymNode:
        return self.sym_int()

    def round(self, ndigits: int | None = None) -> SymNode:
        return self._new(sympy.floor(self.expr + sympy.Rational(1, 2)), int)

    def is_integer(self) -> SymNode:
        return self._new(sympy.Eq(self.expr, sympy.floor(self.expr)), bool)

    # ---- comparisons and logic
    def _compare(self, other: SymNode, op: str) -> SymNode:
        if bool in (self.pytype, other.pytype) and op in ("eq", "ne"):
            # truth values: a == b is Equivalent(a, b), a != b is Xor(a, b)
            fn = sympy.Equivalent if op == "eq" else sympy.Xor
            a, b = (_as_bool(n.expr, n.pytype) for n in (self, other))
            return self._binary(
                f"bool {op} {self.pytype} {other.pytype}", other, lambda: fn(a, b), bool
            )
        return self._binary(op, other, lambda: _COMPARE[op](self.expr, other.expr), bool)

    def eq(self, other: SymNode) -> SymNode:
        return self._compare(other, "eq")

    def ne(self, other: SymNode) -> SymNode:
        return self._compare(other, "ne")

    def lt(self, other: SymNode) -> SymNode:
        return self._compare(other, "lt")

    def le(self, other: SymNode) -> SymNode:
        return self._compare(other, "le")

    def gt(self, other: SymNode) -> SymNode:
        return self._compare(other, "gt")

    def ge(self, other: SymNode) -> SymNode:
        return self._compare(other, "ge")

    def sym_not(self) -> SymNode:
        return self._new(sympy.Not(self.expr), bool)

    def sym_and(self, other: SymNode) -> SymNode:
        return self._new(sympy.And(self.expr, other.expr), bool)

    def sym_or(self, other: SymNode) -> SymNode:
        return self._new(sympy.Or(self.expr, other.expr), bool)

    and_ = sym_and
    or_ = sym_or

    def sym_ite(self, then: SymNode, other: SymNode) -> SymNode:
        known = self.env.statically_known(self.expr)
        if known is None and self.env.speculate is not None and self.env.unbacked_in(self.expr):
            known = self.env.speculate(self.expr)  # a select on data inside an op
        if known is not None:  # decided by the ranges (an unbacked start assumed >= 0)
            return then if known else other
        return self._new(sympy.Piecewise((then.expr, self.expr), (other.expr, True)), then.pytype)

    # ---- bit operations torch uses on sizes
    def bitwise_and(self, other: SymNode) -> SymNode:
        if self.pytype is bool:
            return self.sym_and(other)
        return self._new(self.env.specialize(self.expr) & self.env.specialize(other.expr), int)

    def bitwise_or(self, other: SymNode) -> SymNode:
        if self.pytype is bool:
            return self.sym_or(other)
        return self._new(self.env.specialize(self.expr) | self.env.specialize(other.expr), int)


class _UnbackedQuestions:
    """What torch's helpers ask a node's ``shape_env`` about unbacked values."""

    def __init__(self, env: ShapeEnv):
        self.env = env

    def evaluate_sym_node(
        self, node: SymNode, size_oblivious: bool = False, fallback_value: Any = None
    ) -> Any:
        known = self.env.statically_known(node.expr)
        if known is None and size_oblivious:
            known = self.env.size_oblivious(node.expr)
        if known is not None:
            return known
        if fallback_value is not None:
            return fallback_value
        raise DataDependentError(node.expr)

    def _maybe_evaluate_static(self, expr: Any, **_: Any) -> Any:
        return self.env._maybe_evaluate_static(expr)


def _is_truth(e: Any) -> bool:
    """A truth value (True/False, a relation, And/Or/Not), not a number (sympy's Symbol is
    also a Boolean)."""
    boolalg = sympy.logic.boolalg
    return isinstance(
        e, (boolalg.BooleanAtom, boolalg.BooleanFunction, sympy.core.relational.Relational)
    )


def _as_bool(e: Any, pytype: type) -> Any:
    return e if pytype is bool else sympy.Ne(e, 0)


def _num_type(a: SymNode, b: SymNode) -> type:
    return float if float in (a.pytype, b.pytype) else int


def _where(file: str, line: int) -> str | None:
    """The location C++ passes, unless it is inside torch or its C++ sources (then the
    user's frame)."""
    if file and "/torch/" not in file and not file.endswith((".cpp", ".h", ".hpp", ".cu")):
        return f"{file}:{line}"
    return None


def expr_of(value: Any) -> Any:
    """The sympy expression of a SymInt/SymFloat/SymBool (or a number as sympy)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        node = value.node
        if isinstance(node, SymNode):
            return node.env.simplify(node.expr)
        raise TypeError(f"kiln: {value!r} is not a symbolic value of kiln's shape engine")
    if isinstance(value, bool):
        return sympy.true if value else sympy.false
    return sympy.sympify(value)


def hint_of(value: Any) -> Any:
    """A size's value in the example (its hint) when symbolic; the value itself otherwise.
    For weighing choices (a partitioner's bytes): a value of the data (unbacked symbols)
    takes its fallback hint (``ShapeEnv.fallback_hint``)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) and isinstance(
        value.node, SymNode
    ):
        node = value.node
        return node.hint if node.has_hint() else node.env.fallback_hint(node.expr)
    return value


def env_of(values: Iterable[Any]) -> ShapeEnv | None:
    """The ShapeEnv of the first symbolic value found in ``values`` (tensors' sizes too)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            found = env_of(list(v.shape) + list(v.stride()))
            if found is not None:
                return found
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            if isinstance(v.node, SymNode):
                return v.node.env
    return None


def is_symbolic(value: Any) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return not value.node.is_constant()
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride()))
    return False
