"""IndexPrinter: the traversal every backend's index printer shares (codegen/index_printer.py)."""

import pytest
import sympy

from kiln_inductor.codegen.index_printer import IndexPrinter
from kiln_inductor.ir.symbols import FloorDiv, ModIndex

x0, x1 = sympy.symbols("x0 x1", integer=True, nonnegative=True)
s0 = sympy.Symbol("s0", integer=True, positive=True)


class CLike(IndexPrinter):
    """Spellings only: C's division, clamp functions, long literals."""

    FLOORDIV, MAX, MIN, TARGET = "/", "cmax", "cmin", "as C"
    integer = "{}L".format


def test_python_spellings_by_default():
    p = IndexPrinter()
    assert p(3 * x0 + 7) == "((3 * x0) + 7)"  # symbols first, the constant last
    assert p(FloorDiv(x0, 4) + ModIndex(x1, s0)) == "((x0 // 4) + (x1 % s0))"
    assert p(sympy.Max(x0 - 1, 0)) == "max(0, (x0 + -1))"
    assert p(x0**2) == "(x0 * x0)"


def test_a_language_names_its_spellings():
    p = CLike()
    assert p(FloorDiv(x0, 4) * 2) == "(2L * (x0 / 4L))"
    assert p(sympy.Min(x0, x1, s0 - 1)) == "cmin(cmin(x0, x1), (s0 + -1L))"
    assert p(sympy.Integer(0)) == "0L"


def test_unprintable_expression_names_the_language():
    with pytest.raises(NotImplementedError, match="as C"):
        CLike()(sympy.Rational(1, 2) * x0)
