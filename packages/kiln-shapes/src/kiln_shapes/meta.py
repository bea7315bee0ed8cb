"""Running ATen ops on meta tensors with symbolic sizes.

Most of ATen's C++ meta kernels read sizes as plain ints (``view`` calls ``numel()``), so
an op with a symbolic argument runs its Python meta function (``torch._decomp.meta_table``)
when there is one, else its Python decomposition (``torch._decomp.decomposition_table``,
used as data) or its CompositeImplicitAutograd body, re-entering this rule for every op
those call. The C++ kernel runs only for ops whose meta function handles symbolic sizes
(structured kernels, factories, ``as_strided``) or when nothing else exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten

# ops whose C++ meta kernel computes with SymInts
_CPP_SYMBOLIC = frozenset(
    {
        aten.as_strided.default,
        aten.as_strided_.default,
        aten.as_strided_scatter.default,
        aten.detach.default,
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.zeros.default,
        aten.view_as_complex.default,
        aten.view_as_real.default,
    }
)


def has_symbolic(args: Any) -> bool:
    for a in tree_leaves(args):
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(a, torch.Tensor) and a._has_symbolic_sizes_strides:
            return True
    return False


def _tables() -> tuple[dict, dict]:
    import torch._decomp as decomp

    return decomp.meta_table, decomp.decomposition_table


def run(func: Any, args: tuple, kwargs: dict, reenter: Any = None) -> Any:
    """``func(*args, **kwargs)`` on meta tensors, symbolic sizes allowed. ``reenter`` is a
    context manager under which the ops a decomposition calls come back through here."""
    if not isinstance(func, torch._ops.OpOverload) or not has_symbolic((args, kwargs)):
        return func(*args, **kwargs)
    meta_table, decomps = _tables()
    if (
        func not in meta_table
        and func not in _CPP_SYMBOLIC
        and torch.Tag.view_copy not in func.tags
    ):
        ctx = reenter if reenter is not None else contextlib.nullcontext()
        if func in decomps:
            with ctx:
                return decomps[func](*args, **kwargs)
        with ctx:
            out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
    return func(*args, **kwargs)


class SymbolicMetaMode(TorchDispatchMode):
    """Routes every op through ``run`` (a no-op for ops without symbolic arguments)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {}, reenter=self)


@contextlib.contextmanager
def symbolic_meta() -> Iterator[None]:
    """Within this block, torch calls on symbolic meta tensors compute symbolic shapes."""
    if any(isinstance(m, SymbolicMetaMode) for m in _get_current_dispatch_mode_stack()):
        yield
        return
    with SymbolicMetaMode():
        yield
