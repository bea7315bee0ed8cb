"""The Done-when models on CUDA: fakes report the CUDA device, the autograd engine runs the
joint trace on its device thread, dropout keeps ``native_dropout`` (same mask as eager under
the same seed), attention goes through the math backend, batch norm through cuDNN's op."""

import copy

import pytest
import torch
from kiln_aot_testing import assert_close
from models import ConvBNReLU, TinyTransformer

import kiln_aot
from kiln_aot import aot_module

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _train_step_matches(model, x, compiler):
    model = model.cuda()
    ref = copy.deepcopy(model)
    cm = aot_module(model, compiler)
    torch.manual_seed(3)
    out = cm(x)
    torch.manual_seed(3)
    expected = ref(x)
    assert_close(out, expected, rtol=1e-4, atol=1e-4)  # TF32-free fp32, cuBLAS reduction order
    g = torch.randn_like(out)
    out.backward(g)
    expected.backward(g)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)
    for a, b in zip(model.buffers(), ref.buffers()):
        assert_close(a.float(), b.float(), rtol=1e-5, atol=1e-6)


def test_transformer_with_dropout_on_cuda(compiler):
    _train_step_matches(
        TinyTransformer(layers=2, p=0.1).train(),
        torch.randint(0, 64, (2, 16), device="cuda"),
        compiler,
    )
    assert all(
        n.meta["val"].device.type == "cuda"
        for g in compiler.graphs
        for n in g.graph.nodes
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
    )


def test_conv_bn_relu_on_cuda(compiler):
    _train_step_matches(ConvBNReLU().train(), torch.randn(4, 3, 8, 8, device="cuda"), compiler)


def test_sdpa_on_cuda_traces_through_math(compiler):
    q = torch.randn(2, 4, 16, 32, device="cuda")
    gm = kiln_aot.trace(
        lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), [q]
    )
    kiln_aot.verify_graph(gm)
    assert_close(
        gm(q)[0],
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True),
        rtol=1e-4,
        atol=1e-4,
    )
