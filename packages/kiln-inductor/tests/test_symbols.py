import sympy

from kiln_inductor.ir.symbols import (
    FloorDiv,
    ModIndex,
    coefficients,
    index_vars,
    simplify_index,
    unflatten_index,
)


def test_floor_div_and_mod_pull_out_divisible_terms():
    x, y = index_vars("x", 2)
    assert FloorDiv(x * 1024 + y, 1024) == x + FloorDiv(y, 1024)
    assert ModIndex(x * 1024 + y, 1024) == ModIndex(y, 1024)
    assert FloorDiv(sympy.Integer(7), sympy.Integer(2)) == 3


def test_simplify_index_uses_loop_ranges():
    x, y = index_vars("x", 2)
    ranges = {x: sympy.Integer(4096), y: sympy.Integer(1024)}
    assert simplify_index(FloorDiv(y, 1024), ranges) == 0
    assert simplify_index(ModIndex(y, 1024), ranges) == y
    # a reshape (4096, 1024) -> flat -> (64, 64, 1024) of contiguous data stays affine
    parts = unflatten_index(
        x * 1024 + y, (sympy.Integer(64), sympy.Integer(64), sympy.Integer(1024))
    )
    assert simplify_index(parts[-1], ranges) == y


def test_coefficients_of_affine_and_non_affine_indices():
    x, y = index_vars("x", 2)
    assert coefficients(3 * x + 5 * y + 7, [x, y]) == ([3, 5], 7)
    assert coefficients(FloorDiv(x, 2) + y, [x, y]) is None


def test_common_stride_factors_out_of_div_and_mod():
    import sympy

    from kiln_inductor.ir.symbols import FloorDiv, ModIndex, simplify_index

    x0, x1 = sympy.symbols("x0 x1", integer=True, nonnegative=True)
    ranges = {x0: sympy.Integer(256), x1: sympy.Integer(1024)}
    # a reshape of a (2, 128, 1024) buffer read back flat: contiguous after simplification
    e = 1024 * ModIndex(x0, 128) + 131072 * FloorDiv(1024 * x0 + x1, 131072) + x1
    assert simplify_index(e, ranges) == 1024 * x0 + x1


def test_common_stride_rules_agree_with_integer_arithmetic():
    import itertools
    import random

    import sympy

    from kiln_inductor.ir.symbols import FloorDiv, ModIndex, simplify_index

    x0, x1, x2 = sympy.symbols("x0 x1 x2", integer=True, nonnegative=True)
    rng = random.Random(0)

    def value(e, env):
        e = e.replace(FloorDiv, lambda p, q: sympy.floor(p / q))
        return int(e.replace(ModIndex, lambda p, q: sympy.Mod(p, q)).subs(env))

    for _ in range(60):
        sizes = {x0: rng.randint(1, 8), x1: rng.randint(1, 8), x2: rng.randint(1, 4)}
        k, d = rng.choice([1, 2, 4, 8]), rng.choice([2, 4, 6, 8, 16, 24])
        base = k * rng.choice([1, 3]) * x0 + k * x1 + rng.choice([0, 1, 3]) * x2
        for e in (
            FloorDiv(base, d),
            ModIndex(base, d),
            5 * ModIndex(base, d) + 5 * d * FloorDiv(base, d),
        ):
            s = simplify_index(e, {v: sympy.Integer(n) for v, n in sizes.items()})
            for a, b, c in itertools.product(*(range(sizes[v]) for v in (x0, x1, x2))):
                env = {x0: a, x1: b, x2: c}
                assert value(s, env) == value(e, env), (e, s, env)


def test_clamps_fold_numbers_and_drop_bounds_the_loop_ranges_decide():
    """``clamp_expr`` (cat's per-piece index) folds numbers and never runs sympy's slow
    Min/Max evaluation; ``simplify_index`` drops the bounds the loop ranges make void, and
    every clamp keeps Python's min/max value at every point of the loop."""
    from kiln_inductor.ir.symbols import clamp_expr

    (x,) = index_vars("x", 1)
    assert clamp_expr(sympy.Integer(40), 0, 31) == 31
    assert clamp_expr(sympy.Integer(-3), 0, 31) == 0
    assert str(clamp_expr(x, 0, 31)) == str(sympy.Min(x, 31))  # x >= 0: no Max
    ranges = {x: sympy.Integer(64)}
    cases = [(x - 32, 0, 31), (x, 0, 31), (x, 0, 63), (x - 70, 0, 5), (x + 2, 1, 100)]
    for i, lo, hi in cases:
        e = clamp_expr(i, lo, hi)
        assert isinstance(e, sympy.Basic) and str(e).count("Clamp") == 0
        simple = simplify_index(e, ranges)
        for v in range(64):
            want = min(max(int(i.subs(x, v)), lo), hi)
            assert int(e.subs(x, v)) == want and int(simple.subs(x, v)) == want
    # over x < 64: Min(Max(x - 32, 0), 31) has its Min proved void, Min(x, 63) is x
    assert str(simplify_index(clamp_expr(x - 32, 0, 31), ranges)) == str(sympy.Max(x - 32, 0))
    assert simplify_index(clamp_expr(x, 0, 63), ranges) == x
    # rebuilt by xreplace/subs (a view's reindexing) without sympy's evaluation, same value
    y = index_vars("y", 1)[0]
    moved = clamp_expr(x - 32, 0, 31).xreplace({x: 2 * y + 1})
    for v in range(32):
        assert int(moved.subs(y, v)) == min(max(2 * v + 1 - 32, 0), 31)
