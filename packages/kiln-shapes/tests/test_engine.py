"""The shape engine: symbols, ranges, guards, replacements, symbolic meta computation."""

from __future__ import annotations

import pytest
import sympy
import torch
from kiln_shapes import ShapeEnv, ShapeGuardError, expr_of, is_symbolic, python_expr
from kiln_shapes.meta import symbolic_meta


def _sym_tensor(env: ShapeEnv, t: torch.Tensor, name: str, dims=None) -> torch.Tensor:
    dims = range(t.dim()) if dims is None else dims
    size, stride = env.symbolic_sizes(t, f"L['{name}']", dims)
    return env.meta_tensor(size, stride, t.dtype)


def test_sizes_0_and_1_stay_specialized_and_equal_sizes_get_their_own_symbols():
    env = ShapeEnv()
    m = _sym_tensor(env, torch.empty(1, 5, 0, 5), "x")
    s = [expr_of(d) for d in m.shape]
    assert s[0] == 1 and s[2] == 0
    # no duck sizing of tensor sizes: a batch equal to the channels stays its own size
    assert isinstance(s[1], sympy.Symbol) and isinstance(s[3], sympy.Symbol) and s[1] != s[3]
    # an int that was a size asks for the symbol of the size it equals
    assert env.create_symbol(5, "L['n']", duck=True) == s[1]
    assert env.symbols[s[1]].sources == ["L['x'].size(1)", "L['n']"]
    ducked = ShapeEnv(duck_sizing=True)
    m = _sym_tensor(ducked, torch.empty(5, 5), "x")
    assert expr_of(m.shape[0]) == expr_of(m.shape[1])


def test_strides_of_dense_tensors_are_symbolic_in_any_dimension_order():
    env = ShapeEnv()
    t = torch.empty(4, 6, 10).permute(2, 0, 1)  # dense, not contiguous
    m = _sym_tensor(env, t, "x")
    a, b, c = (expr_of(d) for d in m.shape)
    assert [expr_of(s) for s in m.stride()] == [1, a * c, a]
    sliced = torch.empty(8, 8)[:, :5]  # not dense: stays specialized
    m2 = _sym_tensor(env, sliced, "y")
    assert not is_symbolic(m2)


def test_meta_ops_compute_symbolic_shapes():
    env = ShapeEnv()
    x = _sym_tensor(env, torch.empty(5, 7), "x")
    b, t = (expr_of(d) for d in x.shape)
    with symbolic_meta():
        assert [expr_of(d) for d in x.view(-1).shape] == [b * t]
        assert [expr_of(d) for d in torch.cat([x, x], 1).shape] == [b, 2 * t]
        half = x[:, : x.shape[1] // 2]
        assert str(expr_of(half.shape[1])) == "FloorDiv(s1, 2)"
        assert [expr_of(d) for d in (x @ x.t()).shape] == [b, b]
        assert [expr_of(d) for d in torch.arange(x.shape[1], device="meta").shape] == [t]
        assert [expr_of(d) for d in x.softmax(-1).sum(0).shape] == [t]
    assert env.guards == []  # none of these needed a concrete size


def test_branching_on_a_size_records_a_guard_with_the_users_line():
    env = ShapeEnv()
    x = _sym_tensor(env, torch.empty(5, 7), "x")
    if x.shape[0] > 3:  # the guard's line
        pass
    (g,) = env.guards
    assert python_expr(g.expr) == "s0 > 3"
    assert g.where.endswith("test_engine.py:" + str(g.where.rsplit(":", 1)[1]))
    assert (
        env.check({sympy.Symbol("s0", integer=True, positive=True): 9, **_sym(env, 1, 2)}) is None
    )
    failed = env.check({_s(env, 0): 3, _s(env, 1): 2})
    assert failed is not None and "s0 > 3" in failed


def test_decided_by_ranges_needs_no_guard():
    env = ShapeEnv()
    x = _sym_tensor(env, torch.empty(5, 7), "x")
    assert x.shape[0] != 1 and x.shape[0] >= 2 and x.shape[0] * 2 != 3
    assert env.guards == []


def test_equality_guard_replaces_the_newer_symbol():
    env = ShapeEnv()
    x = _sym_tensor(env, torch.empty(6, 3), "x")
    y = _sym_tensor(env, torch.empty(2, 9), "y")
    with symbolic_meta():
        z = x.reshape(-1) + y.reshape(-1)  # s0*s1 == s2*s3 must hold
    assert len(env.guards) == 1
    assert z.shape[0] == x.shape[0] * x.shape[1]


def test_int_of_a_symbol_specializes_it():
    env = ShapeEnv()
    x = _sym_tensor(env, torch.empty(5, 7), "x")
    assert int(x.shape[1]) == 7
    assert python_expr(env.guards[0].expr) == "Eq(s1, 7)" or "s1" in python_expr(env.guards[0].expr)
    assert expr_of(x.shape[1]) == 7  # replaced from now on


def test_declared_ranges():
    env = ShapeEnv()
    with pytest.raises(ValueError, match="min <= max"):
        env.create_symbol(5, "L['x'].size(0)", lo=8, hi=4)
    with pytest.raises(ShapeGuardError):
        env.create_symbol(50, "L['x'].size(0)", lo=2, hi=16)
    s = env.create_symbol(1, "L['x'].size(0)", lo=1, hi=16)  # a declared range may include 1
    assert isinstance(s, sympy.Symbol)
    assert env.statically_known(sympy.Le(s, 16)) is True
    assert "outside" in env.check({s: 17})


def _s(env: ShapeEnv, i: int) -> sympy.Symbol:
    return list(env.symbols)[i]


def _sym(env: ShapeEnv, i: int, v: int) -> dict:
    return {_s(env, i): v}


def test_python_expr_prints_python_with_the_precedence_of_the_expression():
    import math

    a, b = sympy.symbols("s0 s1", integer=True, positive=True)
    from kiln_shapes import FloorDiv, ModIndex

    exprs = [
        FloorDiv(a + 1, 2),
        ModIndex(a, a * b),
        FloorDiv(a - 1, FloorDiv(a + 1, 2)) + 1,
        sympy.Mod(a + b, 3) * 2,
        sympy.Abs(a - 2 * b),
        sympy.floor(a / 3) + sympy.Max(a, b) - sympy.Min(a, 4),
    ]
    for va, vb in [(7, 3), (10, 4), (2, 9)]:
        for e in exprs:
            want = e.subs({a: va, b: vb})
            got = eval(python_expr(e), {"math": math, "s0": va, "s1": vb})
            assert got == want, (python_expr(e), got, want)


def test_meta_kernels_the_dispatcher_refuses_and_size_queries_run_symbolically():
    import torch.nn.functional as F

    env = ShapeEnv()
    x = _sym_tensor(env, torch.empty(3, 7, 16), "x")
    b, t, c = (expr_of(d) for d in x.shape)
    with symbolic_meta():
        padded = F.pad(x, (0, 0, 1, 2))  # constant_pad_nd's Python meta kernel
        assert [expr_of(d) for d in padded.shape] == [b, t + 3, c]
        up = F.interpolate(x.transpose(1, 2), scale_factor=2.0)  # calls aten.size
        assert list(up.shape) == [3, 16, 14]  # its float output size specializes


def test_floor_division_by_a_symbolic_size_keeps_fractional_terms_in_the_remainder():
    from kiln_shapes import FloorDiv

    s = sympy.Symbol("s1", integer=True, positive=True)
    a, b, c = (sympy.Symbol(n, integer=True, nonnegative=True) for n in "abc")
    # an unexpanded base: (4a + b) s^2 // 4 s^2 is a + (b s^2 + c) // 4 s^2, never a + b/4
    e = FloorDiv((4 * a + b) * s**2 + c, 4 * s**2)
    assert e.has(FloorDiv)
    assert sympy.expand(e - a).free_symbols >= {b}
    assert all(t.is_integer for t in sympy.Add.make_args(sympy.expand(e)))


def test_composites_that_read_sizes_as_ints_stay_symbolic():
    """matmul, linear and scaled_dot_product_attention run C++ composites before any
    dispatch mode; on torch 2.11 those specialize (or refuse) symbolic sizes."""
    import torch.nn.functional as F

    env = ShapeEnv()
    x = _sym_tensor(env, torch.empty(3, 7, 16), "x", dims=[0, 1])
    b, t = (expr_of(d) for d in x.shape[:2])
    w = torch.empty(8, 16, device="meta")
    with symbolic_meta():
        assert [expr_of(d) for d in (x @ x.transpose(1, 2)).shape] == [b, t, t]
        assert [expr_of(d) for d in F.linear(x, w, w[:, 0]).shape] == [b, t, 8]
        out = F.scaled_dot_product_attention(x, x, x, is_causal=True)
        assert [expr_of(d) for d in out.shape] == [b, t, 16]
    assert env.guards == []
    assert int(x.shape[1]) == 7 and x.shape[1] ** 0.5 == 7**0.5  # a constant SymFloat


def test_a_float_specialized_to_its_value_accepts_its_own_example():
    """float(s) of a SymFloat guards ``expr == value``. Printed with sympy's 15 digits and
    compared exactly, batch norm's ``n / (n - 1)`` over symbolic sizes rejected the very
    sizes it was traced at (the shape guards' own-example check then failed: a capture
    error and an eager run). Floats print every digit and equality holds within 1e-12."""
    import math

    env = ShapeEnv()
    x = _sym_tensor(env, torch.empty(2, 7, 9), "x")
    n = x.shape[0] * x.shape[1] * x.shape[2]
    assert float(n / (n - 1)) == 126 / 125
    assert float(0.5 / n + 0.1) == 0.5 / 126 + 0.1
    hints = {"s0": 2, "s1": 7, "s2": 9}
    for g in env.guards:
        assert eval(python_expr(g.expr), {"math": math, **hints}), python_expr(g.expr)
    other = {"s0": 2, "s1": 7, "s2": 10}
    assert not all(eval(python_expr(g.expr), {"math": math, **other}) for g in env.guards)
