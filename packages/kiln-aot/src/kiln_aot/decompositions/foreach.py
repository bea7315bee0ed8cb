"""``_foreach_*`` ops (optimizers, gradient clipping): one per-tensor op per list element.
The in-place forms reach here after functionalization turned them into functional ones."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kiln_aot.decompositions.registry import register

aten = torch.ops.aten


def _per_element(op, name: str) -> Callable:
    """``op`` (a functional ``_foreach_*`` overload) as one call of ``aten.<name>`` per list
    element: list arguments (``Tensor[]``, ``Scalar[]``) give their i-th item, the rest
    are shared. A positional Scalar the per-tensor op takes by keyword only
    (``_foreach_addcmul(xs, ys, zs, value)`` -> ``addcmul(x, y, z, *, value)``) is passed
    by that keyword; a ``Tensor scalars`` argument (one value per element, as torch.optim's
    Adam passes its step sizes under a compiler) becomes per-element tensor arithmetic."""
    packet = getattr(aten, name)
    positional = _positional_count(packet)
    keyword_only = _keyword_only_names(packet)
    tensor_scalars = [
        i
        for i, a in enumerate(op._schema.arguments)
        if not a.kwarg_only
        and str(a.type) == "Tensor"
        and a.name == "scalars"
        and name in ("addcmul", "addcdiv")
    ]

    def run(*args, **kwargs):
        n = next(len(a) for a in args if isinstance(a, (list, tuple)))
        out = []
        for i in range(n):
            item = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
            if tensor_scalars:
                out.append(_scaled(name, *item[:3], item[tensor_scalars[0]][i]))
                continue
            kw = dict(kwargs)
            for extra, key in zip(item[positional:], keyword_only):
                kw[key] = extra
            out.append(packet(*item[:positional], **kw))
        return out

    return run


def _scaled(name: str, x, a, b, value):
    """``addcmul(x, a, b, value=v)`` / ``addcdiv`` with ``v`` a 0-d tensor, in eager's order
    of operations: ``x + (v * a) * b`` / ``x + v * (a / b)``."""
    if name == "addcmul":
        return aten.add.Tensor(x, aten.mul.Tensor(aten.mul.Tensor(a, value), b))
    return aten.add.Tensor(x, aten.mul.Tensor(aten.div.Tensor(a, b), value))


def _positional_count(packet) -> int:
    """How many arguments every overload of ``packet`` takes positionally (the fewest)."""
    counts = [
        sum(1 for a in getattr(packet, o)._schema.arguments if not a.kwarg_only)
        for o in packet.overloads()
        if not o.startswith("out") and not getattr(packet, o)._schema.is_mutable
    ]
    return min(counts) if counts else 0


def _keyword_only_names(packet) -> list[str]:
    default = getattr(packet, "default", None) or getattr(packet, packet.overloads()[0])
    return [a.name for a in default._schema.arguments if a.kwarg_only]


def _functional_foreach_overloads():
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::_foreach_"):
            continue
        name, _, overload = full[len("aten::") :].partition(".")
        if name.endswith("_") or overload.endswith("out"):
            continue
        op = getattr(getattr(aten, name), overload or "default", None)
        base = name[len("_foreach_") :]
        if op is not None and not op._schema.is_mutable and hasattr(aten, base):
            yield op, base


for _op, _base in _functional_foreach_overloads():
    register(_op)(_per_element(_op, _base))
