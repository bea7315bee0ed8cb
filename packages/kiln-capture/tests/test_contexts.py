"""Context managers modeled in the trace (variables/contexts.py)."""

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
