"""Graph breaks inside loops (capture.py, ``_finish_break``): a ``for`` loop whose iterator
needs tensor values to give its next item (a ``filter`` or ``map`` with a data-dependent
function) breaks at FOR_ITER; ``next()`` runs in Python and the loop body (or its exit)
is a continuation, so no frame runs eagerly. A break inside a loop's body reuses one
iteration's continuations (for and while loops)."""

import pytest
import torch
from helpers import CountingBackend, assert_same, clone_args

import kiln_capture


def _filtered(inputs):
    out = inputs[0]
    for inp in filter(lambda x: x[0] > 0, inputs):
        out = out * inp
    return out


def _mapped(inputs, y):
    total = y + 1
    for t in map(lambda x: x if x.sum() > 0 else -x, inputs):
        total = total + t
    return total


def _filtered_none_kept(inputs):
    kept = [t * 2 for t in filter(lambda x: bool(x.sum() > 100), inputs)]
    return len(kept), inputs[0] + 1


@pytest.mark.parametrize("fn", [_filtered, _mapped, _filtered_none_kept])
@pytest.mark.parametrize("seed", range(3))
def test_iterator_needing_tensor_values_breaks_at_for_iter(fn, seed):
    torch.manual_seed(seed)
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(fn)
    args = ([torch.randn(3) for _ in range(4)],)
    if fn is _mapped:
        args = (*args, torch.randn(3))
    assert_same(opt(*clone_args(args)), fn(*clone_args(args)))
    stats = kiln_capture.stats()
    assert stats["eager_frames"] == 0 and stats["breaks"] >= 1
    assert len(backend.graphs) >= 1


def test_filter_break_reports_the_predicate():
    report = kiln_capture.explain(_filtered)([torch.randn(3) for _ in range(3)])
    assert report.breaks[0].kind is kiln_capture.breaks.TENSOR_BRANCH
    assert report.breaks[0].resumed


def test_filter_break_under_fullgraph_raises():
    opt = kiln_capture.optimize(CountingBackend(), fullgraph=True)(_filtered)
    with pytest.raises(kiln_capture.GraphBreakError):
        opt([torch.randn(3) for _ in range(3)])


@kiln_capture.disable
def _noted(v):
    return v


def _while_counter(x):
    i = 20
    while i > 10:
        x = torch.sin(x) + i
        i -= 1
        _noted(x)
    return x, i


def test_break_inside_a_while_loop_reuses_one_iteration_graph():
    """The loop's iterations start a continuation (its int counter symbolic at once): one
    graph for the body, whatever the count."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(_while_counter)
    x = torch.randn(4)
    assert_same(opt(x), _while_counter(x))
    assert len(backend.graphs) == 1
    assert_same(opt(x), _while_counter(x))
    assert len(backend.graphs) == 1 and kiln_capture.stats()["eager_frames"] == 0


def _for_range_ignored(x):
    for _ in range(300):
        x = torch.cos(x)
        _noted(x)
    return x


def test_break_inside_a_for_loop_reuses_one_iteration_graph():
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(_for_range_ignored)
    x = torch.randn(4)
    assert_same(opt(x), _for_range_ignored(x))
    assert len(backend.graphs) == 1 and kiln_capture.stats()["eager_frames"] == 0


def _pick(x):
    if x.sum() > 100:
        raise ValueError("too big")
    return bool(x.sum() > 0)


def _filtered_in_try(inputs):
    total = inputs[0] * 0
    try:
        for t in filter(_pick, inputs):
            total = total + t
    except ValueError as e:
        total = total - len(str(e))
    return total


@pytest.mark.parametrize("big", [False, True])
def test_for_iter_break_under_a_try_block_resumes(big):
    """next() under a handler (a try block; on 3.12 every comprehension has one) runs in
    Python too: what it raises is raised again by FOR_ITER in the frame's own code."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(_filtered_in_try)
    torch.manual_seed(0)
    inputs = [torch.randn(3) for _ in range(4)]
    if big:
        inputs[2] = inputs[2] + 1000
    assert_same(opt(list(clone_args(inputs))), _filtered_in_try(list(clone_args(inputs))))
    stats = kiln_capture.stats()
    assert stats["eager_frames"] == 0 and stats["breaks"] >= 1
    assert len(backend.graphs) >= 2
