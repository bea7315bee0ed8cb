"""Context managers modeled in the trace (variables/contexts.py)."""

import contextlib

import pytest
import torch
from helpers import CountingBackend, assert_same

import kiln_capture


def _decorated_here(x):
    @torch.no_grad()
    def frozen(t):
        return (t + 1) * 2

    @torch.enable_grad()
    def live(t):
        return t * 3

    y = frozen(x)
    return y, y.requires_grad, live(x).requires_grad, (x * 2).requires_grad


def test_grad_mode_decorator_applied_in_the_trace():
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend, fullgraph=True)(_decorated_here)
    x = torch.randn(3, requires_grad=True)
    assert_same(compiled(x), _decorated_here(x))
    with torch.no_grad():
        assert_same(compiled(x), _decorated_here(x))
    assert kiln_capture.stats()["eager_frames"] == 0


@pytest.mark.parametrize("outer", [True, False])
def test_grad_modes_applied_to_functions_in_the_trace(outer):
    def fn(x):
        def double(t):
            return t * 2

        with torch.set_grad_enabled(outer):
            plain = torch.no_grad(double)  # the class applied to the function
            called = torch.enable_grad()(double)
            flipped = torch.set_grad_enabled(not outer)(double)  # mode put back at once
            assert torch.is_grad_enabled() == outer
            return plain(x), called(x), flipped(x), double(x)

    backend = CountingBackend()
    x = torch.randn(3, requires_grad=True)
    out = kiln_capture.optimize(backend, fullgraph=True)(fn)(x)
    expected = fn(x)
    assert [o.requires_grad for o in out] == [e.requires_grad for e in expected]
    assert_same(out, expected)
    assert len(backend.graphs) == 1


def test_a_contextmanager_made_in_the_trace_is_entered_in_the_graph():
    events = []

    def make(scale):
        @contextlib.contextmanager
        def scaled(t):
            events.append("enter")
            try:
                yield t * scale
            finally:
                events.append("exit")

        return scaled

    def fn(x):
        with make(3)(x) as y:
            return y.sin()

    backend = CountingBackend()
    x = torch.randn(4)
    assert_same(kiln_capture.optimize(backend, fullgraph=True)(fn)(x), (x * 3).sin())
    assert events == ["enter", "exit"] and len(backend.graphs) == 1


@kiln_capture.disable
def _leave_the_graph():
    pass


def test_a_grad_mode_made_before_a_break_and_entered_after_it():
    # set_grad_enabled takes effect when made and restores, on exit, the mode it found
    def fn(x):
        y = x * 2
        ctx = torch.set_grad_enabled(False)
        _leave_the_graph()
        z = y * 3
        with ctx:
            w = y * 4
        return z, w, y * 5, torch.is_grad_enabled()

    x = torch.randn(3, requires_grad=True)
    expected = fn(x)
    assert torch.is_grad_enabled()
    out = kiln_capture.optimize(CountingBackend())(fn)(x)
    assert torch.is_grad_enabled()
    assert [getattr(o, "requires_grad", o) for o in out] == [
        getattr(e, "requires_grad", e) for e in expected
    ]
    assert_same(out, expected)
    assert kiln_capture.stats()["eager_frames"] == 0


@pytest.mark.parametrize("setter", [torch.set_grad_enabled, torch._C._set_grad_enabled])
def test_a_grad_mode_set_by_a_call_holds_across_a_break(setter):
    def fn(x):
        y = x * 2
        setter(False)
        _leave_the_graph()
        z = y * 3  # eager computes it without grad
        setter(True)
        return z, y * 4

    x = torch.randn(3, requires_grad=True)
    expected = fn(x)
    out = kiln_capture.optimize(CountingBackend())(fn)(x)
    assert [o.requires_grad for o in out] == [e.requires_grad for e in expected]
    assert_same(out, expected)
    assert torch.is_grad_enabled() and kiln_capture.stats()["eager_frames"] == 0


def test_a_contextmanager_entered_across_a_break_is_one_object():
    # the break inside __enter__ runs it eagerly on a real manager; the local holding the
    # manager must be that very object, whose generator then stops at __exit__
    events = []

    @contextlib.contextmanager
    def tracked(t):
        try:
            _leave_the_graph()
            events.append("entered")
            yield t + 1
        finally:
            events.append("exited")

    def fn(x):
        ctx = tracked(x)
        y = ctx.__enter__()
        ctx.__exit__(None, None, None)
        return y * 2

    x = torch.randn(3)
    out = kiln_capture.optimize(CountingBackend())(fn)(x)
    assert_same(out, (x + 1) * 2)
    assert events == ["entered", "exited"]
    assert kiln_capture.stats()["eager_frames"] == 0
