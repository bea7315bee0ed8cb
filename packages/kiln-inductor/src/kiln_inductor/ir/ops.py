"""Virtual ops: the define-by-run vocabulary of pointwise and reduction bodies.

An IR body is a Python function from loop indices to a value, written against ``ops``::

    def body(index):
        x = ops.load("buf0", index[0] * 1024 + index[1])
        return ops.exp(ops.sub(x, ops.load("buf1", index[0])))

Nothing is computed when the body is defined. Running it under a handler gives it a
meaning: the C++ backend's handler emits C++ statements, the printer's handler writes
readable text, the counting handler measures cost. A handler implements the names of
``OP_NAMES`` (plus ``load``, ``constant``, ``index_expr``, ``to_dtype``, ``where``,
``indirect_indexing``, ``masked``); each value it returns is opaque to the body.

``indirect_indexing(value, size, check)`` turns a loaded value into an index of a
dimension of ``size``: with ``check`` (an ``index_check.IndexCheck``) the backend wraps
negative values where the check says so, checks the bounds, reports a bad index and reads
element 0 instead (never outside the tensor); with ``check=None`` the lowering guarantees
the value is in range (it wraps negatives only).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sympy

# Unary ops: (name, needs a floating argument)
UNARY_OPS = (
    "neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh "
    "tanh asinh acosh atanh erf erfc sigmoid relu reciprocal floor ceil round trunc sign "
    "logical_not bitwise_not isnan isinf signbit frac lgamma square"
).split()
BINARY_OPS = (
    "add sub mul truediv floordiv truncdiv remainder fmod pow maximum minimum atan2 hypot copysign "
    "eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor "
    "bitwise_left_shift bitwise_right_shift"
).split()
OP_NAMES = frozenset(UNARY_OPS + BINARY_OPS)

_state = threading.local()


def _stack() -> list[Any]:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def _symbolic(value: Any) -> bool:
    return isinstance(value, sympy.Basic) and bool(value.free_symbols)


class _OpsProxy:
    """``ops.<name>(...)`` forwards to the innermost installed handler."""

    def __getattr__(self, name: str) -> Any:
        # resolved at call time, so ``ops.exp`` can be passed around as a function
        def call(*args: Any, **kwargs: Any) -> Any:
            stack = _stack()
            if not stack:
                raise RuntimeError(f"ops.{name} called outside of a handler (use ops_handler(...))")
            if name == "constant" and _symbolic(args[0] if args else kwargs.get("value")):
                # a scalar that is a size (``x / t``): computed from the kernel's size args
                return stack[-1].index_expr(*args, **kwargs)
            return getattr(stack[-1], name)(*args, **kwargs)

        call.__name__ = name
        return call


ops: Any = _OpsProxy()


@contextmanager
def ops_handler(handler: object) -> Iterator[object]:
    stack = _stack()
    stack.append(handler)
    try:
        yield handler
    finally:
        stack.pop()


class CountingHandler:
    """Counts ops and loads of a body (the cost model of inlining decisions)."""

    def __init__(self) -> None:
        self.ops = 0
        self.loads: list[tuple[str, object]] = []
        self.expensive = 0

    def load(self, name: str, index: object) -> str:
        self.loads.append((name, index))
        self.ops += 1
        return "v"

    def indirect_indexing(self, value: object, size: object, check: object = None) -> object:
        import sympy

        self.ops += 1
        return sympy.Symbol(f"indirect{len(self.loads)}", integer=True)

    def masked(self, mask: object, body: Any, other: object) -> str:
        self.ops += 1
        return body()

    def __getattr__(self, name: str) -> Any:
        def op(*args: object, **kwargs: object) -> str:
            self.ops += 1
            if name in ("exp", "log", "tanh", "erf", "pow", "sin", "cos", "sigmoid", "atan2"):
                self.expensive += 1
            return "v"

        return op
