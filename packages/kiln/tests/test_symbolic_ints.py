"""Ints read from a frame's arguments become symbols (kiln-capture's dynamic.py, "symbolic
ints"): an int argument, or an int attribute of an object passed in (a KV cache layer's
length, as Mistral's sliding-window layer keeps it), is specialized on the first compile
and symbolic once it changes (from the first compile with ``dynamic=True``). The graph
takes it as an int input; the backend binds its size symbol from it; a training graph's
backward receives it as a saved int. Ints held by modules stay constants."""

from __future__ import annotations

import torch

import kiln


class Counter:
    """A plain object holding a growing int, like a cache layer's ``cumulative_length``."""

    def __init__(self) -> None:
        self.length = 3


def _step(x, cache):
    cache.length += x.shape[-1]
    pos = torch.arange(cache.length, dtype=torch.float32)
    return (x.sum(-1, keepdim=True) * pos).softmax(-1), cache.length


def _assert_compiled(stats, graphs):
    assert stats["graphs"] == graphs, stats
    assert stats["fallbacks"] == 0 and stats["breaks"] == 0 and stats["eager_frames"] == 0, stats


def test_an_int_attribute_that_grows_is_compiled_once_more_then_reused():
    kiln.reset()
    compiled = kiln.compile(_step)
    mine, theirs = Counter(), Counter()
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        x = torch.randn(2, 1, generator=g)
        got, n = compiled(x, mine)
        want, m = _step(x, theirs)
        torch.testing.assert_close(got, want)
        assert n == m and mine.length == theirs.length
    _assert_compiled(kiln.stats(), graphs=2)  # the first length, then one symbolic graph
    assert kiln.stats()["recompiles"] == 1


def test_with_dynamic_true_an_int_argument_is_symbolic_from_the_first_compile():
    def f(x, n):
        return torch.ones(n, x.shape[0]) * x + n

    kiln.reset()
    compiled = kiln.compile(f, dynamic=True)
    for n in (3, 7, 12, 5):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x, n), f(x, n))
    _assert_compiled(kiln.stats(), graphs=1)


def test_an_int_used_by_python_specializes_and_stays_right():
    """``range(n)`` needs the value: the symbol is specialized by a guard for that graph,
    and another value compiles another graph rather than reusing a wrong one."""

    def f(x, n):
        for _ in range(n):
            x = x * 2
        return x

    kiln.reset()
    compiled = kiln.compile(f, dynamic=True)
    for n in (2, 3, 2):
        x = torch.randn(5)
        torch.testing.assert_close(compiled(x, n), f(x, n))
    assert kiln.stats()["graphs"] == 2 and kiln.stats()["fallbacks"] == 0


def test_training_with_a_symbolic_int_saves_it_for_the_backward():
    def f(x, w, cache):
        cache.length += 1
        pos = torch.arange(cache.length, dtype=torch.float32)
        y = (x @ w)[:, :1] * pos
        return (y.sin() * cache.length).sum()

    kiln.reset()
    compiled = kiln.compile(f)
    mine, theirs = Counter(), Counter()
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(2, 4, generator=g)
        w = torch.randn(4, 3, generator=g, requires_grad=True)
        w2 = w.detach().clone().requires_grad_()
        got, want = compiled(x, w, mine), f(x, w2, theirs)
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(w.grad, w2.grad)
    _assert_compiled(kiln.stats(), graphs=2)


def test_ints_held_by_modules_stay_constants():
    """A module's int attribute is configuration (a head count, a window): it is guarded
    as a constant, so changing it recompiles instead of becoming a symbol."""

    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.k = 3

        def forward(self, x):
            return x * self.k

    kiln.reset()
    m = Scale()
    compiled = kiln.compile(m)
    for k in (3, 4, 5):
        m.k = k
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), x * k)
    assert kiln.stats()["graphs"] == 3  # a symbolic k would have served 4 and 5 with one
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["breaks"] == 0


def test_symbolic_int_arguments_in_op_positions():
    """Int arguments as dims, sizes, shifts and counts under ``dynamic=True``: dims and
    counts that fix shapes specialize, sizes stay symbolic (a reshape's ``-1`` is an exact
    quotient, a roll's shift a modulo of either sign, a view output's geometry is computed
    from the int input), with no fallback."""
    import torch.nn.functional as F

    def f(x, y, d, n, a, b):
        return (
            x.sum(d), x.reshape(-1, n), x.transpose(a, b), torch.cat([x, y], d),
            F.softmax(x, d), x[:, :n], torch.full((n,), 2.0), x.roll(n, d), x.roll(-n, d),
        )  # fmt: skip

    kiln.reset()
    compiled = kiln.compile(f, dynamic=True, options={"raise_on_error": True})
    for n in (2, 3, 4, 6):
        x, y = torch.randn(4, 12), torch.randn(4, 12)
        torch.testing.assert_close(compiled(x, y, 1, n, 0, 1), f(x, y, 1, n, 0, 1))
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["breaks"] == 0 and stats["eager_frames"] == 0
    assert stats["graphs"] == 1, stats  # n symbolic: one graph for every n
