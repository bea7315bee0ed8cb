"""In-place view ops (``t_``, ``transpose_``, ``squeeze_``, ``unsqueeze_``) compile: on
tensors the program made they become views (gradients and symbolic sizes included); on
an input, whose shape the caller sees change, the graph runs eagerly with a warning."""

from __future__ import annotations

import warnings

import pytest
import torch

import kiln


def _step(x, w):
    y = x * 2
    y.transpose_(0, 1).unsqueeze_(0)
    y.squeeze_(0)
    y[1] += 1
    return (y * w).sum()


@pytest.mark.parametrize("dynamic", [False, True])
def test_inplace_views_of_intermediates_with_gradients(dynamic):
    kiln.reset()
    compiled = kiln.compile(_step, dynamic=dynamic)
    for n in (3, 5, 7):
        x = torch.randn(n, 4, requires_grad=True)
        w = torch.randn(4, n, requires_grad=True)
        x2, w2 = (t.detach().clone().requires_grad_() for t in (x, w))
        got, want = compiled(x, w), _step(x2, w2)
        torch.testing.assert_close(got, want)
        got.backward()
        want.backward()
        torch.testing.assert_close(x.grad, x2.grad)
        torch.testing.assert_close(w.grad, w2.grad)
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["breaks"] == 0, stats
    assert stats["graphs"] == (1 if dynamic else 3), stats


def test_inplace_view_of_an_input_runs_eagerly_with_a_warning():
    def f(x):
        x.t_()
        return x * 2

    kiln.reset()
    compiled = kiln.compile(f)
    x = torch.randn(3, 4)
    x2 = x.clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = compiled(x)
    torch.testing.assert_close(got, f(x2))
    assert x.shape == x2.shape == (4, 3)
    assert kiln.stats()["fallbacks"] == 1
    assert any("t_" in str(w.message) for w in caught)
