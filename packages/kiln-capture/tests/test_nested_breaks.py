"""Nested graph breaks (capture.py, "nested breaks"): a break inside a function the frame
calls resumes the callee and the caller in one continuation, whose prologue calls the
callee's continuation; tracing it inlines the rest of both into one graph."""

from functools import partial

import torch
from helpers import CountingBackend, assert_same

import kiln_capture
from kiln_capture.config import config


def _bar(x, **kwargs):
    return x + x


def _partial_across_break(x, i):
    def inner():
        print("a graph break")
        return op(x)

    op = partial(_bar, dim=10)
    x = inner()
    op = partial(_bar, other=10)
    return inner() + x


def test_break_in_a_closure_resumes_with_its_caller():
    """torch's test_partial_across_graph_break_uninvoked: two graphs, two breaks (the
    callee's cells are the caller's), one compile per continuation."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(_partial_across_break)
    x = torch.randn(3)
    for _ in range(3):
        assert_same(opt(x, 10), _partial_across_break(x, 10))
    stats = kiln_capture.stats()
    assert (len(backend.graphs), stats["breaks"]) == (2, 2)  # three calls: no recompile
    assert stats["eager_frames"] == 0


def _two_prints(v, k):
    w = v * k
    print("first")
    u = w + 1
    print("second")
    return u * w


def _calls_two_prints(x):
    a = x.sin()
    return a + _two_prints(x, 3) * a


def test_callee_breaking_twice_keeps_its_locals_and_the_callers_stack():
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(_calls_two_prints)
    x = torch.randn(4)
    assert_same(opt(x), _calls_two_prints(x))
    assert_same(opt(x), _calls_two_prints(x))
    stats = kiln_capture.stats()
    assert stats["breaks"] == 2 and stats["eager_frames"] == 0
    assert len(backend.graphs) == 3


_MODE = {"tag": "neg"}


def _reads_mode(v):
    print("first")
    w = v * 2 if _MODE["tag"] == "neg" else v * len(_MODE["tag"])  # guarded after a break
    print("second")
    return w + 1


def _tagged(x):
    y = _reads_mode(x)
    return y * 2


def test_continuation_run_eagerly_calls_the_callees_continuation(monkeypatch):
    """Past the cache size limit the caller's continuation runs eagerly: its prologue
    calls the callee's continuation as a plain function, which returns its value (not a
    call handed back to a driver that is not there)."""
    monkeypatch.setattr(config, "cache_size_limit", 2)
    opt = kiln_capture.optimize(CountingBackend())(_tagged)
    x = torch.randn(3)
    for tag in ("neg", "a", "bb", "ccc", "neg"):
        monkeypatch.setitem(_MODE, "tag", tag)
        assert_same(opt(x), _tagged(x))
    assert kiln_capture.stats()["cache_limit_hits"] >= 1


class _Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        print("inside forward")
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 3  # not the true derivative: a trace of forward alone would give 2


def _applies(x):
    return _Doubled.apply(x.sin()) + 1


def _gen(x):
    for k in range(2):
        print("in a generator")
        yield x * k


def _drains(x):
    return sum(list(_gen(x.cos())))


def test_calls_that_are_not_plain_calls_break_at_the_call():
    """A break inside autograd.Function.forward or a generator is not resumed as a nested
    break (its continuation would be a plain call: another backward, or no generator)."""
    for fn in (_applies, _drains):
        x = torch.randn(3, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        opt = kiln_capture.optimize(CountingBackend())(fn)
        out, expected = opt(x), fn(x2)
        assert_same(out, expected)
        out.sum().backward()
        expected.sum().backward()
        assert_same(x.grad, x2.grad)


@kiln_capture.disable
def _opaque():
    pass


def _sin_then_break(x):
    y = torch.sin(x)
    _opaque()
    return y


def _loop_of_calls(x):
    for _ in range(50):
        x = _sin_then_break(x)
    return x


def test_call_inside_a_loop_keeps_the_loops_continuations():
    """Inside a loop a nested break is not taken: the break at the call starts the loop's
    own continuations (one iteration's graphs, whatever the count)."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(_loop_of_calls)
    x = torch.randn(4)
    assert_same(opt(x), _loop_of_calls(x))
    stats = kiln_capture.stats()
    assert stats["breaks"] <= 4 and stats["eager_frames"] == 0  # not one per iteration
    assert len(backend.graphs) <= 3
