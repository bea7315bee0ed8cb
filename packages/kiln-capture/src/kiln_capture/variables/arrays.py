"""numpy arrays that view a tensor of the trace: ``a = x.numpy()`` (issue #16).

Design note: "arrays as tensors"
--------------------------------
``x.numpy()`` of a CPU tensor that needs no grad is an array sharing the tensor's memory.
While capturing, such an array is the tensor itself seen through numpy's API
(``ArrayVar``): its attributes (``shape``, ``ndim``, ``size``, ``itemsize``, ``strides``,
``T``, ``real``, ``imag``), a few methods (``copy``, ``transpose``, ``reshape``, ``max``,
``all``) and the arithmetic operators become torch ops on the tensor, each with numpy's
meaning (``a.transpose(0, 1)`` permutes axes, ``a.max()`` is a numpy scalar);
``torch.from_numpy(a)`` is the tensor again. An array that leaves the graph is rebuilt as
``t.numpy()`` of the graph's output (a numpy scalar for a full reduction). Anything else
done with an array (numpy functions, item writes, other methods) breaks the graph there.
"""

from __future__ import annotations

import operator

import torch

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.variables.base import MethodCallVar, Var
from kiln_capture.variables.constants import ConstVar
from kiln_capture.variables.containers import ListVar, TupleVar
from kiln_capture.variables.tensors import TensorVar

ARRAY_OPERATORS = frozenset({operator.add, operator.sub, operator.mul, operator.truediv})
_METHODS = frozenset({"copy", "transpose", "reshape", "max", "all"})


def can_view(t: TensorVar) -> bool:
    """Whether ``t.numpy()`` is an array eager would make (CPU, no grad, not complex)."""
    m = t.meta
    return t.device.type == "cpu" and not m.requires_grad and not m.is_complex()


class ArrayVar(Var):
    """A numpy array viewing ``tensor`` (see the design note); ``scalar``: a numpy scalar
    (the result of a full reduction)."""

    def __init__(self, tensor: TensorVar, scalar: bool = False) -> None:
        self.tensor = tensor
        self.scalar = scalar

    def __repr__(self) -> str:
        return f"Array({self.tensor!r})"

    def python_type(self) -> type:
        import numpy

        return numpy.ndarray

    def children(self) -> list[Var]:
        return [self.tensor]

    def reconstruct(self, cg) -> str:
        return f"{cg.rebuild(self.tensor)}.numpy()" + ("[()]" if self.scalar else "")

    def getattr(self, tx, name: str) -> Var:
        t, m = self.tensor, self.tensor.meta
        if self.scalar and name in ("shape", "ndim", "size"):  # a numpy scalar's
            return {"shape": TupleVar([]), "ndim": ConstVar(0), "size": ConstVar(1)}[name]
        if self.scalar:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"numpy scalar .{name}")
        if name == "shape":
            return TupleVar(tx.out.size_var(t).unpack(tx))
        if name == "ndim":
            return ConstVar(m.dim())
        if name == "size":
            return t.call_method(tx, "numel", [], {})
        if name == "itemsize":
            return ConstVar(m.element_size())
        if name == "strides":
            return TupleVar([ConstVar(s * m.element_size()) for s in m.stride()])
        if name in ("T", "real"):
            return ArrayVar(t.getattr(tx, name) if name == "T" else t)
        if name == "imag":  # of a real array: zeros (numpy makes a read-only one)
            return ArrayVar(tx.out.tensor_op("call_function", torch.zeros_like, [t], {}))
        if name in _METHODS:
            return MethodCallVar(self, name)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"ndarray.{name}")

    def getitem(self, tx, key: Var) -> Var:
        """Basic indexing (ints, None, slices, Ellipsis: a view in numpy and in torch); a
        full integer index of every axis is a numpy scalar."""
        parts = key.as_const() if key.is_const() else None
        parts = parts if isinstance(parts, tuple) else (parts,)
        basic = (int, type(None), slice, type(Ellipsis))
        if (
            self.scalar
            or not key.is_const()
            or not all(isinstance(p, basic) and not isinstance(p, bool) for p in parts)
        ):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"{self!r}[{key!r}] (not basic indexing)")
        ints = sum(isinstance(p, int) for p in parts)
        scalar = ints == self.tensor.meta.dim() and ints == len(parts)
        made = tx.out.tensor_op("call_function", operator.getitem, [self.tensor, key], {})
        return ArrayVar(made, scalar=scalar)

    def call_method(self, tx, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
        t = self.tensor
        if name not in _METHODS or self.scalar:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"ndarray.{name}()")
        if name == "copy" and not args and not kwargs:
            return ArrayVar(t.call_method(tx, "clone", [], {}))
        if name == "transpose" and not kwargs:
            axes = [a.as_const() for a in args]
            if len(axes) == 1 and isinstance(axes[0], tuple | list):
                axes = list(axes[0])
            if not axes:
                axes = list(range(t.meta.dim()))[::-1]  # numpy: reverse the axes
            return ArrayVar(t.call_method(tx, "permute", [ConstVar(tuple(axes))], {}))
        if name == "reshape" and not kwargs and args:
            shape = args[0] if len(args) == 1 else TupleVar(list(args))
            return ArrayVar(t.call_method(tx, "reshape", [shape], {}))
        if name in ("max", "all") and not args and set(kwargs) <= {"axis"}:
            axis = kwargs.get("axis", ConstVar(None)).as_const()
            if axis is None:
                reduced = t.call_method(tx, "amax" if name == "max" else "all", [], {})
                return ArrayVar(reduced, scalar=True)
            op = "amax" if name == "max" else "all"
            return ArrayVar(t.call_method(tx, op, [ConstVar(axis)], {}))
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"ndarray.{name}() with these arguments")


def _tensor_of(v: Var) -> TensorVar | None:
    """The tensor an array argument views (a tensor argument too: numpy reads it through
    ``__array__``), where numpy would make that array; else None."""
    if isinstance(v, ArrayVar) and not v.scalar:
        return v.tensor
    if isinstance(v, TensorVar) and can_view(v):
        return v
    return None


def _torch_dtype(v: Var | None):
    if v is None:
        return None
    import numpy

    kind = v.as_const()
    return torch.from_numpy(numpy.empty(0, dtype=kind)).dtype if kind is not None else None


def numpy_call(tx, fn: object, args: list[Var], kwargs: dict[str, Var]) -> Var | None:
    """A numpy function on arrays of the trace, as the torch op with numpy's meaning
    (float arrays only: numpy's and torch's type promotion agree there); None where it is
    not one of these."""
    import numpy

    if fn is numpy.asarray and len(args) == 1 and not kwargs and isinstance(args[0], ArrayVar):
        return ArrayVar(args[0].tensor)  # a numpy scalar becomes a 0-d array
    tensors = [_tensor_of(a) for a in args]
    first = tensors[0] if tensors else None
    if first is None or not first.meta.is_floating_point():
        return None
    out = tx.out
    if fn in (numpy.mean, numpy.sum) and len(args) <= 2 and set(kwargs) <= {"axis"}:
        axis = (args[1] if len(args) > 1 else kwargs.get("axis", ConstVar(None))).as_const()
        op = "mean" if fn is numpy.mean else "sum"
        if axis is None:
            return ArrayVar(first.call_method(tx, op, [], {}), scalar=True)
        return ArrayVar(first.call_method(tx, op, [ConstVar(axis)], {}))
    if fn is numpy.linalg.norm and len(args) == 1 and set(kwargs) <= {"axis"}:
        axis = kwargs.get("axis", ConstVar(None)).as_const()
        made = out.tensor_op(
            "call_function", torch.linalg.vector_norm, [first], {"dim": ConstVar(axis)}
        )
        return ArrayVar(made, scalar=axis is None)
    if (
        fn is numpy.meshgrid
        and not kwargs
        and all(t is not None and t.meta.dtype == first.meta.dtype for t in tensors)
    ):
        # numpy's default: each input flattened, "xy" indexing, each grid a copy
        flat = [t.call_method(tx, "reshape", [ConstVar(-1)], {}) for t in tensors]
        grids = out.tensor_op(
            "call_function", torch.meshgrid, flat, {"indexing": ConstVar("xy")}
        ).unpack(tx)
        made = [ArrayVar(g.call_method(tx, "clone", [], {})) for g in grids]
        kind = type(numpy.meshgrid(numpy.zeros(1)))  # a tuple since numpy 2, a list before
        return TupleVar(made) if kind is tuple else ListVar(made)
    if fn is numpy.fft.fftshift and len(args) == 1 and not kwargs:
        return ArrayVar(out.tensor_op("call_function", torch.fft.fftshift, [first], {}))
    if fn in (numpy.ones_like, numpy.full_like) and set(kwargs) <= {"dtype"}:
        dtype = _torch_dtype(kwargs.get("dtype")) or first.meta.dtype
        if fn is numpy.ones_like and len(args) == 1:
            made = out.tensor_op(
                "call_function", torch.ones_like, [first], {"dtype": ConstVar(dtype)}
            )
            return ArrayVar(made)
        if fn is numpy.full_like and len(args) == 2 and args[1].is_const():
            made = out.tensor_op(
                "call_function", torch.full_like, [first, args[1]], {"dtype": ConstVar(dtype)}
            )
            return ArrayVar(made)
    return None


def array_binary(tx, fn, a: Var, b: Var) -> Var | None:
    """``a + b`` etc. with an array operand: the op on the tensors, an array again; None
    where numpy's meaning is not the tensors' (a scalar operand, another kind of value)."""
    if fn not in ARRAY_OPERATORS:
        return None
    if not (isinstance(a, ArrayVar) and isinstance(b, ArrayVar)) or a.scalar or b.scalar:
        return None
    if a.tensor.meta.dtype != b.tensor.meta.dtype:
        return None  # numpy's and torch's type promotion differ between arrays
    if not a.tensor.meta.is_floating_point():
        return None  # int / int is float64 in numpy, float32 in torch
    return ArrayVar(tx.out.tensor_op("call_function", fn, [a.tensor, b.tensor], {}))


def store_into_array(tx, array: Var, key: Var, value: Var) -> bool:
    """``a[key] = value`` on a numpy array passed in (not a view of the trace's tensors):
    replayed after the graph as numpy's own ``__setitem__`` (a constant key; the value an
    array passed in, a constant or a graph value). The array is not read again in the
    trace (``array_read_after_write`` breaks there). False where this does not apply."""
    import numpy

    from kiln_capture.variables.constants import is_constant_value

    if type(getattr(array, "value", None)) is not numpy.ndarray or array.source is None:
        return False
    if not key.is_const() or not is_constant_value(key.as_const()):
        return False
    if not (
        value.is_const()
        or isinstance(value, TensorVar)
        or (value.source is not None and isinstance(getattr(value, "value", None), numpy.ndarray))
    ):
        return False
    tx.out.side_effects.store_item(array, numpy.ndarray.__setitem__, key.as_const(), value)
    array.items_written = True
    return True


def array_read_after_write(array: Var) -> None:
    """Break where the trace reads a numpy array passed in after writing into it (its writes
    are replayed after the graph: the real array does not hold them yet)."""
    if getattr(array, "items_written", False):
        raise Unsupported(
            breaks.UNSUPPORTED_VALUE,
            "reading a numpy array passed in after writing into it (the writes run after "
            "the graph; torch.from_numpy(a) writes through a tensor in the graph)",
        )


__all__ = [
    "ArrayVar",
    "array_binary",
    "array_read_after_write",
    "can_view",
    "numpy_call",
    "store_into_array",
]
