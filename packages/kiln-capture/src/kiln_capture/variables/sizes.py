"""Symbolic sizes: ints (and floats) computed from the sizes of symbolic inputs.

A ``SymIntVar`` holds a ``torch.SymInt``/``SymFloat`` of the trace's ShapeEnv and the FX
node that computes it: ``x.size(1)`` (a ``call_method`` node) for a size read, an
``operator.*`` (or ``torch.sym_min``/``sym_max``) ``call_function`` node for arithmetic.
Nodes are made when a graph op first uses the value, so sizes only read by Python
(branches, guards) leave no dead nodes; each has ``meta["val"]`` = the SymInt.

Python that needs a concrete value (``range(t)``, ``int(t)``, a list index, an f-string)
gets one through ``as_const``: the value at the example's sizes, guarded to stay it. A
branch (``if t > 8``) guards the relation instead (``truth``). Both guards carry the line
the evaluator is at. Outside the graph (a return value, a live local at a graph break)
a SymIntVar is rebuilt as a Python expression over the inputs' sizes.

A value only the data gives (``t.item()``, ``nonzero``'s length, ``allclose``'s truth:
an *unbacked* symbol of kiln_shapes, also held by a SymIntVar, a SymBool too) flows into
tensor ops and sizes as a graph value; outside the graph it is a graph output. Python
that needs it concretely (a branch, ``int()``, a list index) breaks the graph there: the
shape engine raises ``DataDependentError`` instead of guessing.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import sympy
import torch
from torch import fx

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.variables.base import Var
from kiln_capture.variables.constants import ConstVar

SYM_TYPES = (torch.SymInt, torch.SymFloat)
NUMBER_TYPES = (int, float, bool)

_COMPARISONS = frozenset(
    {operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge}
)
# x += y is x = x + y (one table for sizes and every other value: builtins uses it)
INPLACE_TO_PLAIN = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.imatmul: operator.matmul,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}
_INPLACE = INPLACE_TO_PLAIN
# operators whose result stays symbolic; the others (bitwise ones) specialize
SYMBOLIC_BINARY = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.floordiv,
        operator.mod,
        operator.pow,
    }
)


class SymIntVar(Var):
    def __init__(self, out, value: torch.SymInt | torch.SymFloat, make_node: Callable) -> None:
        self.out = out
        self.value = value
        self._make = make_node
        self._node: fx.Node | None = None

    def __repr__(self) -> str:
        return f"SymInt({self.value})"

    @property
    def node(self) -> fx.Node | int:
        """The node computing the value (an int when no graph input has it: a size handed
        to a continuation that no tensor argument shares is specialized there)."""
        if self._node is None:
            self._node = self._make()
            if isinstance(self._node, fx.Node):
                self._node.meta["val"] = self.value
        return self._node

    def python_type(self) -> type:
        if isinstance(self.value, torch.SymBool):
            return bool
        return int if isinstance(self.value, torch.SymInt) else float

    def is_unbacked(self) -> bool:
        """Whether the value depends on the data (an unbacked symbol): no example has it."""
        from kiln_shapes import expr_of

        return bool(self.value.node.env.unbacked_in(expr_of(self.value)))

    def as_const(self) -> object:
        """The value at the example's sizes, guarded to stay it (specializes)."""
        from kiln_shapes import DataDependentError

        try:
            return self.python_type()(self.value)
        except DataDependentError as e:
            raise Unsupported(breaks.TENSOR_TO_PYTHON, str(e)) from e

    def truth(self, tx) -> bool:
        from kiln_shapes import DataDependentError

        try:
            if isinstance(self.value, torch.SymBool):
                return bool(self.value)
            return bool(self.value != 0)
        except DataDependentError as e:
            raise Unsupported(breaks.TENSOR_BRANCH, str(e)) from e

    def getattr(self, tx, name: str) -> Var:
        if not hasattr(self.python_type(), name):
            raise AttributeError(name)  # hasattr(t, "shape") leaves the size symbolic
        return ConstVar(self.as_const()).getattr(tx, name)  # t.bit_length(): specialized

    def unpack(self, tx) -> list[Var]:
        raise Unsupported(breaks.EXCEPTION, f"TypeError: iteration over an int ({self.value})")

    def reconstruct(self, cg) -> str:
        if self.is_unbacked():  # the graph computed it: one of its outputs
            return cg.tensor(self)
        return cg.sym_expr(self.value)


def is_number_var(v: Var) -> bool:
    return isinstance(v, SymIntVar) or (v.is_const() and type(v.as_const()) in NUMBER_TYPES)


def value_of(v: Var) -> object:
    return v.value if isinstance(v, SymIntVar) else v.as_const()


def node_of(v: Var) -> object:
    return v.node if isinstance(v, SymIntVar) else v.as_const()


def sym_call(tx, fn, args: list[Var]) -> Var:
    """``fn(*args)`` on numbers some of which are symbolic: a SymIntVar whose node calls
    ``fn`` on the arguments' nodes, or a constant when the result is one."""
    from kiln_shapes import DataDependentError

    values = [value_of(a) for a in args]
    try:
        result = fn(*values)
    except DataDependentError as e:
        raise Unsupported(breaks.TENSOR_BRANCH, str(e)) from e
    except Exception as e:
        raise Unsupported(
            breaks.EXCEPTION, f"{getattr(fn, '__name__', fn)} raised {type(e).__name__}: {e}"
        ) from e

    def make() -> fx.Node:
        return tx.out.graph.call_function(fn, tuple(node_of(a) for a in args))

    return tx.out.sym_value(result, make)


def binary(tx, fn, a: Var, b: Var) -> Var:
    """``fn(a, b)`` where one of them is a SymIntVar and no tensor is involved."""
    fn = _INPLACE.get(fn, fn)
    if not (is_number_var(a) and is_number_var(b)):
        if fn in (operator.eq, operator.ne) and (
            (a.is_const() and a.as_const() is None) or (b.is_const() and b.as_const() is None)
        ):
            return ConstVar(fn is operator.ne)
        return None  # the caller specializes the size and tries again
    if fn in _COMPARISONS:
        if any(isinstance(v, SymIntVar) and v.is_unbacked() for v in (a, b)):
            return sym_call(tx, fn, [a, b])  # a truth value of the data: a graph value
        return ConstVar(bool(fn(value_of(a), value_of(b))))
    if fn not in SYMBOLIC_BINARY:
        return None
    return sym_call(tx, fn, [a, b])


def unary(tx, fn, a: SymIntVar) -> Var:
    if fn is operator.not_ and a.is_unbacked() and isinstance(a.value, torch.SymBool):
        return sym_call(tx, torch.sym_not, [a])
    if fn is operator.not_:
        return ConstVar(not a.truth(tx))
    if fn in (operator.neg, operator.pos, abs, operator.abs):
        return sym_call(tx, operator.neg if fn is operator.neg else fn, [a])
    return tx.out.wrap_value(fn(a.as_const()))


def min_max(tx, fn, items: list[Var]) -> Var | None:
    """``min``/``max`` of numbers, some symbolic: ``torch.sym_min``/``sym_max`` nodes."""
    if not all(is_number_var(i) for i in items) or not items:
        return None
    sym = torch.sym_min if fn is min else torch.sym_max
    acc = items[0]
    for item in items[1:]:
        acc = sym_call(tx, sym, [acc, item])
    return acc


def expr_value(value: object) -> object:
    """A SymInt's value as an int when the env proved it constant, else the SymInt."""
    from kiln_shapes import expr_of

    if isinstance(value, SYM_TYPES):
        e = expr_of(value)
        if e.is_Number:
            return int(e) if isinstance(value, torch.SymInt) else float(e)
    return value


def python_source(value: object, bind: Callable[[sympy.Symbol], str]) -> str:
    """Python source for a SymInt/SymFloat, each symbol read through ``bind(symbol)``."""
    from kiln_shapes import expr_of, python_expr

    e = expr_of(value)
    names = {s: sympy.Symbol(bind(s), integer=True) for s in e.free_symbols}
    text = python_expr(e.xreplace(names))
    return f"float({text})" if isinstance(value, torch.SymFloat) else f"int({text})"


__all__ = [
    "SYM_TYPES",
    "SymIntVar",
    "binary",
    "expr_value",
    "is_number_var",
    "min_max",
    "python_source",
    "sym_call",
    "unary",
]
