"""Bytecode tools: trampolines, continuation functions, exception-table round trips,
liveness. These run on whichever CPython (3.11 or 3.12) runs the suite."""

import dis
import types

from kiln_capture.bytecode.resume import live_locals, make_resume_code
from kiln_capture.bytecode.rewrite import (
    encode_exception_table,
    make_trampoline,
    parse_exception_table,
)


def sample(a, b):
    c = a + b
    d = [c, a]
    for i in range(3):
        c = c + i
    try:
        e = c * 2
    except ZeroDivisionError:
        e = 0
    return c, d, e


def test_exception_table_round_trip():
    entries = parse_exception_table(sample.__code__)
    assert entries
    assert encode_exception_table(entries) == sample.__code__.co_exceptiontable


def test_trampoline_keeps_locals_layout():
    t = make_trampoline(sample.__code__)
    assert t.co_varnames == sample.__code__.co_varnames
    assert t.co_stacksize == sample.__code__.co_stacksize
    assert [i.opname for i in dis.get_instructions(t)] == ["RESUME", "RETURN_VALUE"]


def _offset_after_first(code, opname, argval):
    ins = list(dis.get_instructions(code))
    for i, x in enumerate(ins):
        if x.opname == opname and x.argval == argval:
            return ins[i + 1].offset
    raise AssertionError(opname)


def test_resume_from_the_middle_of_a_function():
    code = sample.__code__
    offset = _offset_after_first(code, "STORE_FAST", "d")  # right after `d = [c, a]`
    params = sorted(live_locals(code, offset) & {"a", "b", "c", "d"}, key=code.co_varnames.index)
    rc = make_resume_code(code, offset, [], params)
    fn = types.FunctionType(rc, sample.__globals__)
    values = {"a": 1, "b": 2, "c": 3, "d": [3, 1]}
    assert fn(*[values[p] for p in params]) == sample(1, 2)


def with_stack(x):
    return x + len([x, x])


def test_resume_with_values_on_the_stack():
    code = with_stack.__code__
    ins = list(dis.get_instructions(code))
    call = next(i for i, x in enumerate(ins) if x.opname == "CALL")
    # before CALL of len: stack is [x, NULL, len, list]; resume after it with [x, result]
    rc = make_resume_code(code, ins[call + 1].offset, [True, True], [])
    fn = types.FunctionType(rc, with_stack.__globals__)
    assert fn(5, 2) == 7


def test_live_locals_widen_over_loops():
    def loop(x, y):
        for _ in range(2):
            x = x + 1
            z = y
        return x, z

    code = loop.__code__
    inner = _offset_after_first(code, "STORE_FAST", "x")
    assert {"x", "y"} <= live_locals(code, inner)
