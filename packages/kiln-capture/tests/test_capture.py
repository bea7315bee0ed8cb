"""Graph breaks inside loops: the continuation re-enters the loop with the loop's
iterator and live locals; a chain of continuations is bounded by loop_resume_limit."""

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
