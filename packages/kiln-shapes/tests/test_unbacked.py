"""Unbacked symbols: values known only at run time, with a range and no example value
(engine.py "Unbacked symbols", unbacked.py)."""

from __future__ import annotations

import pytest
import sympy
import torch
from kiln_shapes import DataDependentError, ShapeEnv, expr_of
from kiln_shapes.meta import symbolic_meta


def test_a_size_symbol_has_a_range_and_no_hint():
    env = ShapeEnv()
    n = env.unbacked_value("nonzero", int, lo=0, hi=12)
    s = expr_of(n)
    assert env.is_unbacked(s) and env.bounds(s) == (0, 12)
    assert bool(n >= 0) and not bool(n > 12)  # decided by the range
    with pytest.raises(DataDependentError, match="depends on tensor data"):
        bool(n > 3)  # the range cannot: an error, never a guess
    with pytest.raises(DataDependentError):
        int(n)
    assert env.guards == []  # nothing was guarded on it
    assert env.fallback_hint(s) == 8  # heuristics only


def test_guard_or_false_and_check():
    from torch.fx.experimental.symbolic_shapes import guard_or_false, guard_or_true

    env = ShapeEnv()
    n = env.unbacked_value("nonzero", int, lo=0)
    assert guard_or_false(n == 1) is False and guard_or_true(n == 1) is True
    torch._check(n >= 3)  # a fact the code asserts narrows the range
    assert bool(n > 2) and env.symbols[expr_of(n)].lo == 3


def test_scalars_of_each_kind():
    env = ShapeEnv()
    f = env.unbacked_value("item", float, lo=None)
    b = env.unbacked_value("allclose", bool)
    assert isinstance(f, torch.SymFloat) and isinstance(b, torch.SymBool)
    with pytest.raises(DataDependentError):
        bool(f > 0)
    with pytest.raises(DataDependentError):
        bool(b)
    assert isinstance(expr_of(b), sympy.Eq)


def test_check_skips_unbacked_symbols():
    env = ShapeEnv()
    s0 = env.create_symbol(5, "L['x'].size(0)")
    env.unbacked_value("nonzero", int)
    assert env.check({s0: 6}) is None


@pytest.mark.parametrize(
    "fn, shape",
    [
        (lambda x: torch.nonzero(x), ("u", 2)),
        (lambda x: x[x > 0], ("u",)),
        (lambda x: x[x[:, 0] > 0], ("u", 3)),
        (lambda x: torch.masked_select(x, x > 0), ("u",)),
        (lambda x: torch.unique(x), ("u",)),
        (lambda x: torch.nonzero(x).float().mean(0) * 2, (2,)),
    ],
    ids=["nonzero", "mask", "row_mask", "masked_select", "unique", "nonzero_mean"],
)
def test_data_dependent_ops_on_meta(fn, shape):
    env = ShapeEnv()
    x = torch.empty(4, 3, device="meta")
    with symbolic_meta(env):
        out = fn(x)
    mask_numel = 4 if shape == ("u", 3) else 12
    got = tuple("u" if env.unbacked_in(expr_of(s)) else int(s) for s in out.shape)
    assert got == shape
    for s in out.shape:
        if env.unbacked_in(expr_of(s)):
            assert env.bounds(expr_of(s)) == (0, mask_numel)  # at most the mask's numel


def test_item_of_meta_tensor_is_a_symbolic_scalar():
    env = ShapeEnv()
    x = torch.empty(4, 3, device="meta")
    with symbolic_meta(env):
        v = x.sum().item()
        y = x * v
        n = (x > 0).sum().item()
        t = (x > 0).all().item()
    assert isinstance(v, torch.SymFloat) and y.shape == (4, 3)
    assert isinstance(n, torch.SymInt) and isinstance(t, torch.SymBool)
    assert [i.unbacked for i in env.symbols.values()] == [True, True, True]
