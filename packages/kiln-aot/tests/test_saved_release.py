"""The backward releases the forward's saved tensors as it goes: autograd's references are
dropped before the compiled backward runs (``ctx.maybe_clear_saved_tensors``) and a
backward that takes a list it may empty (``call_stealing``, as kiln-inductor's compiled
graphs do) gets the saved tensors in that list only, so each is freed at its last use.
With ``retain_graph=True`` they stay for the next backward. Gradients equal eager's."""

from __future__ import annotations

import gc
import weakref

import torch

import kiln_aot


class Stealing:
    """A backward compiler's result that records which saved tensors outlive the list."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.alive: list[list[bool]] = []
        self.n_saved = sum(
            not n.name.startswith("tangents") for n in gm.graph.nodes if n.op == "placeholder"
        )

    def call_stealing(self, args: list) -> tuple:
        refs = [weakref.ref(a) for a in args[: self.n_saved] if isinstance(a, torch.Tensor)]
        values = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        args.clear()
        gc.collect()
        self.alive.append([r() is not None for r in refs])
        return self.gm(*values)

    def __call__(self, *args):
        return self.gm(*args)


def _fn(x, w):
    h = torch.sin(x @ w)
    return (torch.cos(h) * h).sum()


def _compiled():
    made: list[Stealing] = []

    def bw_compiler(gm, example_inputs):
        made.append(Stealing(gm))
        return made[-1]

    inputs = [torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)]
    compiled = kiln_aot.aot_graph(
        _fn, inputs, fw_compiler=lambda gm, ex: gm, bw_compiler=bw_compiler
    )
    return compiled, made


def _grads(fn, x, w, retain=False):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    loss = fn(x, w)
    loss = loss[0] if isinstance(loss, tuple | list) else loss
    loss.backward(retain_graph=retain)
    return loss, x.grad, w.grad, (loss, x, w)


def test_saved_intermediates_are_released_before_the_backward_ends():
    compiled, made = _compiled()
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    want = _grads(_fn, x, w)
    got = _grads(compiled, x, w)
    for a, b in zip(got[:3], want[:3]):
        torch.testing.assert_close(a, b)
    (stealer,) = made
    (alive,) = stealer.alive
    # the inputs x and w stay alive (the test holds them); every intermediate is gone
    assert alive.count(False) >= 1 and alive.count(True) <= 2, alive


def test_retain_graph_keeps_them_for_the_next_backward():
    compiled, made = _compiled()
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    loss, gx, gw, keep = _grads(compiled, x, w, retain=True)
    first = (gx.clone(), gw.clone())
    keep[0].backward()  # the second backward through the same graph
    torch.testing.assert_close(keep[1].grad, 2 * first[0])
    torch.testing.assert_close(keep[2].grad, 2 * first[1])
    assert all(made[0].alive[0]), made[0].alive  # kept for the second backward
