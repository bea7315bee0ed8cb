"""Tensors: FX nodes with metadata computed on the meta device, never on real data.

A TensorVar holds its FX node, a meta tensor with the output's shape/stride/dtype/
requires_grad, and the real device (a meta tensor cannot carry it).

Ops whose result depends on tensor data are graph values: ``.item()`` (and ``float(t)`` /
``int(t)`` of a tensor of that kind) is a SymIntVar of an unbacked symbol, ``nonzero``,
``masked_select``, ``unique``, ``x[mask]`` give tensors sized by unbacked symbols
(``kiln_shapes.unbacked``), ``allclose``/``equal`` a truth value read with ``.item()``.
Python that needs such a value (``if t.item() > 0``, ``bool(t)``, ``tolist()``) breaks
the graph there (variables/sizes.py).
"""

from __future__ import annotations

import operator

import torch

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.variables.base import MethodCallVar, Var
from kiln_capture.variables.constants import ConstVar

# Data-dependent: the output's shape or a Python value depends on tensor contents.
DATA_DEPENDENT_METHODS = frozenset(
    {
        "tolist",
        "numpy",
        "data_ptr",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "backward",
        "bincount",
        "storage",
        "untyped_storage",
        "__array__",
        "register_hook",
    }
)
DATA_DEPENDENT_FUNCTIONS = frozenset(
    {
        torch.bincount,
        torch.manual_seed,
        torch.seed,
        torch.set_default_dtype,
        torch.set_printoptions,
    }
)
# Methods answered from metadata (no graph node).
META_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "stride",
        "is_contiguous",
        "element_size",
        "is_floating_point",
        "is_complex",
        "storage_offset",
        "is_signed",
    }
)
TENSOR_VIEW_PROPERTIES = frozenset({"T", "mT", "H", "mH", "real", "imag"})


class TensorVar(Var):
    def __init__(
        self,
        node: torch.fx.Node,
        meta: torch.Tensor,
        device: torch.device,
        source=None,
        cls: type = torch.Tensor,
    ) -> None:
        self.node = node
        self.meta = meta
        self.device = device
        self.source = source
        self.cls = cls

    def __repr__(self) -> str:
        return f"Tensor({self.node.name}: {str(self.meta.dtype)[6:]}{list(self.meta.shape)})"

    def python_type(self) -> type:
        return self.cls

    def truth(self, tx) -> bool:
        raise Unsupported(breaks.TENSOR_BRANCH, f"bool() of tensor {self.node.name}")

    def getattr(self, tx, name: str) -> Var:
        m = self.meta
        if name == "shape":
            return tx.out.size_var(self)
        if name == "device":
            return ConstVar(self.device)
        if name == "__class__":
            return tx.out.wrap_value(self.cls)
        if name in (
            "dtype",
            "ndim",
            "requires_grad",
            "layout",
            "is_sparse",
            "is_quantized",
            "is_nested",
            "is_leaf",
        ):
            return ConstVar(getattr(m, name))
        if name in ("is_cuda", "is_cpu", "is_mps", "is_xpu"):
            return ConstVar(self.device.type == name[3:])
        if name == "is_meta":
            return ConstVar(self.device.type == "meta")
        if name in TENSOR_VIEW_PROPERTIES:
            return tx.out.tensor_op("call_function", getattr, [self, ConstVar(name)], {})
        if name == "data":
            return tx.out.tensor_op("call_method", "detach", [self], {})
        if name == "grad" and self.source is not None:
            from kiln_capture.variables.optimizers import grad_of

            return grad_of(tx, self)
        if name in ("grad", "grad_fn", "_base", "_version"):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"tensor.{name}")
        if callable(getattr(torch.Tensor, name, None)):
            return TensorMethodVar(self, name)
        if not hasattr(torch.Tensor, name):
            raise AttributeError(name)
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"tensor attribute {name!r}")

    def setattr(self, tx, name: str, value: Var) -> None:
        if name != "grad":
            super().setattr(tx, name, value)
        from kiln_capture.variables.optimizers import set_grad_of

        set_grad_of(tx, self, value)

    def call_method(self, tx, name, args, kwargs) -> Var:
        return TensorMethodVar(self, name).call(tx, args, kwargs)

    def unpack(self, tx) -> list[Var]:
        if self.meta.dim() == 0:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "iteration over a 0-d tensor")
        return [
            tx.out.tensor_op("call_function", operator.getitem, [self, ConstVar(i)], {})
            for i in range(self.meta.shape[0])
        ]

    def getitem(self, tx, key: Var) -> Var:
        return tx.out.tensor_op("call_function", operator.getitem, [self, key], {})

    def setitem(self, tx, key: Var, value: Var) -> None:
        # x[mask] = values: kiln-aot writes through the mask's nonzero columns (one value
        # per selected element: their count is a value of the data, checked at run time)
        tx.out.tensor_op("call_function", operator.setitem, [self, key, value], {})

    def reconstruct(self, cg) -> str:
        return cg.tensor(self)


_TYPE_NAMES = {
    torch.float32: "FloatTensor", torch.float64: "DoubleTensor", torch.float16: "HalfTensor",
    torch.bfloat16: "BFloat16Tensor", torch.int64: "LongTensor", torch.int32: "IntTensor",
    torch.int16: "ShortTensor", torch.int8: "CharTensor", torch.uint8: "ByteTensor",
    torch.bool: "BoolTensor", torch.complex64: "ComplexFloatTensor",
    torch.complex128: "ComplexDoubleTensor",
}  # fmt: skip


def _type_name(dtype: torch.dtype, device: torch.device) -> str:
    """``Tensor.type()`` as eager answers it: ``torch.FloatTensor``, ``torch.cuda.HalfTensor``."""
    name = _TYPE_NAMES.get(dtype)
    if name is None:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"Tensor.type() of a {dtype} tensor")
    prefix = "torch." if device.type == "cpu" else f"torch.{device.type}."
    return prefix + name


def _type_target(target: object, device: torch.device) -> tuple[torch.dtype, torch.device]:
    """What ``Tensor.type(target)`` converts to: a dtype keeps the device; a type name
    (``"torch.HalfTensor"``, ``torch.cuda.HalfTensor``) names the device too."""
    if isinstance(target, torch.dtype):
        return target, device
    name = target if isinstance(target, str) else f"{target.__module__}.{target.__name__}"
    parts = name.split(".")
    by_name = {v: k for k, v in _TYPE_NAMES.items()}
    if len(parts) not in (2, 3) or parts[0] != "torch" or parts[-1] not in by_name:
        raise Unsupported(breaks.EXCEPTION, f"ValueError: invalid type: {name!r}")
    where = torch.device(parts[1]) if len(parts) == 3 else torch.device("cpu")
    if where.type == device.type:
        where = device  # the same device keeps its index
    return by_name[parts[-1]], where


def _item_is(t: TensorVar, name: str) -> bool:
    """Whether ``float(t)`` / ``int(t)`` is ``t.item()`` (one element of that kind)."""
    dtype = t.meta.dtype
    kind = (
        dtype.is_floating_point
        if name == "__float__"
        else not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    )
    return kind and t.meta.numel() == 1


def _exact_cast(t: TensorVar, name: str) -> bool:
    """Whether ``float(t)`` / ``int(t)`` of one element is exactly a cast then ``item()``: float
    of an integer or bool tensor, int of a bool tensor (int of a float truncates and raises on
    nan and inf: not a cast)."""
    dtype = t.meta.dtype
    if name == "__float__":
        kind = not (dtype.is_floating_point or dtype.is_complex)
    else:
        kind = dtype == torch.bool
    return kind and t.meta.numel() == 1


class TensorMethodVar(Var):
    def __init__(self, tensor: TensorVar, name: str) -> None:
        self.tensor = tensor
        self.name = name

    def __repr__(self) -> str:
        return f"TensorMethod({self.name})"

    def reconstruct(self, cg) -> str:
        return f"{cg.rebuild(self.tensor)}.{self.name}"

    def children(self) -> list[Var]:
        return [self.tensor]

    def call(self, tx, args, kwargs) -> Var:
        name, t = self.name, self.tensor
        if name in ("__float__", "__int__") and not args and not kwargs and _item_is(t, name):
            name = "item"  # float(t) of a float tensor is t.item(): a graph value
        elif name in ("__float__", "__int__") and not args and not kwargs and _exact_cast(t, name):
            # float(t) of an integer or bool tensor is float(t.item()): the value converted to
            # double (int64 to double rounds to nearest, as Python's float(int) does) then read;
            # int(t) of a bool tensor likewise through int64
            dtype = torch.float64 if name == "__float__" else torch.int64
            t = tx.out.tensor_op("call_method", "to", [t, ConstVar(dtype)], {})
            name = "item"
        if name == "numpy" and not args and not kwargs:
            from kiln_capture.variables.arrays import ArrayVar, can_view

            if can_view(t):  # an array viewing the tensor (variables/arrays.py)
                return ArrayVar(t)
        if name in DATA_DEPENDENT_METHODS:
            kind = (
                breaks.TENSOR_TO_PYTHON
                if name in ("item", "tolist", "numpy", "__bool__", "__int__", "__float__")
                else breaks.DATA_DEPENDENT
            )
            raise Unsupported(kind, f"Tensor.{name}()")
        if name in META_METHODS:
            consts = [a.as_const() for a in args]
            kw = {k: v.as_const() for k, v in kwargs.items()}
            if name in ("size", "stride") and set(kw) <= {"dim"} and len(consts) + len(kw) <= 1:
                dim = kw.get("dim", consts[0] if consts else None)
                if dim is not None:  # one size: x.size(1) in the graph
                    return tx.out.size_of(t, name, dim)
                return tx.out.size_var(t, name)
            value = getattr(t.meta, name)(*consts, **kw)
            if isinstance(value, torch.SymInt | torch.SymFloat):  # numel()

                def make(name=name, consts=consts):
                    return tx.out.graph.call_method(name, (t.node, *consts))

                return tx.out.sym_value(value, make)
            return tx.out.wrap_value(value)
        if name == "get_device":
            return ConstVar(t.device.index if t.device.type != "cpu" else -1)
        if name == "type" and not args and not kwargs:
            # the type name of the real tensor (the meta one would say torch.meta.*)
            return ConstVar(_type_name(t.meta.dtype, t.device))
        if name == "type" and len(args) + len(kwargs) >= 1 and set(kwargs) <= {"dtype"}:
            target = args[0] if args else kwargs["dtype"]
            if not target.is_const():
                raise Unsupported(breaks.UNSUPPORTED_VALUE, "Tensor.type of a non-constant")
            dtype, device = _type_target(target.as_const(), t.device)
            if dtype == t.meta.dtype and device == t.device:
                return t  # already of that type: the tensor itself, as eager returns it
            return t.call_method(
                tx, "to", [], {"dtype": ConstVar(dtype), "device": ConstVar(device)}
            )
        if name == "is_inference":  # not in the metadata: the input's own flag, guarded
            if t.node.op != "placeholder" or t.source is None:
                raise Unsupported(
                    breaks.TENSOR_TO_PYTHON,
                    "Tensor.is_inference() of a computed tensor (it depends on the mode "
                    "the graph runs in)",
                )
            example = tx.out.example_inputs[list(tx.out.input_sources).index(t.node)]
            value = example.is_inference()
            e = t.source.expr()
            tx.out.guards.add(f"{e}.is_inference() is {value}", f"{e}.is_inference() is {value}")
            return ConstVar(value)
        if name == "__getitem__":
            return t.getitem(tx, args[0])
        if name == "__setitem__":
            t.setitem(tx, args[0], args[1])
            return ConstVar(None)
        from kiln_capture.variables.optimizers import tensor_scalar_call

        rewritten = tensor_scalar_call(tx, name, t, args, kwargs)
        if rewritten is not None:
            return rewritten
        return tx.out.tensor_op("call_method", name, [t, *args], kwargs)


class SizeVar(Var):
    """torch.Size of ints: constants, or SymIntVars for symbolic sizes (variables/sizes.py)."""

    def __init__(self, items: list[Var]) -> None:
        self.items = items

    def __repr__(self) -> str:
        return f"Size({[i.as_const() for i in self.items]})"

    def python_type(self) -> type:
        return torch.Size

    def is_const(self) -> bool:
        return all(i.is_const() for i in self.items)

    def as_const(self) -> object:
        return torch.Size([i.as_const() for i in self.items])

    def truth(self, tx) -> bool:
        return bool(self.items)

    def unpack(self, tx) -> list[Var]:
        return list(self.items)

    def getitem(self, tx, key: Var) -> Var:
        k = key.as_const()
        if isinstance(k, slice):
            return SizeVar(self.items[k])
        return self.items[k]

    def getattr(self, tx, name):
        if name == "numel" and not self.is_const():
            return MethodCallVar(self, name)
        return ConstVar(self.as_const()).getattr(tx, name)  # specializes symbolic sizes

    def call_method(self, tx, name, args, kwargs) -> Var:
        if name == "numel" and not args and not kwargs:
            from kiln_capture.variables.builtins import binary

            acc: Var = ConstVar(1)
            for item in self.items:
                acc = binary(tx, operator.mul, acc, item)
            return acc
        return super().call_method(tx, name, args, kwargs)

    def children(self) -> list[Var]:
        return list(self.items)

    def reconstruct(self, cg) -> str:
        if self.is_const():
            return cg.const(self.as_const())
        items = "".join(f"{cg.rebuild(i)}, " for i in self.items)
        return f"{cg.const(torch.Size)}(({items}))"
