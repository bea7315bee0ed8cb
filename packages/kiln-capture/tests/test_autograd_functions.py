"""``torch.autograd.Function.apply`` with no gradient to compute (variables/functions.py,
``inline_function_apply``): eager runs ``forward`` under no_grad and its outputs need no
grad, so its forward is traced inline, module and function arguments included."""

import pytest
import torch
from helpers import CountingBackend, assert_same

import kiln_capture


class _Through(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layers, scale):
        for layer in layers:
            x = layer(x) * scale
        ctx.save_for_backward(x.detach())
        ctx.layers = layers
        return torch.cat([x, x], dim=-1), ctx.needs_input_grad[0]

    @staticmethod
    def backward(ctx, grad, _):
        raise AssertionError("not differentiated here")


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)]

    def forward(self, x):
        out, needed = _Through.apply(x * 2, self.layers, 0.5)
        return out + 1, needed


@pytest.mark.parametrize("grad", [False, True])
def test_apply_with_module_arguments_is_inlined_without_grad(grad):
    torch.manual_seed(0)
    model = _Model()
    x = torch.randn(3, 8)  # needs no grad: nor does apply's output, even under enable_grad
    backend = CountingBackend()
    fast = kiln_capture.optimize(backend, fullgraph=True)(model)
    with torch.set_grad_enabled(grad):
        got, want = fast(x), model(x)
    assert_same(got, want)
    assert not got[0].requires_grad
    assert len(backend.graphs) == 1


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _double(x):
    return _Double.apply(x) + 1


def test_apply_needing_a_gradient_stays_one_graph_call():
    """an input that requires grad: the bound apply in the graph (its own backward)."""
    backend = CountingBackend()
    fast = kiln_capture.optimize(backend)(_double)
    x = torch.randn(4, requires_grad=True)
    got = fast(x)
    got.sum().backward()
    assert torch.equal(x.grad, torch.full((4,), 2.0))
    assert "apply" in backend.graphs[0].code
