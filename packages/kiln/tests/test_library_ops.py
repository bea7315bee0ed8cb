"""An op kiln cannot compile costs that op, not the graph: it runs as a library call
inside the compiled graph and the ops around it still become kernels."""

from __future__ import annotations

import pytest
import torch

import kiln


def _mixed(x, y):
    a = torch.fmax(x, y).sin() * 2  # fmax: decomposed, fused with sin and mul
    b = torch.special.digamma(x.abs() + 1).exp()  # digamma: no decomposition, a library call
    c = torch.fft.rfft(x, dim=1).abs().sum(1)  # complex values: library calls only
    return a + b, c


def test_library_ops_keep_the_graph_compiled(tmp_path):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    kiln.reset()
    f = kiln.compile(_mixed, options={"raise_on_error": True, "debug_dir": str(tmp_path)})
    for got, want in zip(f(x, y), _mixed(x, y)):
        torch.testing.assert_close(got, want)
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0
    wrapper = next(tmp_path.rglob("wrapper.py")).read_text()
    assert "# kernel" in wrapper and "fallback prims.digamma" in wrapper, wrapper


def _loss(x, y):
    return (torch.fmax(x, y) * torch.special.digamma(x.abs() + 1)).sum()


def test_library_ops_in_training_give_eagers_gradients():
    x, y = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    x2, y2 = (t.detach().clone().requires_grad_() for t in (x, y))
    kiln.reset()
    f = kiln.compile(_loss, options={"raise_on_error": True})
    f(x, y).backward()
    _loss(x2, y2).backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(y.grad, y2.grad)
    assert kiln.stats()["fallbacks"] == 0


def _entr_and_copysign(x, y):
    return torch.special.entr(x), torch.copysign(x, y)


def test_reference_decompositions_through_prims_are_right():
    """OpInfo sweep findings: entr's where(x == 0, 0, -inf) typed its scalars as bool (-inf
    became 1.0), and copysign read prims.signbit's bool result as floats."""
    x = torch.tensor([-8.5, -1.5, 0.0, 0.5, 2.0])
    y = torch.tensor(3.6)
    kiln.reset()
    f = kiln.compile(_entr_and_copysign, options={"raise_on_error": True})
    for got, want in zip(f(x, y), _entr_and_copysign(x, y)):
        torch.testing.assert_close(got, want)
    assert kiln.stats()["fallbacks"] == 0


def _cholesky(a):
    return torch.linalg.cholesky(a) * 2


def test_a_library_check_that_returns_nothing_is_kept():
    """linalg.cholesky traces to the factorization and ``_linalg_check_errors`` (no
    outputs): kept as a library call, so a matrix that is not positive-definite raises
    eager's error from the compiled graph too."""
    a = torch.randn(4, 4)
    a = a @ a.T + 4 * torch.eye(4)
    kiln.reset()
    f = kiln.compile(_cholesky, options={"raise_on_error": True})
    torch.testing.assert_close(f(a), _cholesky(a))
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0
    with pytest.raises(torch.linalg.LinAlgError):
        f(-torch.eye(4))


def test_complex_numbers_made_in_the_graph_compile_as_library_calls():
    """torch.complex / polar / view_as_real in the middle of a program: one graph, no
    fallback (their views between real and complex are library copies)."""

    def f(x):
        c = torch.polar(x.abs(), x) + torch.complex(x, x * 2)
        return torch.view_as_real(c * 1j).sum(-1) * 2

    kiln.reset()
    compiled = kiln.compile(f)
    x = torch.randn(5, 3)
    torch.testing.assert_close(compiled(x), f(x))
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["fallbacks"] == 0 and stats["breaks"] == 0, stats
