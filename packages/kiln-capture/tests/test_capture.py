"""Graph breaks inside loops: the continuation re-enters the loop with the loop's
iterator and live locals; a chain of continuations is bounded by loop_resume_limit."""

import pytest
import torch
from helpers import CountingBackend, assert_same

import kiln_capture
from kiln_capture.config import config


def shared_iterator(xs):
    it = iter(xs)
    first = []
    for t in it:
        y = t * 2
        print("break")  # the local `it` and the loop's iterator stay one object
        first.append(y)
        if len(first) == 2:
            break
    rest = [t + 1 for t in it]
    return first, rest


def test_iterator_shared_by_a_local_and_the_loop():
    xs = [torch.randn(3) for _ in range(4)]
    expected = shared_iterator(xs)
    out = kiln_capture.explain(shared_iterator)(xs)
    assert_same(out.result, expected)
    assert out.break_count == 2 and all(b.resumed for b in out.breaks)


def layers(x, ws):
    for w in ws:
        x = torch.tanh(x @ w)
        print(float(x.sum()))
    return x


def test_each_iteration_resumes_and_cache_hits_next_call():
    ws = [torch.randn(4, 4) for _ in range(5)]
    x = torch.randn(2, 4)
    expected = layers(x, ws)
    backend = CountingBackend()
    fast = kiln_capture.optimize(backend)(layers)
    assert_same(fast(x, ws), expected)
    n = len(backend.graphs)
    assert n == 5  # per iteration: x @ w, tanh, sum; then float() and print() break
    assert_same(fast(x, ws), expected)
    assert len(backend.graphs) == n
    ws2 = ws[:3]  # a shorter list: the continuation that ends the loop recompiles
    assert_same(fast(x, ws2), layers(x, ws2))


def test_past_the_resume_limit_the_rest_runs_eagerly(monkeypatch):
    monkeypatch.setattr(config, "loop_resume_limit", 2)
    ws = [torch.randn(4, 4) for _ in range(5)]
    x = torch.randn(2, 4)
    out = kiln_capture.explain(layers)(x, ws)
    assert_same(out.result, layers(x, ws))
    assert [b.resumed for b in out.breaks] == [True, True, False]
    assert "runs eagerly" in out.breaks[2].detail


class Boom(Exception):
    pass


@kiln_capture.disable
def _raise_if(flag):
    if flag:
        raise Boom("raised by an eager step")
    return 1


def step_in_try(x, fail, log):
    y = x * 2
    try:
        k = _raise_if(fail)  # a graph break; its exception must reach this frame's except
        y = y + k
    except Boom:
        log.append("except")
        y = y * 10
    finally:
        log.append("finally")
    return y + 1


def test_break_inside_try_resumes_and_handlers_see_the_steps_exception():
    x = torch.randn(4)
    for fail in (False, True):
        kiln_capture.reset()
        log_eager, log_captured = [], []
        expected = step_in_try(x, fail, log_eager)
        out = kiln_capture.explain(step_in_try)(x, fail, log_captured)
        assert_same(out.result, expected)
        assert log_captured == log_eager
        assert out.break_count == 1 and out.breaks[0].resumed, out.breaks
        assert out.graph_count == 2  # the except path is captured too (re-raising continuation)


def step_in_no_grad_try_finally(x, log):
    with torch.no_grad():
        try:
            y = x * 2
            _raise_if(True)
        finally:
            log.append(y.requires_grad)


def test_exception_from_a_step_unwinds_with_and_finally_blocks():
    x = torch.randn(3, requires_grad=True)
    log = []
    fast = kiln_capture.optimize(CountingBackend())(step_in_no_grad_try_finally)
    for _ in range(2):
        with pytest.raises(Boom):
            fast(x, log)
        assert torch.is_grad_enabled(), "no_grad leaked out of the failing frame"
    assert log == [False, False]


def tensor_branch_in_try(x):
    y = x * 2
    try:
        if y.sum() > 0:
            y = y - 1
        n = float(y.abs().sum())
        out = y / n
    except ZeroDivisionError:
        out = y
    return out


def test_tensor_branch_inside_try():
    x = torch.randn(5)
    expected = tensor_branch_in_try(x)
    out = kiln_capture.explain(tensor_branch_in_try)(x)
    assert_same(out.result, expected)
    # the branch breaks; float(...) of the sum is a graph value (issue #17), no break
    assert (out.graph_count, out.break_count) == (2, 1)
    assert all(b.resumed for b in out.breaks)
