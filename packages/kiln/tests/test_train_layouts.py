"""Training steps make no per-step layout copies: the backward is compiled on its first
call for the strides its tangents arrive with (the expanded ``ones`` of
``.sum().backward()``, a transposed gradient; kiln-aot's backward_variants.py), saved tensors reach
the backward with the strides it was compiled for. Counted with
``kiln_inductor.layout_copies()`` and ``kiln_aot.tangent_copies()``; gradients equal eager's,
kernels are generated and nothing falls back."""

from __future__ import annotations

import pytest
import torch

import kiln
import kiln_aot
import kiln_inductor


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    kiln_inductor.reset_layout_copies()
    kiln_aot.reset_tangent_copies()
    yield


def _copies() -> tuple[dict, dict]:
    return kiln_inductor.layout_copies(), kiln_aot.tangent_copies()


def _block(x, w, b):
    h = torch.nn.functional.gelu(x @ w + b)
    return h.softmax(-1) * h


def _check_grads(fn, ref, inputs, loss, steps: int = 3) -> None:
    for _ in range(steps):
        for t in inputs:
            t.grad = None
        loss(fn(*inputs)).backward()
        got = [t.grad.clone() for t in inputs]
        for t in inputs:
            t.grad = None
        loss(ref(*inputs)).backward()
        for g, e in zip(got, [t.grad for t in inputs]):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(8, 16, requires_grad=True), torch.randn(16, 32, requires_grad=True),
            torch.randn(32, requires_grad=True)]  # fmt: skip


S = torch.randn(32, 8)
LOSSES = {
    "sum (expanded ones)": lambda y: y.sum(),
    "transposed grad": lambda y: (y.t() * S).sum(),
    "mean": lambda y: y.mean(),
    "contiguous grad": lambda y: (y * y).sum(),
}


@pytest.mark.parametrize("loss", list(LOSSES), ids=list(LOSSES))
def test_no_tangent_copies(loss):
    fn = kiln.compile(_block)
    _check_grads(fn, _block, _inputs(), LOSSES[loss])
    assert _copies() == ({}, {})
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["fallbacks"] == 0 and stats["recompiles"] == 0


def test_each_tangent_layout_compiles_once_and_is_reused():
    """Alternating losses: one backward per tangent layout, each reused, no copies."""
    fn = kiln.compile(_block)
    inputs = _inputs()
    compiled = []
    real = kiln_inductor.compile_aten_graph

    def counting(gm, example_inputs):
        out = real(gm, example_inputs)
        compiled.append(out)
        assert out.stats["kernels"] > 0 and not out.stats["fallbacks"]
        return out

    import kiln_inductor.compile as kc

    kc_compile = kc.compile_aten_graph
    kc.compile_aten_graph = counting
    try:
        for name in ["sum (expanded ones)", "transposed grad", "contiguous grad"] * 2:
            _check_grads(fn, _block, inputs, LOSSES[name], steps=1)
    finally:
        kc.compile_aten_graph = kc_compile
    # the forward, and a backward per tangent layout, each compiled on its first call:
    # expanded ones, transposed, contiguous (the traced strides)
    assert len(compiled) == 4
    assert _copies() == ({}, {})


def test_saved_transposed_views_are_not_copied():
    """Saved values that are views (a transposed weight, a permuted activation) reach the
    backward as the forward made them."""

    def f(x, w):
        y = x @ w.t()
        return (y.permute(1, 0) * 2).relu().permute(1, 0).sin()

    torch.manual_seed(0)
    inputs = [torch.randn(8, 16, requires_grad=True), torch.randn(24, 16, requires_grad=True)]
    _check_grads(kiln.compile(f), f, inputs, lambda y: (y * y).sum())
    _check_grads(kiln.compile(f), f, inputs, lambda y: y.sum())
    assert _copies() == ({}, {})
    stats = kiln.stats()  # compiled, not run eagerly
    assert stats["graphs"] >= 1 and stats["fallbacks"] == stats["eager_frames"] == 0, stats


def test_hf_gpt2_training_step_makes_no_layout_copies():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 128, (2, 16))
    target = torch.randint(0, 128, (32,))
    cm = kiln.compile(model)

    def step(m):
        model.zero_grad(set_to_none=True)
        logits = m(ids)[0]
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), target).backward()
        return [p.grad.clone() for p in model.parameters()]

    for _ in range(2):
        got, want = step(cm), step(model)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    # a loss over the logits' sum sends the expanded ones: compiled for, not copied
    model.zero_grad(set_to_none=True)
    cm(ids)[0].sum().backward()
    assert _copies() == ({}, {})
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0, stats
    assert stats["fallbacks"] == stats["eager_frames"] == 0, stats
