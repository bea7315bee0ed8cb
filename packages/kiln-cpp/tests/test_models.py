"""Inference of real model families through kiln-cpp matches eager (1e-4 relative, fp32):
a ResNet-style conv net, an MLP-Mixer, GPT-2 and LLaMA (transformers, random weights)."""

from __future__ import annotations

import re

import pytest
import torch
from models import MLPMixer, ResNet, gpt2, llama, logits_fn

import kiln_cpp


def _check(fn, inputs, rtol=1e-4, atol=1e-4):
    with torch.no_grad():
        compiled = kiln_cpp.compile_fx(fn, inputs)
        expected = fn(*inputs)
        got = compiled(*inputs)
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
        # a second call reuses the compiled graph and still matches
        again = compiled(*inputs)
        again = again[0] if isinstance(again, (tuple, list)) else again
        torch.testing.assert_close(again, expected, rtol=rtol, atol=atol)


def test_resnet_style_convnet():
    torch.manual_seed(0)
    model = ResNet().eval()
    for m in model.modules():  # non-trivial batch-norm statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    _check(model, [torch.randn(2, 3, 32, 32)])


def test_mlp_mixer():
    torch.manual_seed(0)
    _check(MLPMixer().eval(), [torch.randn(2, 3, 32, 32)])


def test_gpt2(monkeypatch, tmp_path):
    """Also: storage reused for buffers only kernels read is the reused tensor itself (no
    as_strided view per call), and the results stay right."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    torch.manual_seed(0)
    _check(logits_fn(gpt2()), [torch.randint(0, 512, (2, 24))])
    wrappers = "\n".join(p.read_text() for p in tmp_path.glob("graph*/wrapper.py"))
    assert re.search(r"^ +buf\d+ = buf\d+; del buf\d+$", wrappers, re.M), wrappers


@pytest.mark.slow
def test_llama():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    _check(logits_fn(llama()), [torch.randint(0, 512, (2, 24))])


def test_hf_convnext_inference_and_training(monkeypatch, tmp_path):
    """The permuted Linear folds from bmm into mm; outputs and every gradient match eager."""
    pytest.importorskip("transformers")
    from models import convnext

    torch.manual_seed(0)
    model = convnext().eval()
    image = torch.randn(2, 3, 32, 32)
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    _check(lambda x: model(x).last_hidden_state, [image])
    wrappers = "\n".join(p.read_text() for p in tmp_path.glob("graph*/wrapper.py"))
    assert "extern aten.mm" in wrappers and "aten.bmm" not in wrappers
    monkeypatch.delenv("KILN_DEBUG_DIR")
    model.train()
    reference = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = kiln_cpp.compile_fx(model, [image])(image)
    out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    out.square().mean().backward()
    got = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    want_out = model(image).last_hidden_state
    want_out.square().mean().backward()
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-4)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), reference[n])
        if p.grad is None:  # the pooler's norm: last_hidden_state does not read it
            assert got[n] is None or not got[n].any(), n
            continue
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-5)


def test_resnet_style_training_small_output_backward_is_matmuls(monkeypatch, tmp_path):
    """Training: the output and every gradient match eager. The last stage's convolutions
    (2 x 4 x 4 output pixels) take their backward as matmuls, with im2col rows and the
    col2im of the input gradient in generated kernels (patch_conv.py); the earlier stages'
    (2 x 8 x 8 and more) stay convolution backwards."""
    import copy

    torch.manual_seed(0)
    model = ResNet().train()
    ref = copy.deepcopy(model)
    image = torch.randn(2, 3, 32, 32)
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    out = kiln_cpp.compile_fx(model, [image])(image)
    want = ref(image)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    weight = torch.linspace(-1, 1, want.numel()).view(want.shape)
    (out * weight).sum().backward()
    (want * weight).sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    for (name, b), c in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-5, msg=name)
    wrappers = "\n".join(p.read_text() for p in tmp_path.glob("graph*/wrapper.py"))
    backward = [
        line for line in wrappers.splitlines() if "fallback aten.convolution_backward" in line
    ]
    # the last stage's 5 convolutions (4x4 outputs) are gone: 10 matmuls; the 9 of the two
    # stages before stay, and so does the stem's (no input gradient)
    assert len(backward) == 10, backward
    assert sum("[True, True, False]" in line for line in backward) == 9, backward
    assert sum("[False, True, False]" in line for line in backward) == 1, backward
    assert wrappers.count("extern aten.mm") >= 10
    fallbacks = re.findall(r"# fallback (aten\.\w+)", wrappers)
    assert set(fallbacks) == {
        "aten.convolution_backward",
        "aten.max_pool2d_with_indices_backward",
        "aten._adaptive_avg_pool2d_backward",
    }, fallbacks
