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
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_leaves

from . import meta_memo

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


# metadata queries that decompositions call as ops: answered from the tensor itself
_QUERY_RULES = {
    "size.default": lambda t: tuple(t.shape),
    "size.int": lambda t, d: t.shape[d],
    "sym_size.default": lambda t: tuple(t.shape),
    "sym_size.int": lambda t, d: t.shape[d],
    "stride.default": lambda t: tuple(t.stride()),
    "stride.int": lambda t, d: t.stride(d),
    "sym_stride.default": lambda t: tuple(t.stride()),
    "sym_stride.int": lambda t, d: t.stride(d),
    "sym_numel.default": lambda t: t.numel(),
    "numel.default": lambda t: t.numel(),
    "dim.default": lambda t: t.dim(),
    "sym_storage_offset.default": lambda t: t.storage_offset(),
}
_QUERIES = {
    getattr(getattr(aten, name.split(".")[0]), name.split(".")[1]): rule
    for name, rule in _QUERY_RULES.items()
    if hasattr(getattr(aten, name.split(".")[0], None), name.split(".")[1])
}


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
    from .unbacked import RULES, is_mask_index, mask_indices, run_rule

    if func in RULES:  # data-dependent: outputs sized by unbacked symbols (unbacked.py)
        return run_rule(func, args, kwargs)
    if is_mask_index(func, args):  # x[mask]: x[mask.nonzero().unbind(1)] (and writes)
        with reenter if reenter is not None else contextlib.nullcontext():
            return func(args[0], mask_indices(args[1]), *args[2:], **kwargs)
    if not isinstance(func, torch._ops.OpOverload) or not has_symbolic((args, kwargs)):
        return func(*args, **kwargs)
    query = _QUERIES.get(func)
    if query is not None:
        return query(*args, **kwargs)
    # the same op on the same symbolic sizes answered before (meta_memo.py)
    result, keep = meta_memo.lookup(func, args, kwargs)
    if result is not None:
        return result
    result = _run_symbolic(func, args, kwargs, reenter)
    if keep is not None:
        keep(result)
    return result


def _run_symbolic(func: Any, args: tuple, kwargs: dict, reenter: Any) -> Any:
    meta_table, decomps = _tables()
    ctx = reenter if reenter is not None else contextlib.nullcontext()
    if (
        func not in meta_table
        and func not in _CPP_SYMBOLIC
        and torch.Tag.view_copy not in func.tags
    ):
        if func in decomps:
            with ctx:
                return decomps[func](*args, **kwargs)
        try:
            with ctx:
                out = func.decompose(*args, **kwargs)
        except RuntimeError:  # no kernel table to look in (``aten::size``): run it
            out = NotImplemented
        if out is not NotImplemented:
            return out
    try:
        return func(*args, **kwargs)
    except RuntimeError:
        if func not in meta_table or func in _CPP_SYMBOLIC:
            raise
    # the dispatcher refused the Python meta kernel of an op some of whose inner calls
    # see symbolic tensors (constant_pad_nd): run it here, its inner ops back through us
    with ctx:
        return meta_table[func](*args, **kwargs)


def _linear(x, weight, bias=None):
    out = torch.matmul(x, weight.t())
    return out if bias is None else out + bias


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The math of ``F.scaled_dot_product_attention``, for its output's metadata."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    scores = torch.matmul(q, k.transpose(-2, -1))  # (the scale changes no metadata)
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    return torch.matmul(scores.softmax(-1), v)


def _python_composites(metadata_only: bool = True) -> dict:
    """torch functions whose C++ composite kernels run before any dispatch mode sees the
    call and, on some torch versions, read symbolic sizes as ints (torch 2.11's
    ``matmul`` specializes every size, its ``linear`` raises on bfloat16 inputs, its
    ``scaled_dot_product_attention`` specializes): computed here from ops that reach
    ``SymbolicMetaMode`` (``matmul``: the Python kernel torch registers; the others: their
    math). ``metadata_only=False`` leaves out the rules that get only the result's metadata
    right (attention), for traces whose ops must compute the same values."""
    table: dict = {}
    matmul = aten.matmul.default
    if torch._C.DispatchKey.CompositeImplicitAutograd in matmul.py_kernels:
        for fn in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__):
            table[fn] = matmul.decompose
    table[torch.nn.functional.linear] = _linear
    if metadata_only:
        table[torch.nn.functional.scaled_dot_product_attention] = _sdpa
    return table


class CompositeMode(TorchFunctionMode):
    """Calls of ``_python_composites()`` functions with symbolic arguments compute their
    result from ops whose kernels see the symbolic sizes. ``metadata_only=False``: only
    rules that compute the same values (for graph traces)."""

    def __init__(self, metadata_only: bool = True) -> None:
        super().__init__()
        self.table = _python_composites(metadata_only)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rule = self.table.get(func)
        if rule is not None and has_symbolic((args, kwargs)):
            with self:  # the ops the rule calls come back here (matmul inside linear)
                return rule(*args, **kwargs)
        return func(*args, **kwargs)


class SymbolicMetaMode(TorchDispatchMode):
    """Routes every op through ``run`` (a no-op for ops without symbolic arguments)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {}, reenter=self)


@contextlib.contextmanager
def symbolic_meta(env: Any = None) -> Iterator[None]:
    """Within this block, torch calls on symbolic meta tensors compute symbolic shapes, and
    data-dependent ops (``nonzero``, ``.item()``) make unbacked symbols of ``env``
    (``kiln_shapes.unbacked``; default: the env of their symbolic arguments)."""
    from .unbacked import unbacked_env

    if any(isinstance(m, SymbolicMetaMode) for m in _get_current_dispatch_mode_stack()):
        with unbacked_env(env):
            yield
        return
    with unbacked_env(env), SymbolicMetaMode(), CompositeMode():
        yield
