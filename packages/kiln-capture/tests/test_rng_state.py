"""torch.manual_seed / get_rng_state / set_rng_state in captured code (issue #17;
variables/rng.py): generator reads and writes run around the graph in program order, random
ops draw the numbers eager code draws, and the caller's generator ends where eager leaves it."""

import pytest
import torch
from helpers import CountingBackend, assert_same
from torch.testing._utils import freeze_rng_state, wrapper_set_seed

import kiln_capture


def _check(f, *args, graphs=1, breaks=0):
    report = kiln_capture.explain(f)(*args)
    assert report.graph_count == graphs, report
    assert report.break_count == breaks, report
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(f)
    for seed in (0, 1):
        torch.manual_seed(seed)
        want, after = f(*args), torch.rand(4)
        torch.manual_seed(seed)
        got, got_after = fn(*args), torch.rand(4)
        assert_same(got, want)
        assert_same(got_after, after)  # the generator state after the frame is eager's
    assert len(backend.graphs) == graphs


def test_opinfo_wrapper_set_seed_around_a_random_op():
    # OpInfo's random ops: freeze_rng_state() (no_dispatch, _DisableFuncTorch, get/set
    # state) and manual_seed(42) around the op
    def f(x):
        return wrapper_set_seed(lambda t: torch.nn.functional.dropout(t, 0.5) + t, x)

    _check(f, torch.randn(8))


def test_seed_then_draws_then_restore():
    def f(x):
        with freeze_rng_state():
            torch.manual_seed(3)
            y = torch.rand_like(x) * x
        return y + torch.randn(3).sum()

    # the draw after the restore follows a write replayed after the graph: a break
    _check(f, torch.randn(3), graphs=2, breaks=1)


def test_seed_after_a_draw_is_replayed_after_the_graph():
    def f(x):
        y = torch.rand_like(x) + x
        torch.manual_seed(7)
        return y * 2

    _check(f, torch.randn(5))


@pytest.mark.parametrize("seed", [torch.randn(()), None])
def test_computed_seed_breaks(seed):
    def f(x, s):
        torch.manual_seed(int(s) if s is not None else 5)
        return torch.rand_like(x)

    report = kiln_capture.explain(f)(torch.randn(2), seed)
    assert report.graph_count == 1
    assert report.break_count == (1 if seed is not None else 0)
