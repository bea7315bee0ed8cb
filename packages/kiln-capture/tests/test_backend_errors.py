"""A backend that fails to compile is not a capture bug: its error reaches the caller."""

import pytest
import torch

import kiln_capture


def failing_backend(gm, example_inputs):
    raise ValueError("no kernel for this graph")


def f(x):
    return x.sin() + 1


@pytest.mark.parametrize("fullgraph", [False, True])
def test_backend_error_propagates_with_its_cause(fullgraph):
    g = kiln_capture.optimize(failing_backend, fullgraph=fullgraph)(f)
    with pytest.raises(kiln_capture.BackendError, match="no kernel for this graph") as info:
        g(torch.randn(3))
    assert isinstance(info.value.__cause__, ValueError)


def test_a_backend_error_subclass_passes_through_unwrapped():
    class MyFailure(kiln_capture.BackendError):
        def __init__(self):
            RuntimeError.__init__(self, "mine")

    def backend(gm, example_inputs):
        raise MyFailure()

    with pytest.raises(MyFailure):
        kiln_capture.optimize(backend)(f)(torch.randn(3))


def test_stats_count_graphs_breaks_and_recompiles():
    def with_break(x):
        x = x.sin()
        print("break")
        return x.cos()

    kiln_capture.reset()
    g = kiln_capture.optimize(lambda gm, ex: gm.forward)(with_break)
    g(torch.randn(3))
    g(torch.randn(3))  # cache hit
    g(torch.randn(5))  # new shape: recompiles
    got = kiln_capture.stats()
    assert got["graphs"] == 4 and got["breaks"] == 2 and got["recompiles"] == 2, got
    kiln_capture.reset()
    assert kiln_capture.stats() == {
        "graphs": 0,
        "breaks": 0,
        "recompiles": 0,
        "eager_frames": 0,
        "cache_limit_hits": 0,
        "region_boundaries": 0,
        "reused_calls": 0,
    }
