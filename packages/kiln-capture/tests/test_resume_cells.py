"""Breaks in frames that own closure cells (their variables captured by an inner function,
a lambda or, on 3.11, a comprehension): the continuation gets the frame's cells as its
first free variables (bytecode/resume.py), the generated code makes them and rebuilds
the closures live at the break around the same cells (capture.py), and a write to a real
cell is replayed after the graph. These frames ran eagerly before (transformers'
``capture_outputs`` wrapper is one: its comprehensions read ``kwargs``)."""

import torch
from helpers import CountingBackend, assert_same

import kiln_capture


@kiln_capture.disable
def _eager_step(t):
    return t + 0.5  # the break: a call kiln runs in Python


def _cell_written_after_the_break(x):
    y = x + 1

    def scaled(z):
        return z * y

    first = scaled(_eager_step(x))
    y = y * 10  # the closure sees the new value
    return first + scaled(x), y


def _comprehension_reads_a_local(x, names):
    scale = 3.0
    table = {n: x * scale for n in names}  # on 3.11 a nested function: `scale` is a cell
    x = _eager_step(x)
    return sum(table[n] for n in names) + x * scale


def _counter_across_the_break(x):
    count = 0

    def bump():
        nonlocal count
        count += 1
        return count

    bump()
    x = _eager_step(x)
    bump()
    return x * count, bump


def _run(fn, *args):
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(fn)
    kiln_capture.reset()
    for _ in range(3):
        got, expected = compiled(*args), fn(*args)
        if isinstance(got, tuple) and callable(got[-1]):  # a closure returned: still shared
            assert got[-1]() == expected[-1]()
            got, expected = got[:-1], expected[:-1]
        assert_same(got, expected)
    stats = kiln_capture.stats()
    assert stats["graphs"] >= 1 and stats["eager_frames"] == 0, stats
    assert stats["recompiles"] == 0, stats  # the closures rebuilt each call are not new code
    assert stats["breaks"] == 1, stats  # once, at the first call
    return stats


def test_a_cell_written_after_the_break_is_seen_by_its_closure():
    _run(_cell_written_after_the_break, torch.randn(3))


def test_a_comprehension_over_a_local_resumes():
    _run(_comprehension_reads_a_local, torch.randn(3), ["a", "b"])


def test_nonlocal_writes_across_the_break():
    _run(_counter_across_the_break, torch.randn(3))


def _make_counter():
    c = 0

    def bump(t):
        nonlocal c
        c += 1
        return t * c

    return bump


def _twice(x, fn):
    return fn(x) + fn(x)


def test_nonlocal_write_to_a_closure_passed_in_is_replayed():
    compiled = kiln_capture.optimize(CountingBackend())(_twice)
    kiln_capture.reset()
    mine, theirs = _make_counter(), _make_counter()
    x = torch.randn(3)
    for _ in range(3):
        assert_same(compiled(x, mine), _twice(x, theirs))
    assert mine.__closure__[0].cell_contents == theirs.__closure__[0].cell_contents == 6
    stats = kiln_capture.stats()
    assert stats["graphs"] >= 1 and stats["eager_frames"] == 0 and stats["breaks"] == 0, stats
