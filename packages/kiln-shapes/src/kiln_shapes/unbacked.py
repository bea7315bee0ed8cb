"""Metadata of ops whose result depends on tensor data: outputs sized by unbacked symbols.

# Data-dependent meta rules

``nonzero``'s output has one row per non-zero element, ``.item()`` (``_local_scalar_dense``)
is a number only the data gives, ``equal``/``allclose`` a truth value. Torch's meta kernels
refuse these ops; ``RULES`` computes their outputs' metadata with fresh unbacked symbols
(``ShapeEnv.create_unbacked``) of the env that ``unbacked_env`` makes current (the trace's),
with the ranges known from the inputs (``nonzero``'s count is at most ``numel``).
``kiln_shapes.meta.run`` consults the table before anything else, so every caller that
computes metadata through it (kiln-capture's meta evaluation, kiln-aot's fakes) gets the
same symbols' kinds. What a symbol's value is at run time is the compiler's to bind, from
the op's real result.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .engine import ShapeEnv, env_of

aten = torch.ops.aten

_active = threading.local()


@contextlib.contextmanager
def unbacked_env(env: ShapeEnv | None) -> Iterator[None]:
    """Make ``env`` the one data-dependent ops make their symbols in (None: unchanged)."""
    prev = getattr(_active, "env", None)
    if env is not None:
        _active.env = env
    try:
        yield
    finally:
        _active.env = prev


def current_env(args: Any = ()) -> ShapeEnv:
    """The env of the trace running now, else the env of a symbolic argument."""
    env = getattr(_active, "env", None)
    if env is None:
        from torch.utils._pytree import tree_leaves

        env = env_of(tree_leaves(args))
    if env is None:
        raise NotImplementedError(
            "kiln: a data-dependent op ran outside a trace that owns a ShapeEnv "
            "(kiln_shapes.unbacked.unbacked_env)"
        )
    return env


def _where(op: str) -> str:
    """``op`` and the user's line (the env's ``locate`` where a capture engine sets it)."""
    from .engine import _user_frame

    env = getattr(_active, "env", None)
    frame = env.locate() if env is not None and env.locate is not None else None
    frame = frame or _user_frame()
    return f"{op} at {frame}" if frame else op


def _bound(n: Any) -> int | None:
    """An upper bound for a count: ``n`` when it is a plain int."""
    return int(n) if isinstance(n, int) else None


def _empty(size: list[Any], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(size, dtype=dtype, device="meta")


def _count(env: ShapeEnv, op: str, numel: Any, lo: int = 0) -> torch.SymInt:
    return env.unbacked_value(_where(op), int, lo=lo, hi=_bound(numel))


def _local_scalar_dense(env: ShapeEnv, t: torch.Tensor) -> Any:
    if t.dtype == torch.bool:
        return env.unbacked_value(_where("Tensor.item()"), bool)
    if t.dtype.is_complex:
        raise NotImplementedError("kiln: .item() of a complex tensor stays a graph break")
    if t.dtype.is_floating_point:
        return env.unbacked_value(_where("Tensor.item()"), float, lo=None)
    return env.unbacked_value(_where("Tensor.item()"), int, lo=None)


def _nonzero(env: ShapeEnv, t: torch.Tensor) -> torch.Tensor:
    n = _count(env, "nonzero", t.numel())
    # eager's layout: one column per dimension, each contiguous
    return torch.empty_strided([n, t.dim()], [1, n], dtype=torch.int64, device="meta")


def _masked_select(env: ShapeEnv, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    numel = 1
    for s in shape:
        numel = numel * s
    return _empty([_count(env, "masked_select", numel)], x.dtype)


def _unique_counts(env: ShapeEnv, op: str, x: torch.Tensor) -> torch.SymInt:
    return _count(env, op, x.numel())


def _unique2(env, x, sorted=True, return_inverse=False, return_counts=False):
    n = _unique_counts(env, "unique", x)
    inverse = list(x.shape) if return_inverse else [0]
    return (
        _empty([n], x.dtype),
        _empty(inverse, torch.int64),
        _empty([n] if return_counts else [0], torch.int64),
    )


def _unique_consecutive(env, x, return_inverse=False, return_counts=False, dim=None):
    if dim is not None:
        return _unique_dim(env, x, dim, True, return_inverse, return_counts)
    n = _unique_counts(env, "unique_consecutive", x)
    inverse = list(x.shape) if return_inverse else [0]
    return (
        _empty([n], x.dtype),
        _empty(inverse, torch.int64),
        _empty([n] if return_counts else [0], torch.int64),
    )


def _unique_dim(env, x, dim, sorted=True, return_inverse=False, return_counts=False):
    dim = dim % max(x.dim(), 1)
    n = _count(env, "unique", x.shape[dim])
    size = list(x.shape)
    size[dim] = n
    return (
        _empty(size, x.dtype),
        _empty([x.shape[dim]], torch.int64),
        _empty([n], torch.int64),
    )


def _truth(op: str) -> Callable:
    def rule(env: ShapeEnv, *args: Any, **kwargs: Any) -> Any:
        return env.unbacked_value(_where(op), bool)

    return rule


def _repeat_interleave(env, repeats, output_size=None):
    if output_size is not None:
        return _empty([output_size], torch.int64)
    n = env.unbacked_value(_where("repeat_interleave"), int, lo=0)
    return _empty([n], torch.int64)


def _histogramdd_bin_edges(env, x, bins, *, range=None, weight=None, density=False):
    return [_empty([b + 1], x.dtype) for b in bins]


def _histogramdd_from_bin_cts(env, x, bins, *, range=None, weight=None, density=False):
    return _empty(list(bins), x.dtype)


def _histogramdd_from_bin_tensors(env, x, bins, *, weight=None, density=False):
    return _empty([b.shape[0] - 1 for b in bins], x.dtype)


def _ctc_loss_tensor(
    env, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False
):
    """``ctc_loss`` with lengths as tensors: ``log_alpha``'s last size is
    ``2 * max(target_lengths) + 1``, a value of the data."""
    batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
    width = env.unbacked_value(_where("ctc_loss"), int, lo=1)
    return (
        _empty([batch], log_probs.dtype),
        _empty([batch, log_probs.shape[0], width], log_probs.dtype),
    )


def _linalg_lstsq(env, a, b, rcond=None, *, driver=None):
    """``linalg.lstsq``'s outputs by driver (its documented shapes). Residuals of gelsd and
    gelss exist only where every matrix has full rank, a fact of the data: not modeled
    (NotImplementedError: the capture breaks there)."""
    driver = driver or ("gelsy" if a.device.type in ("cpu", "meta") else "gels")
    *batch, m, n = a.shape
    vector = b.dim() == a.dim() - 1
    k = 1 if vector else b.shape[-1]
    batch = list(
        torch.broadcast_shapes(tuple(batch), tuple(b.shape[: b.dim() - (1 if vector else 2)]))
    )
    solution = _empty([*batch, n] if vector else [*batch, n, k], a.dtype)
    if driver in ("gelsd", "gelss") and m > n:
        raise NotImplementedError("kiln: lstsq's residuals with gelsd/gelss depend on the rank")
    residuals = [*batch, k] if driver == "gels" and m > n else [0]
    rank = [0] if driver == "gels" else batch
    values = [*batch, min(m, n)] if driver in ("gelsd", "gelss") else [0]
    real = a.dtype.to_real() if a.dtype.is_complex else a.dtype
    return (
        solution,
        _empty(residuals, real),
        _empty(rank, torch.int64),
        _empty(values, real),
    )


RULES: dict[Any, Callable] = {
    aten.linalg_lstsq.default: _linalg_lstsq,
    # ops torch has no meta kernel for, whose shapes the arguments give
    aten._histogramdd_bin_edges.default: _histogramdd_bin_edges,
    aten._histogramdd_from_bin_cts.default: _histogramdd_from_bin_cts,
    aten._histogramdd_from_bin_tensors.default: _histogramdd_from_bin_tensors,
    # data-dependent ops
    aten._ctc_loss.Tensor: _ctc_loss_tensor,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.nonzero.default: _nonzero,
    aten.masked_select.default: _masked_select,
    aten._unique2.default: _unique2,
    aten.unique_consecutive.default: _unique_consecutive,
    aten.unique_dim.default: _unique_dim,
    aten.equal.default: _truth("equal"),
    aten.allclose.default: _truth("allclose"),
    aten.is_nonzero.default: _truth("bool(tensor)"),
    aten.repeat_interleave.Tensor: _repeat_interleave,
}


def mask_indices(indices: Any) -> list[Any] | None:
    """``x[mask]``'s indices with each bool (or uint8) mask replaced by the long indices of
    its true elements, one per mask dimension (eager's own rewrite); None when no index
    is a mask."""
    if not any(isinstance(i, torch.Tensor) and i.dtype in _MASKS for i in indices or ()):
        return None
    out: list[Any] = []
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype in _MASKS:
            out.extend(torch.ops.aten.nonzero.default(i).unbind(1))
        else:
            out.append(i)
    return out


_MASKS = (torch.bool, torch.uint8)
# reads and writes through indices: a mask among them is its nonzero columns
_INDEXING = (
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._unsafe_index_put.default,
)


def _index(env: ShapeEnv, x: torch.Tensor, indices: Any) -> torch.Tensor:
    return aten.index.Tensor(x, mask_indices(indices))


def is_mask_index(func: Any, args: tuple) -> bool:
    if func not in _INDEXING or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in _MASKS for i in args[1] or ())


def run_rule(func: Any, args: tuple, kwargs: dict) -> Any:
    """The outputs of data-dependent ``func`` on meta arguments (``func`` in ``RULES``)."""
    return RULES[func](current_env((args, kwargs)), *args, **kwargs)


__all__ = ["RULES", "current_env", "run_rule", "unbacked_env"]
