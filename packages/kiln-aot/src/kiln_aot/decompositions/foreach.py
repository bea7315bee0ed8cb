"""``_foreach_*`` ops (optimizers, gradient clipping): one per-tensor op per list element.
The in-place forms reach here after functionalization turned them into functional ones."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kiln_aot.decompositions.registry import register

aten = torch.ops.aten


def _per_element(name: str) -> Callable:
    def run(*args, **kwargs):
        n = next(len(a) for a in args if isinstance(a, (list, tuple)))
        packet = getattr(aten, name)
        return [
            packet(*[a[i] if isinstance(a, (list, tuple)) else a for a in args], **kwargs)
            for i in range(n)
        ]

    return run


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
    register(_op)(_per_element(_base))
