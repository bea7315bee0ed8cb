"""torch.optim optimizers: ``opt.step()`` and ``opt.zero_grad()`` traced into the graph.

Design note: "optimizer steps"
------------------------------
torch.optim is inlined like any Python (output.py lists it among the inlined torch
modules); what it needs beyond plain Python is here:

- ``p.grad`` of a parameter read from a source is a graph input of its own (read at
  ``<p>.grad``, guarded like any tensor input, or guarded ``is None``); ``p.grad = None``
  (``zero_grad``) is an attribute store replayed after the graph, and later reads in the
  same trace see it.
- ``opt.state`` is a ``defaultdict(dict)`` keyed by parameters: it is modeled as a dict
  keyed by the identity of tensor inputs (``TensorKeyedDictVar``). The entry of a
  parameter is read at ``<state>[<p's source>]`` (``TensorKeySource``), so the state's
  tensors (``exp_avg``, ``momentum_buffer``, the ``step`` tensors) are graph inputs the
  step updates in place, which kiln-aot functionalizes and writes back. A parameter
  without an entry yet (the first step: lazy initialization) is guarded absent; the
  trace builds its entry as a new dict, which the generated code stores after the
  graph. So the first step is a graph of its own, and from the second step on the guard
  on the entry's keys holds: one graph per step, no break.
- ``torch.compiler.is_compiling()`` answers True in captured code (functions.py), so
  torch.optim takes the paths it takes under torch.compile: ``_get_value(step)`` keeps
  the step count a tensor (no ``.item()``, no constant that changes every step) and the
  bias corrections are tensor arithmetic in the graph.
- ``torch.autograd.profiler.record_function`` (the step and zero_grad wrappers) is a
  null context: profiling ranges are not graph ops.
- hyperparameters in ``param_groups`` (see ``group_value``): a float is a guarded
  constant at the first compile; one whose value differed between two compiles of the
  frame (an LR scheduler) becomes a 0-d float64 tensor input read from the group each
  call, so the scheduler costs one recompile, not one per step. torch.compile instead
  recompiles on every new float LR unless the user makes it a tensor; kiln does that
  automatically, like its automatic dynamic ints.
"""

from __future__ import annotations

import collections
import os

import torch

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.sources import AttrSource, TensorKeySource
from kiln_capture.variables.base import Var
from kiln_capture.variables.containers import DictVar


def is_tensor_keyed_dict(value: object) -> bool:
    """An optimizer's ``state``: a defaultdict(dict) whose keys are tensors."""
    return (
        type(value) is collections.defaultdict
        and value.default_factory is dict
        and all(isinstance(k, torch.Tensor) for k in value)
    )


class TensorKeyedDictVar(Var):
    """A ``defaultdict(dict)`` keyed by tensors the trace reads from sources (an
    optimizer's ``state``); see the design note."""

    def __init__(self, value: collections.defaultdict, source) -> None:
        self.value = value
        self.source = source
        self.entries: dict[int, Var] = {}  # id(key var) -> entry

    def __repr__(self) -> str:
        return f"TensorKeyedDict({len(self.value)} entries)"

    def python_type(self) -> type:
        return collections.defaultdict

    def _entry(self, tx, key: Var) -> Var:
        known = self.entries.get(id(key))
        if known is not None:
            return known
        real = tx.out.input_value(key)
        if real is None or key.source is None:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, "optimizer state keyed by a tensor made in the trace"
            )
        src = TensorKeySource(self.source, key.source)
        inner = self.value.get(real)
        if inner is None:
            g = tx.out.guards
            g.add(
                f"{key.source.expr()} not in {self.source.expr()}",
                f"no state yet for {key.source.expr()}",
            )
            entry = DictVar({}, src)
            tx.out.side_effects.mutated(entry)  # the defaultdict makes it on the first read
        else:
            entry = tx.out.wrap(inner, src)
        self.entries[id(key)] = entry
        return entry

    def getitem(self, tx, key: Var) -> Var:
        return self._entry(tx, key)

    def call_method(self, tx, name, args, kwargs) -> Var:
        if name == "__getitem__" and len(args) == 1:
            return self._entry(tx, args[0])
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"optimizer state .{name}")

    def reconstruct(self, cg) -> str:
        return self.source.expr()


def grad_of(tx, t: Var) -> Var:
    """``t.grad`` of a tensor input read from a source (see the design note)."""
    pending = tx.out.side_effects.pending_attr(t, "grad")
    if pending is not None:
        return pending
    real = tx.out.input_value(t)
    if real is None or t.source is None:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "tensor.grad of a tensor made in the trace")
    return tx.out.wrap(real.grad, AttrSource(t.source, "grad"))


def set_grad_of(tx, t: Var, value: Var) -> None:
    """``t.grad = value``: stored after the graph (``zero_grad``'s ``p.grad = None``)."""
    if t.source is None or not (value.is_const() and value.as_const() is None):
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "setting tensor.grad to a tensor")
    tx.out.side_effects.store_attr(t, "grad", value)


def _disable_dynamo_code() -> object:
    wrapped = torch._disable_dynamo(lambda: None)
    return getattr(wrapped, "__code__", None)


_DISABLE_DYNAMO_CODE = _disable_dynamo_code()


# torch.compile, once it has run in the process, wraps each optimizer class's
# ``_init_group`` in its own disable wrapper (a function of this file)
_DYNAMO_EVAL_FRAME = os.path.join("torch", "_dynamo", "eval_frame.py")


def unwrap_optimizer_function(fn) -> object | None:
    """The function under torch's ``_disable_dynamo`` wrapper on a torch.optim method
    (``Optimizer.zero_grad``), or under the disable wrapper torch.compile puts on
    ``_init_group`` once it has run: those markers are for torch.compile's tracer; what
    the method does kiln traces. None for any other function."""
    code = getattr(fn, "__code__", None)
    if code is not _DISABLE_DYNAMO_CODE and not (
        code is not None and code.co_filename.endswith(_DYNAMO_EVAL_FRAME)
    ):
        return None
    if not (getattr(fn, "__module__", "") or "").startswith("torch.optim"):
        return None
    return getattr(fn, "__wrapped__", None)


# Tensor methods whose Scalar argument optimizers pass as a 0-d tensor in captured code
# (a step size computed from the step count, a learning rate lifted to a tensor): the
# Scalar must be a Python number, so the call becomes the same arithmetic on tensors.
_SCALAR_ARGS = {
    "add": ("alpha", 1),
    "add_": ("alpha", 1),
    "sub": ("alpha", 1),
    "sub_": ("alpha", 1),
    "addcdiv": ("value", 2),
    "addcdiv_": ("value", 2),
    "addcmul": ("value", 2),
    "addcmul_": ("value", 2),
}


def tensor_scalar_call(tx, name: str, t: Var, args: list[Var], kwargs: dict[str, Var]):
    """``t.add_(y, alpha=a)`` / ``t.addcdiv_(n, d, value=v)`` / ``t.addcmul_(...)`` whose
    Scalar is a 0-d tensor, as ``t.add_(y * a)`` / ``t.add_(n / d * v)`` /
    ``t.add_(n * v * d)`` (eager's order of operations); None for any other call."""
    from kiln_capture.variables.tensors import TensorVar

    spec = _SCALAR_ARGS.get(name)
    if spec is None:
        return None
    key, pos = spec
    scalar = kwargs.get(key, args[pos] if len(args) > pos else None)
    if not isinstance(scalar, TensorVar) or len(args) < pos:
        return None
    out = tx.out
    if name.startswith(("add", "sub")) and not name.startswith("addc"):
        term = out.tensor_op("call_function", torch.mul, [args[0], scalar], {})
    elif name.startswith("addcdiv"):
        ratio = out.tensor_op("call_function", torch.div, [args[0], args[1]], {})
        term = out.tensor_op("call_function", torch.mul, [ratio, scalar], {})
    else:
        scaled = out.tensor_op("call_function", torch.mul, [args[0], scalar], {})
        term = out.tensor_op("call_function", torch.mul, [scaled, args[1]], {})
    method = name.replace("addcdiv", "add").replace("addcmul", "add")
    return out.tensor_op("call_method", method, [t, term], {})


_FOREACH_POINTWISE = {
    torch._foreach_addcdiv_: "addcdiv_",
    torch._foreach_addcmul_: "addcmul_",
    torch._foreach_addcdiv: "addcdiv",
    torch._foreach_addcmul: "addcmul",
}


def foreach_scalars_tensor_call(tx, fn, args: list[Var], kwargs: dict[str, Var]):
    """``torch._foreach_addcdiv_(xs, ns, ds, scalars)`` with ``scalars`` a 1-d tensor (Adam's
    stacked step sizes in captured code): per element, ``xs[i].addcdiv_(ns[i], ds[i],
    value=scalars[i])`` with the Scalar a 0-d tensor (``tensor_scalar_call``); the graph
    holds per-tensor ops, which kiln-aot would make of the foreach op anyway. None for
    any other call."""
    import operator

    from kiln_capture.variables.containers import ListVar, TupleVar
    from kiln_capture.variables.tensors import TensorVar

    method = _FOREACH_POINTWISE.get(fn)
    if method is None or kwargs or len(args) != 4 or not isinstance(args[3], TensorVar):
        return None
    lists = [a.unpack(tx) for a in args[:3]]
    results = []
    for i, (x, n, d) in enumerate(zip(*lists, strict=True)):
        scalar = tx.out.tensor_op("call_function", operator.getitem, [args[3], _const(i)], {})
        results.append(tensor_scalar_call(tx, method, x, [n, d], {"value": scalar}))
    if method.endswith("_"):
        return _const(None)
    return ListVar(results) if not isinstance(args[0], TupleVar) else TupleVar(results)


def _const(value: object) -> Var:
    from kiln_capture.variables.constants import ConstVar

    return ConstVar(value)


def _as_float64_tensor(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _in_param_group(source) -> bool:
    """``source`` reads ``<...>.param_groups[i][key]``."""
    from kiln_capture.sources import ItemSource

    group = getattr(source, "base", None)
    groups = getattr(group, "base", None)
    return (
        isinstance(source, ItemSource)
        and isinstance(group, ItemSource)
        and isinstance(groups, AttrSource)
        and groups.name == "param_groups"
    )


def _takes_tensor_hyperparameters(out, group_source) -> bool:
    """Whether the optimizer whose group ``group_source`` reads runs the same with its
    hyperparameters as 0-d tensors: SGD on either path, Adam and AdamW on their
    single-tensor path (their foreach path refuses a tensor LR unless capturable);
    other optimizers are not checked, so they keep constants."""
    opt_source = group_source.base.base
    opt = next(
        (getattr(v, "value", None) for v in out._wrapped.values() if v.source == opt_source),
        None,
    )
    if not isinstance(opt, torch.optim.SGD | torch.optim.Adam | torch.optim.AdamW):
        return False
    group = opt.param_groups[group_source.key]
    if isinstance(opt, torch.optim.SGD) or group.get("capturable"):
        return not group.get("fused")
    foreach = group.get("foreach")
    if group.get("fused") or foreach:
        return False
    return foreach is False or all(p.device.type == "cpu" for p in group["params"])


def group_value(out, value: float, source) -> Var | None:
    """A float hyperparameter read from an optimizer's ``param_groups`` (see the design
    note): a 0-d float64 tensor input, read from the group each call, once its value
    differed between two compiles of the frame (``dynamic=None``) or from the first
    compile (``dynamic=True``); None where it stays a guarded constant."""
    if type(value) is not float or out.dynamic is False or not _in_param_group(source):
        return None
    if not _takes_tensor_hyperparameters(out, source.base):
        return None
    e = source.expr()
    known = out.lifted_floats.get(e)
    if known is not None:
        return known
    if out.dynamic is None and (
        out.frame_shapes is None or not out.frame_shapes.int_varied(e, value)
    ):
        return None
    from kiln_capture.sources import CallSource

    out.guards.type_is(source, value)
    lifted = CallSource(out.const_ref(_as_float64_tensor), source, ())
    var = out._placeholder(_as_float64_tensor(value), lifted)
    out.lifted_floats[e] = var
    return var
