"""A user's torch.autograd.Function in compiled code: its forward and its own backward are
traced into kiln's graphs (no break), gradients equal eager's; a Function whose methods
read mutable globals or print runs eagerly (a break), as before."""

from __future__ import annotations

import torch

import kiln

SCALE = 3.0
STATE = {"calls": 0}


class ScaledSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x * x * k * SCALE

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        # a backward that is not the forward's derivative: the graph must use this one
        return grad * x * ctx.k + 1.0, None


class ClampGrad(torch.autograd.Function):
    """Straight-through clamp with the new-style setup_context."""

    @staticmethod
    def forward(x):
        return x.clamp(-1, 1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x.abs() < 2).to(grad.dtype)


class Counting(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        STATE["calls"] += 1  # a side effect the graph would not repeat
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def _grads(fn, x, w):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = fn(x, w)
    out.backward()
    return out.detach(), x.grad, w.grad


def step(x, w):
    y = ScaledSquare.apply(x @ w, 0.5)
    return ClampGrad.apply(y.tanh() * 3).sum()


def test_autograd_functions_are_traced_with_their_own_backward():
    kiln.reset()
    torch.manual_seed(0)
    x, w = torch.randn(4, 6), torch.randn(6, 5)
    got = _grads(kiln.compile(step), x, w)
    expected = _grads(step, x, w)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    s = kiln.stats()
    assert s["graphs"] == 1 and s["breaks"] == s["fallbacks"] == s["eager_frames"] == 0, s


def test_a_module_constant_the_function_reads_is_guarded():
    global SCALE
    kiln.reset()
    x, w = torch.randn(4, 6), torch.randn(6, 5)
    compiled = kiln.compile(step)
    compiled(x, w)
    try:
        SCALE = 5.0
        torch.testing.assert_close(compiled(x, w), step(x, w))
    finally:
        SCALE = 3.0


def test_a_function_with_side_effects_runs_eagerly():
    kiln.reset()
    STATE["calls"] = 0
    f = kiln.compile(lambda x: Counting.apply(x).sin())
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(f(x), (x * 2).sin())
    assert STATE["calls"] == 3  # every call ran the forward
