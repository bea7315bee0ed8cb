"""kiln_cpp.compile_fx as a backend under torch's own capture (DESIGN.md contract 1)."""

from __future__ import annotations

import torch

import kiln_cpp


def test_torch_compile_inference_matches_eager():
    def f(x, y):
        return torch.softmax(x @ y, -1) * torch.sigmoid(x.sum(-1, keepdim=True))

    x, y = torch.randn(8, 16), torch.randn(16, 16)
    compiled = torch.compile(f, backend=kiln_cpp.compile_fx)
    torch.testing.assert_close(compiled(x, y), f(x, y))


def test_torch_compile_module_training_gradients_match_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )
    x = torch.randn(8, 16)
    compiled = torch.compile(model, backend=kiln_cpp.compile_fx)
    loss = compiled(x).square().mean()
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected_loss = model(x).square().mean()
    expected_loss.backward()
    torch.testing.assert_close(loss, expected_loss)
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
