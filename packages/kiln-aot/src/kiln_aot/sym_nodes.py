"""Symbolic sizes as graph nodes.

An op traced with a symbolic size argument (``view(x, [s0, s1 // 2])``) needs that size as
a node of the graph: each symbol is read from the first graph input that has it as a
dimension (``aten.sym_size.int(arg, dim)``, placed after the placeholders) or from an int
input that is the symbol itself, and an
expression is built from those reads with Python arithmetic (``operator.mul``,
``operator.floordiv``, ...). One node per expression, reused by every op that needs it;
``meta["val"]`` is the SymInt. A compiler binds the symbols from its inputs and computes
the expressions; run eagerly, the graph computes them on real sizes.

The partitioner uses the same emitter: a backward graph reads its sizes from its own
inputs (saved tensors and tangents) instead of saving them.
"""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
from kiln_shapes import FloorDiv, ModIndex, env_of, expr_of
from torch import fx

from kiln_aot.errors import Unsupported

aten = torch.ops.aten


class SymEmitter:
    """Builds (and caches) the nodes of size expressions in ``graph``."""

    def __init__(self, graph: fx.Graph):
        self.graph = graph
        self.cache: dict[Any, Any] = {}
        # the env of unbacked symbols when no input is symbolic (the tracer's)
        self.env: Any = None

    def placeholders(self) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op == "placeholder"]

    def emit(self, expr: Any) -> Any:
        """The node (or int) for ``expr``, a sympy expression over the inputs' size symbols."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        if expr.is_Number:
            return float(expr)
        if expr in (sympy.true, sympy.false):
            return bool(expr)
        if expr in self.cache:
            return self.cache[expr]
        node = self._read(expr) if isinstance(expr, sympy.Symbol) else self._arith(expr)
        if isinstance(node, fx.Node) and "val" not in node.meta:
            env = env_of([p.meta.get("val") for p in self.placeholders()]) or self.env
            if env is not None:
                node.meta["val"] = _symbolic(env, expr)
        self.cache[expr] = node
        return node

    def _read(self, symbol: sympy.Symbol) -> fx.Node:
        phs = self.placeholders()
        for ph in phs:
            val = ph.meta.get("val")
            if isinstance(val, torch.SymInt) and expr_of(val) == symbol:
                return ph  # an int input that is the symbol (capture's symbolic ints)
            if not isinstance(val, torch.Tensor):
                continue
            for d, s in enumerate(val.shape):
                if isinstance(s, torch.SymInt) and expr_of(s) == symbol:
                    with self.graph.inserting_after(phs[-1]):
                        node = self.graph.call_function(aten.sym_size.int, (ph, d))
                    node.meta["val"] = s
                    return node
        raise Unsupported(
            "symbolic size",
            f"{symbol} is not the size of any input of the graph, so it cannot compute it",
            fix="mark the dimension static (kiln.mark_static) or report it",
        )

    def _call(self, fn: Any, *args: Any) -> fx.Node:
        node = self.graph.call_function(fn, args)
        vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in args]
        if all(v is not None for v in vals):
            try:  # its value over the symbols (an intermediate of a folded expression)
                val = fn(*vals)
            except Exception:
                val = None
            if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                node.meta["val"] = val
        return node

    def _fold(self, fn: Any, args: Any) -> Any:
        values = [self.emit(a) for a in args]
        out = values[0]
        for v in values[1:]:
            out = self._call(fn, out, v)
        return out

    def _arith(self, expr: Any) -> Any:
        if isinstance(expr, sympy.Add):
            return self._fold(operator.add, expr.args)
        if isinstance(expr, sympy.Mul):
            return self._fold(operator.mul, expr.args)
        if isinstance(expr, FloorDiv):
            return self._fold(operator.floordiv, expr.args)
        if isinstance(expr, (ModIndex, sympy.Mod)):  # sympy's Mod: Python's % on integers
            return self._fold(operator.mod, expr.args)
        if isinstance(expr, sympy.Max):
            return self._fold(torch.sym_max, expr.args)
        if isinstance(expr, sympy.Min):
            return self._fold(torch.sym_min, expr.args)
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
            return self._call(operator.pow, self.emit(expr.base), int(expr.exp))
        # truth values of unbacked scalars (``t.item() > 0``, ``not allclose(...)``)
        if isinstance(expr, sympy.core.relational.Relational) and expr.rel_op in _RELATIONS:
            return self._fold(_RELATIONS[expr.rel_op], (expr.lhs, expr.rhs))
        if isinstance(expr, sympy.Not):
            return self._call(torch.sym_not, self.emit(expr.args[0]))
        if isinstance(expr, sympy.And):
            return self._fold(operator.and_, expr.args)
        if isinstance(expr, sympy.Or):
            return self._fold(operator.or_, expr.args)
        if isinstance(expr, sympy.Piecewise) and len(expr.args) == 2 and expr.args[1][1] == True:  # noqa: E712
            (a, cond), (b, _) = expr.args
            return self._call(torch.sym_ite, self.emit(cond), self.emit(a), self.emit(b))
        if isinstance(expr, sympy.Pow) and expr.exp == -1:  # 1 / x of a float
            return self._call(operator.truediv, 1.0, self.emit(expr.base))
        if isinstance(expr, sympy.Pow) and expr.free_symbols:  # t.item() ** 2.0
            return self._call(operator.pow, self.emit(expr.base), self.emit(expr.exp))
        if isinstance(expr, sympy.floor) and isinstance(expr.args[0], sympy.Mul):
            num, den = sympy.fraction(expr.args[0])
            if den != 1:
                return self._fold(operator.floordiv, (num, den))
        raise Unsupported(
            "symbolic size",
            f"kiln cannot build the size expression {expr} as graph nodes",
            fix="mark the dimensions it depends on static (kiln.mark_static), or report it",
        )


def _symbolic(env: Any, expr: Any) -> Any:
    """``expr`` as a SymInt, SymFloat (over a real symbol) or SymBool (a relation) of env."""
    from kiln_shapes import SymNode

    if isinstance(expr, (sympy.core.relational.Relational, sympy.logic.boolalg.Boolean)):
        if not isinstance(expr, sympy.Symbol):
            return torch.SymBool(SymNode(env, expr, bool))
    if any(s.is_real and not s.is_integer for s in expr.free_symbols):
        return env.symfloat(expr)
    return env.symint(expr)


_RELATIONS = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def is_sym_node(node: Any) -> bool:
    """A node computing a size from the inputs' sizes, which a graph reads from its own
    inputs. Not a value of the data (an unbacked symbol: ``.item()``, ``nonzero``'s
    length, arithmetic on them): that is computed from tensors like any other value, and a
    partition recomputes it from the tensors it saves (``min_cut.recomputable``)."""
    if not isinstance(node, fx.Node):
        return False
    val = node.meta.get("val")
    if not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False
    return not is_data_value(val)


def is_data_value(val: Any) -> bool:
    """A SymInt/SymFloat/SymBool that depends on an unbacked symbol of kiln-shapes."""
    if not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False
    env = env_of([val])
    return env is not None and bool(env.unbacked_in(expr_of(val)))


__all__ = ["SymEmitter", "is_data_value", "is_sym_node"]
