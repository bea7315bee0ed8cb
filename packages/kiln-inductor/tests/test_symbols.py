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
