"""Graph breaks inside loops: the loop's FOR_ITER breaks too (next() in Python), and each
iteration runs the same continuations of the frame's original code, called by the frame
one after another (no Python frame nested per iteration); a frame owning cells keeps a
chain of continuations per iteration, bounded by loop_resume_limit."""

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
    # the loop's head and the print, in the frame and in its continuations
    assert out.break_count == 4 and all(b.resumed for b in out.breaks)
    assert "the loop's next() runs in Python" in out.breaks[0].detail


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
    # the body up to print() (x @ w, tanh, sum; float() a graph value) is one graph that
    # every iteration runs; the exit's continuation returns x (no graph)
    assert len(backend.graphs) == 1
    assert_same(fast(x, ws), expected)
    assert len(backend.graphs) == 1
    ws2 = ws[:3]  # a shorter list: the same continuations
    assert_same(fast(x, ws2), layers(x, ws2))
    assert len(backend.graphs) == 1
    assert kiln_capture.stats()["eager_frames"] == 0


def test_a_long_loop_with_a_break_does_not_nest_frames():
    ws = [torch.randn(4, 4) * 0.1 for _ in range(3000)]  # past the recursion limit
    x = torch.randn(2, 4)
    backend = CountingBackend()
    fast = kiln_capture.optimize(backend)(layers_quiet)
    assert_same(fast(x, ws), layers_quiet(x, ws))
    assert len(backend.graphs) == 1 and kiln_capture.stats()["eager_frames"] == 0


@kiln_capture.disable
def _noted(v):
    return v


def layers_quiet(x, ws):
    for w in ws:
        x = torch.tanh(x @ w)
        _noted(x)
    return x


def layers_with_cell(x, ws):
    scale = 0.5

    def scaled(t):
        return t * scale  # ``scale`` is a cell of this frame

    for w in ws:
        x = torch.tanh(scaled(x) @ w)
        print(float(x.sum()))
    return x


def test_past_the_resume_limit_the_rest_runs_eagerly(monkeypatch):
    """A frame owning cells resumes each iteration in a continuation of the last."""
    monkeypatch.setattr(config, "loop_resume_limit", 2)
    ws = [torch.randn(4, 4) for _ in range(5)]
    x = torch.randn(2, 4)
    out = kiln_capture.explain(layers_with_cell)(x, ws)
    assert_same(out.result, layers_with_cell(x, ws))
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


class _ReversedDict(dict):
    def __iter__(self):
        return reversed(list(self.keys()))


def _store_into_a_dict_subclass(x, d):
    d["baz"] = 4  # an item store kiln does not model: done in Python, then resumed
    return x * d["foo"] * d["bar"]


def _store_by_a_data_value(lengths, ones):
    k = lengths[3]
    ones[(3, slice(k, None, None))] = 0  # a slice bound only the data gives
    return ones * 2


def _store_that_raises(x, d):
    try:
        d[[1]] = x  # unhashable key: TypeError, caught by the frame
        return x + 1
    except TypeError:
        return x - 1


@pytest.mark.parametrize(
    "fn,make",
    [
        (_store_into_a_dict_subclass, lambda: (torch.randn(4), _ReversedDict(foo=1, bar=2))),
        (_store_by_a_data_value, lambda: (torch.arange(10), torch.randn(10, 20))),
        (_store_that_raises, lambda: (torch.randn(4), _ReversedDict(foo=1))),
    ],
)
def test_an_item_store_kiln_cannot_model_runs_in_python_and_resumes(fn, make):
    args = make()
    eager_args = tuple(a.clone() if isinstance(a, torch.Tensor) else type(a)(a) for a in args)
    backend = CountingBackend()
    fast = kiln_capture.optimize(backend)(fn)
    for _ in range(2):
        got_args = tuple(a.clone() if isinstance(a, torch.Tensor) else type(a)(a) for a in args)
        assert_same(fast(*got_args), fn(*eager_args))
        assert_same(
            list(got_args[1].items()) if isinstance(args[1], dict) else got_args[1],
            list(eager_args[1].items()) if isinstance(args[1], dict) else eager_args[1],
        )
    assert kiln_capture.stats()["eager_frames"] == 0


def _prints(x):
    y = x.sin()
    print("between the graphs")
    return y.cos()


def test_breaks_are_counted_with_their_reasons(capsys):
    """``stats.break_reasons()``: each break's kind, detail and user line, counted, so a
    benchmark can say why without capturing again under explain."""
    kiln_capture.reset()
    fast = kiln_capture.optimize(CountingBackend())(_prints)
    x = torch.randn(3)
    assert_same(fast(x), _prints(x))
    assert kiln_capture.stats()["breaks"] == 1
    ((reason, count),) = kiln_capture.break_reasons().items()
    line = _prints.__code__.co_firstlineno + 2
    assert count == 1 and reason.startswith("B001 print()") and reason.endswith(f".py:{line}")
    kiln_capture.reset()
    assert kiln_capture.break_reasons() == {}
