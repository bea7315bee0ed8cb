"""The Done-when models on CUDA: fakes report the CUDA device, the autograd engine runs the
joint trace on its device thread, dropout keeps ``native_dropout`` (same mask as eager under
the same seed), attention keeps the fused kernel eager picks (flash, memory-efficient,
cuDNN) with its backward op, batch norm goes through cuDNN's op."""

import copy

import pytest
import torch
import torch.nn.functional as F
from kiln_aot_testing import assert_close, grads_of
from models import ConvBNReLU, TinyTransformer
from torch.utils._python_dispatch import TorchDispatchMode

import kiln_aot
from kiln_aot import aot_function, aot_module, config
from kiln_aot.core_ops import ATTENTION_OPS

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


class _AttentionOpsSeen(TorchDispatchMode):
    """Records the fused attention ops eager runs."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in ATTENTION_OPS:
            self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _attention_case(kind, dtype):
    q = torch.randn(2, 8, 128, 64, device="cuda", dtype=dtype)
    kv_heads = 2 if kind == "gqa" else 8
    k, v = (torch.randn(2, kv_heads, 128, 64, device="cuda", dtype=dtype) for _ in range(2))
    kwargs = {
        "causal": {"is_causal": True},
        "additive_mask": {"attn_mask": torch.randn(2, 1, 128, 128, device="cuda", dtype=dtype)},
        "bool_mask": {"attn_mask": torch.rand(2, 1, 128, 128, device="cuda") > 0.2},
        "gqa": {"is_causal": True, "enable_gqa": True},
        "head_dim_40": {},
        "dropout": {"dropout_p": 0.2, "is_causal": True},
    }[kind]
    if kind == "head_dim_40":  # flash pads the head dim to a multiple of 8 itself
        q, k, v = (t[..., :40].contiguous() for t in (q, k, v))
    return q, k, v, kwargs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "kind", ["causal", "additive_mask", "bool_mask", "gqa", "head_dim_40", "dropout"]
)
def test_sdpa_on_cuda_keeps_eagers_fused_kernel(kind, dtype, compiler):
    q, k, v, kwargs = _attention_case(kind, dtype)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fn = aot_function(attend, compiler)
    torch.manual_seed(5)
    out = fn(*leaves)
    seen = _AttentionOpsSeen()
    torch.manual_seed(5)
    with seen:
        expected = attend(*ref_leaves)
    g = torch.randn_like(out)
    out.backward(g)
    expected.backward(g)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    assert_close(out, expected, rtol=tol, atol=tol)
    for a, b in zip(grads_of(leaves), grads_of(ref_leaves)):
        assert_close(a, b, rtol=tol, atol=tol)
    fw, bw = compiler.graphs
    fused_fw = [n.target for n in fw.graph.nodes if n.target in ATTENTION_OPS]
    fused_bw = [n.target.name() for n in bw.graph.nodes if n.target in ATTENTION_OPS]
    assert fused_fw == seen.ops  # the fused kernel eager ran (none: math, as eager)
    assert fused_bw == [op.name() + "_backward" for op in seen.ops]
    if seen.ops:
        assert not any(n.target is torch.ops.aten.bmm.default for n in fw.graph.nodes)


def test_sdpa_on_cuda_traces_through_math_when_asked(compiler):
    q = torch.randn(2, 4, 16, 32, device="cuda")
    with config.override(fused_attention=False):
        gm = kiln_aot.trace(
            lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True),
            [q],
        )
    kiln_aot.verify_graph(gm)
    assert not any(n.target in ATTENTION_OPS for n in gm.graph.nodes)
    assert_close(
        gm(q)[0],
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("causal", [False, True])
def test_efficient_attention_off_traces_math_for_float32(causal):
    """``efficient_attention=False``: where the dispatcher would run the memory-efficient
    kernel (float32 on CUDA), the trace holds the math kernel's matmuls and softmax; a
    constant causal mask still becomes is_causal."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32, device="cuda", requires_grad=True) for _ in range(3))

    def attend(q, k, v):
        mask = None
        if causal:
            pos = torch.arange(64, device="cuda")
            mask = pos[None, :] <= pos[:, None]
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask),)

    with config.override(efficient_attention=False):
        gm = kiln_aot.trace(attend, [q, k, v])
    kiln_aot.verify_graph(gm)
    assert not any(n.target in ATTENTION_OPS for n in gm.graph.nodes)
    got, expected = gm(q, k, v)[0], attend(q, k, v)[0]
    assert_close(got, expected, rtol=1e-4, atol=1e-4)
    grads = torch.autograd.grad(got.pow(2).sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.pow(2).sum(), (q, k, v))
    for a, b in zip(grads, expected_grads):
        assert_close(a, b, rtol=1e-4, atol=1e-4)
