"""scaled_dot_product_attention keeps the fused kernel eager runs (config.fused_attention):
one op in the forward graph, its backward op in the backward graph, what the backward needs
saved by the partitioner; the math decomposition where no fused kernel serves, or when the
setting is off. Every result is compared with eager, gradients too."""

import pytest
import torch
import torch.nn.functional as F
from kiln_aot_testing import grads_of

import kiln_aot
from kiln_aot import aot_function, config
from kiln_aot.fake import FakeTensor
from kiln_aot.joint import trace_joint

aten = torch.ops.aten
FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default
FLASH_CPU_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
MATMULS = (aten.bmm.default, aten.mm.default)
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _case(kind, dtype):
    """(q, k, v, keyword arguments) of one attention call."""
    heads_kv = 2 if kind == "gqa" else 4
    q = torch.randn(2, 4, 16, 8, dtype=dtype)
    k = torch.randn(2, heads_kv, 16, 8, dtype=dtype)
    v = torch.randn(2, heads_kv, 16, 8, dtype=dtype)
    keep = torch.rand(2, 1, 16, 16) > 0.3
    keep[..., 0] = True  # every query attends somewhere
    kwargs = {
        "causal": {"is_causal": True},
        "bool_mask": {"attn_mask": keep},
        "additive_mask": {"attn_mask": torch.randn(2, 1, 16, 16, dtype=dtype)},
        "gqa": {"is_causal": True, "enable_gqa": True},
        "scaled": {"scale": 0.3},
    }[kind]
    return q, k, v, kwargs


def _train_and_compare(q, k, v, kwargs, compiler, tol):
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs) * 2

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fn = aot_function(attend, compiler)
    out = fn(*leaves)
    g = torch.randn_like(out)
    out.backward(g)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = attend(*ref_leaves)
    expected.backward(g)
    torch.testing.assert_close(out, expected, rtol=tol[0], atol=tol[1])
    for a, b in zip(grads_of(leaves), grads_of(ref_leaves)):
        torch.testing.assert_close(a, b, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["causal", "bool_mask", "additive_mask", "gqa", "scaled"])
def test_fused_attention_trains_like_eager(kind, dtype, compiler):
    q, k, v, kwargs = _case(kind, dtype)
    _train_and_compare(q, k, v, kwargs, compiler, TOLERANCE[dtype])
    fw, bw = compiler.graphs
    assert targets(fw).count(FLASH_CPU) == 1 and FLASH_CPU_BACKWARD not in targets(fw)
    assert targets(bw).count(FLASH_CPU_BACKWARD) == 1 and FLASH_CPU not in targets(bw)
    assert not any(t in MATMULS for t in targets(fw) + targets(bw))


@pytest.mark.parametrize("kind", ["causal", "bool_mask", "gqa"])
def test_fused_attention_inference_is_one_op(kind, compiler):
    q, k, v, kwargs = _case(kind, torch.float32)

    def attend(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, **kwargs),)

    gm = kiln_aot.trace(attend, [q, k, v])
    kiln_aot.verify_graph(gm)
    assert targets(gm).count(FLASH_CPU) == 1
    assert not any(t in MATMULS for t in targets(gm))
    torch.testing.assert_close(gm(q, k, v)[0], attend(q, k, v)[0])


def test_backward_reads_the_saved_output_and_logsumexp(compiler):
    q, k, v, kwargs = _case("causal", torch.float32)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    joint, info = trace_joint(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), leaves, [True] * 3
    )
    fw, bw = kiln_aot.min_cut_partition(joint, leaves, num_fwd_outputs=info.num_fwd_outputs)
    (bw_call,) = [n for n in bw.graph.nodes if n.target is FLASH_CPU_BACKWARD]
    saved = [n for n in bw.graph.nodes if n.op == "placeholder" and n.name.startswith("saved_")]
    out, lse = bw_call.args[4], bw_call.args[5]
    assert out in saved and lse in saved  # read from the forward, not recomputed
    assert tuple(lse.meta["val"].shape) == (2, 4, 16)  # the log-sum-exp, not probabilities


@pytest.mark.parametrize("kind", ["causal", "bool_mask", "additive_mask"])
def test_math_setting_decomposes_attention(kind, compiler):
    q, k, v, kwargs = _case(kind, torch.float32)
    with config.override(fused_attention=False):
        _train_and_compare(q, k, v, kwargs, compiler, TOLERANCE[torch.float32])
    fw, bw = compiler.graphs
    assert FLASH_CPU not in targets(fw) and FLASH_CPU_BACKWARD not in targets(bw)
    assert aten.bmm.default in targets(fw) and aten.bmm.default in targets(bw)


def test_dropout_falls_back_to_math_as_the_dispatcher_does(compiler):
    """CPU flash attention has no dropout: eager runs the math kernel, and so does the trace
    (same mask as eager under the same seed)."""
    q, k, v, _ = _case("causal", torch.float32)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, is_causal=True)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fn = aot_function(attend, compiler)
    torch.manual_seed(7)
    out = fn(*leaves)
    torch.manual_seed(7)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = attend(*ref_leaves)
    torch.testing.assert_close(out, expected)
    g = torch.randn_like(out)
    out.backward(g)
    expected.backward(g)
    for a, b in zip(grads_of(leaves), grads_of(ref_leaves)):
        torch.testing.assert_close(a, b)
    assert FLASH_CPU not in targets(compiler.graphs[0])
    assert aten.bmm.default in targets(compiler.graphs[0])


def test_attention_inside_a_module_trains_like_eager(compiler):
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)
            self.out = torch.nn.Linear(32, 32)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (y.view(b, t, 4, 8).transpose(1, 2) for y in self.qkv(x).split(32, dim=-1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, 32))

    m = Attention()
    x = torch.randn(2, 16, 32)
    cm = kiln_aot.aot_module(m, compiler)
    out = cm(x)
    expected = m(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    got = grads_of(m.parameters())
    m.zero_grad()
    expected.sum().backward()
    for a, b in zip(got, grads_of(m.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert FLASH_CPU in targets(compiler.graphs[0])


def test_fused_sdp_choice_is_the_dispatchers_answer():
    q, k, v, _ = _case("causal", torch.float32)
    choice = torch._fused_sdp_choice(q, k, v, dropout_p=0.0, is_causal=True)
    gm = kiln_aot.trace(
        lambda q, k, v: (torch._fused_sdp_choice(q, k, v, is_causal=True),), [q, k, v]
    )
    assert gm.meta["kiln_aot"].outputs[0].value == choice != 0
    with config.override(fused_attention=False):
        gm = kiln_aot.trace(lambda q, k, v: (torch._fused_sdp_choice(q, k, v),), [q, k, v])
    assert gm.meta["kiln_aot"].outputs[0].value == 0  # SDPBackend.MATH


def _cuda_fake(*shape, dtype=torch.bfloat16):
    return FakeTensor(torch.empty(*shape, dtype=dtype, device="meta"), torch.device("cuda"))


def test_cuda_flash_attention_graph_without_a_gpu():
    """A graph calling CUDA flash attention traces without a GPU (fakes report cuda): its
    integer outputs (max sequence lengths) stay Python values in the graph, which the
    backward op reads with the RNG state. (The autograd engine needs a GPU for CUDA fakes;
    tests/test_gpu.py covers the joint graph.)"""
    q, k, v, g = (_cuda_fake(2, 4, 16, 64) for _ in range(4))
    flash = aten._scaled_dot_product_flash_attention.default
    flash_backward = aten._scaled_dot_product_flash_attention_backward.default

    def attend(q, k, v, g):
        out, lse, cq, ck, max_q, max_k, rng, unused, _ = flash(q, k, v, 0.0, True)
        grads = flash_backward(g, q, k, v, out, lse, cq, ck, max_q, max_k, 0.0, True, rng, unused)
        return out, *grads

    gm = kiln_aot.trace(attend, [q, k, v, g])
    kiln_aot.verify_graph(gm)
    assert targets(gm).count(flash) == 1 and targets(gm).count(flash_backward) == 1
    (bwd,) = [n for n in gm.graph.nodes if n.target is flash_backward]
    assert bwd.args[8:10] == (16, 16)  # max_q, max_k: constants, not graph values
    assert all(n.meta["val"].device.type == "cuda" for n in gm.graph.nodes if n.op == "placeholder")


class _ChoiceStub:
    """Stands in for ``torch.ops.aten`` in attention.py: the dispatcher answers ``choice``."""

    def __init__(self, choice: int):
        self._fused_sdp_choice = type("Op", (), {"default": staticmethod(lambda *a, **k: choice)})


@pytest.mark.parametrize("choice", [1, 2, 3], ids=["flash", "efficient", "cudnn"])
def test_memory_efficient_attention_is_math_when_switched_off(monkeypatch, choice):
    from kiln_aot.decompositions import attention

    q = torch.randn(1, 2, 4, 8)
    monkeypatch.setattr(attention, "aten", _ChoiceStub(choice))
    assert attention.dispatcher_sdp_choice(q, q, q) == choice
    # off, CUDA's memory-efficient kernel (the fp32 choice) is traced as math
    expected = 0 if choice == 2 else choice
    with config.override(efficient_attention=False):
        assert attention.dispatcher_sdp_choice(q, q, q) == expected
