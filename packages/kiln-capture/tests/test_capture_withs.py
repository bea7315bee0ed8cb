"""Graph breaks inside with-blocks of context managers kiln does not model: the manager
is entered in Python and its block resumes in a continuation. Exceptions raised inside
the block (by an eager step, or by a compiled graph) reach ``__exit__`` exactly once and
propagate (or are suppressed) as in eager; fullgraph names the inner break."""

import contextlib

import pytest
import torch
from helpers import CountingBackend, assert_same

import kiln_capture
from kiln_capture.bytecode.resume import make_resume_code
from kiln_capture.errors import GraphBreakError


class Recorder:
    def __init__(self, log, suppress=False):
        self.log = log
        self.suppress = suppress

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, typ, value, tb):
        self.log.append(("exit", typ))
        return self.suppress and typ is not None


@kiln_capture.disable
def maybe_fail(x, fail):
    if fail:
        raise ValueError("step failed")
    return x


def step_in_block(x, log, fail, suppress):
    y = x * 2
    with Recorder(log, suppress):
        y = y + 1
        y = maybe_fail(y, fail)
        y = y.sin()
    return y * 3


def embed_in_block(x, idx, w, log):
    y = x * 2
    with Recorder(log):
        print("before the lookup")
        e = torch.nn.functional.embedding(idx, w)  # out of range raises when the graph runs
        y = y + e.sum()
    return y.cos()


def _run_both(fn, *args):
    """(eager result or exception, eager log), then the same from a warm captured fn."""
    results = []
    for f in (fn, kiln_capture.optimize(CountingBackend())(fn)):
        log: list = []
        try:
            results.append((f(*args, log), log))
        except ValueError as e:
            results.append((e, log))
    return results


@pytest.mark.parametrize("suppress", [False, True])
def test_exception_from_a_step_reaches_exit_once(suppress):
    x = torch.randn(4)
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(step_in_block)
    fn(x, [], False, suppress)  # warm: captured, continuations compiled
    for fail in (False, True, False):
        log_e, log_c = [], []
        try:
            expected = step_in_block(x, log_e, fail, suppress)
        except ValueError as e:
            expected = e
        try:
            got = fn(x, log_c, fail, suppress)
        except ValueError as e:
            got = e
        assert log_c == log_e and log_c.count("enter") == 1
        assert [e for e in log_c if e != "enter"] == [("exit", ValueError if fail else None)]
        if isinstance(expected, Exception):
            assert isinstance(got, ValueError) and str(got) == str(expected)
        else:
            assert_same(got, expected)
    assert len(backend.graphs) >= 3  # before the with, inside it, after the step


def test_exception_from_a_graph_inside_the_block_reaches_exit_once():
    x, w = torch.randn(3), torch.randn(5, 3)
    good, bad = torch.tensor([1, 4]), torch.tensor([1, 9])
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(embed_in_block)
    log: list = []
    assert_same(fn(x, good, w, log), embed_in_block(x, good, w, []))
    assert any("embedding" in str(gm.code) for gm in backend.graphs), (
        "the lookup should run inside a captured graph"
    )
    for _ in range(2):
        log_e, log_c = [], []
        with pytest.raises(IndexError):
            embed_in_block(x, bad, w, log_e)
        with pytest.raises(IndexError):
            fn(x, bad, w, log_c)
        assert log_c == log_e == ["enter", ("exit", IndexError)]
    log = []
    assert_same(fn(x, good, w, log), embed_in_block(x, good, w, []))
    assert log == ["enter", ("exit", None)]


def test_fullgraph_names_the_break_inside_the_block():
    def f(x):
        with Recorder([]):
            print("inside")
            return x * 2

    with pytest.raises(GraphBreakError, match="print"):
        kiln_capture.optimize(CountingBackend(), fullgraph=True)(f)(torch.randn(2))


def test_contextmanager_made_in_the_trace_is_fresh_each_call():
    events = []

    @contextlib.contextmanager
    def scope(tag):
        events.append(("enter", tag))
        yield tag
        events.append(("exit", tag))

    def f(x):
        with scope("s") as tag:
            y = x * len(tag)
        return y + 1

    fn = kiln_capture.optimize(CountingBackend())(f)
    x = torch.randn(3)
    for _ in range(3):
        assert_same(fn(x), f(x))
    assert events == [("enter", "s"), ("exit", "s")] * 6


def test_raise_at_entry_code_runs_the_handler():
    def g(log):
        with Recorder(log):
            a = 1
            b = a + 1
        return b

    import dis

    start = next(i.offset for i in dis.get_instructions(g) if i.opname == "BEFORE_WITH")
    after = next(i.offset for i in dis.get_instructions(g) if i.offset > start)
    log: list = []
    mgr = Recorder(log)
    exit_, _ = type(mgr).__exit__.__get__(mgr), mgr.__enter__()
    code = make_resume_code(g.__code__, after, [True, True], ["log"], raise_at_entry=True)
    fn = type(g)(code, g.__globals__)
    with pytest.raises(KeyError):
        fn(log, exit_, mgr, KeyError("k"))  # the first parameter keeps its slot
    assert log == ["enter", ("exit", KeyError)]
