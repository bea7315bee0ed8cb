"""OpsHandler: the language-independent ops-handler skeleton (codegen/ops_handler.py), run
under a toy language; kiln-cpp's and kiln-triton's tests check the real spellings."""

import pytest
import sympy
import torch

from kiln_inductor.codegen.ops_handler import KernelValue, OpsHandler, bool_identity
from kiln_inductor.index_check import IndexCheck
from kiln_inductor.ir.ops import ops, ops_handler


class Toy(OpsHandler):
    PACKAGE, LANGUAGE = "toy", "Toy"
    UNARY_MATH = ("exp",)
    BINARY_MATH = ("atan2",)

    def __init__(self):
        self.lines: list[str] = []
        super().__init__(self.lines.append)

    def declare(self, name, expr, dtype):
        return f"{name}: {str(dtype)[6:]} = {expr}"

    def select(self, cond, a, b):
        return f"sel({cond}, {a}, {b})"

    def cast(self, x, dtype):
        return f"{str(dtype)[6:]}({x})"

    @classmethod
    def float_literal(cls, value, dtype):
        return repr(value)

    def math_function(self, name, dtype):
        return f"m.{name}"

    def out_of_bounds(self, index, size):
        return f"oob({index}, {size})"

    def emit_index_fail(self, bad, raw, index, code):
        self.emit(f"fail({bad}, {code}, {raw})")

    def check_code(self, check):
        return 1

    @bool_identity
    def abs(self, a):
        return self._value(f"abs({a})", a.dtype)


def f32(name: str) -> KernelValue:
    return KernelValue(name, torch.float32)


def test_equal_expressions_are_one_value():
    h = Toy()
    a, b = f32("a"), f32("b")
    assert h.add(a, b) is h.add(a, b)
    assert h.lines == ["tmp1: float32 = (a + b)"]
    assert h.defs == {"tmp1": "(a + b)"}


def test_ops_are_spelt_by_the_language():
    h = Toy()
    a, b = f32("a"), f32("b")
    with ops_handler(h):
        ops.where(ops.lt(a, b), ops.exp(a), ops.atan2(a, b))
        ops.to_dtype(a, torch.int32)
        ops.to_dtype(a, torch.bool)
        ops.relu(a)
        ops.truncdiv(KernelValue("i", torch.int64), KernelValue("j", torch.int64))
    assert h.lines == [
        "tmp1: bool = (a < b)",
        "tmp2: float32 = m.exp(a)",
        "tmp3: float32 = m.atan2(a, b)",
        "tmp4: float32 = sel(tmp1, tmp2, tmp3)",
        "tmp5: int32 = int32(a)",
        "tmp6: bool = (a != 0)",
        "tmp7: float32 = sel(a < 0, 0.0, a)",
        "tmp8: int64 = (i / j)",
    ]


def test_bool_identity_ops_return_bool_values_unchanged():
    h = Toy()
    m = KernelValue("m", torch.bool)
    assert h.abs(m) is m and h.relu(m) is m and h.lines == []


def test_checked_indirect_index_reports_once_and_reads_zero():
    h = Toy()
    check = IndexCheck("aten.gather", 0, 8, True, IndexError, "index out of bounds")
    i = KernelValue("i", torch.int32)
    first = h.indirect_indexing(i, 8, check)
    assert h.indirect_indexing(i, 8, check) == first
    assert isinstance(first, sympy.Symbol)
    assert h.lines == [
        "tmp1: int64 = int64(i)",
        "tmp2: int64 = sel(tmp1 < 0, tmp1 + 8, tmp1)",
        "tmp3: bool = oob(tmp2, 8)",
        "fail(tmp3, 1, tmp1)",
        "tmp4: int64 = sel(tmp3, 0, tmp2)",
    ]


def test_literals_and_missing_ops():
    assert Toy.literal(True, torch.bool) == "true"
    assert Toy.literal(2, torch.float32) == "2.0"
    assert Toy.literal(2.7, torch.int64) == "2"
    with pytest.raises(AttributeError, match="toy has no Toy for virtual op 'cbrt'"):
        Toy().cbrt(KernelValue("a", torch.float32))
