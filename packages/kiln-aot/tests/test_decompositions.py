"""Each composite decomposes into the core set and matches eager, forward and backward."""

import pytest
import torch
import torch.nn.functional as F
from kiln_aot_testing import assert_close

import kiln_aot
from kiln_aot import aot_function, trace
from kiln_aot.decompositions import KILN_DECOMPOSITIONS

aten = torch.ops.aten


def r(*shape):
    return torch.randn(*shape)


CASES = {
    "softmax": (lambda x: torch.softmax(x, -1), lambda: [r(4, 7)]),
    "log_softmax": (lambda x: F.log_softmax(x, 1), lambda: [r(4, 7)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), lambda: [r(3, 4, 6), r(6), r(6)]),
    "layer_norm_2d_no_affine": (lambda x: F.layer_norm(x, (4, 6)), lambda: [r(3, 4, 6)]),
    "batch_norm_train": (
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        lambda: [r(4, 3, 5, 5), r(3), r(3)],
    ),
    "batch_norm_eval": (
        lambda x, m, v, w, b: F.batch_norm(
            x, m.detach(), v.detach().abs() + 0.5, w, b, training=False
        ),
        lambda: [r(4, 3, 5), r(3), r(3), r(3), r(3)],
    ),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), lambda: [r(2, 4, 3, 3), r(4), r(4)]),
    "gelu": (lambda x: F.gelu(x), lambda: [r(5, 6)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), lambda: [r(5, 6)]),
    "silu": (lambda x: F.silu(x), lambda: [r(5, 6)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), lambda: [r(2, 3, 5), r(4, 5), r(4)]),
    "addmm_beta_alpha": (
        lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0),
        lambda: [r(3, 4), r(3, 5), r(5, 4)],
    ),
    "baddbmm": (
        lambda b, x, y: torch.baddbmm(b, x, y),
        lambda: [r(2, 3, 4), r(2, 3, 5), r(2, 5, 4)],
    ),
    "matmul_broadcast": (lambda x, y: x @ y, lambda: [r(2, 3, 4, 5), r(5, 6)]),
    "mean_var_std": (
        lambda x: (x.mean(1), x.var(0), x.std(), torch.var_mean(x, 1, correction=0)[0]),
        lambda: [r(5, 6)],
    ),
    "split_unbind_chunk": (
        lambda x: (*x.split(2, 1), *x.unbind(0), *x.chunk(3, 1)),
        lambda: [r(3, 6)],
    ),
    "embedding": (lambda w, i: F.embedding(i, w), lambda: [r(10, 4), torch.randint(0, 10, (3, 5))]),
    "embedding_padding_idx": (
        lambda w, i: F.embedding(i, w, padding_idx=2),
        lambda: [r(10, 4), torch.tensor([[2, 1, 2, 5]])],
    ),
    "cross_entropy": (
        lambda x, t: F.cross_entropy(x, t),
        lambda: [r(6, 5), torch.randint(0, 5, (6,))],
    ),
    "mse_loss": (lambda x, y: F.mse_loss(x, y), lambda: [r(6, 5), r(6, 5)]),
    "to_dtype_and_factories": (
        lambda x: (
            x.to(torch.float64)
            + torch.ones_like(x, dtype=torch.float64)
            + torch.zeros(x.shape[-1], dtype=torch.float64)
        ),
        lambda: [r(3, 4)],
    ),
    "masked_fill_where": (
        lambda x: x.masked_fill(x > 0.5, -1.0) + torch.where(x < 0, x, 2 * x),
        lambda: [r(4, 4)],
    ),
    "conv_pool": (
        lambda x, w: (
            F.max_pool2d(F.conv2d(x, w, padding=1), 2) + F.avg_pool2d(F.conv2d(x, w, padding=1), 2)
        ),
        lambda: [r(2, 3, 8, 8), r(4, 3, 3, 3)],
    ),
    "adaptive_avg_pool": (lambda x: F.adaptive_avg_pool2d(x, 1), lambda: [r(2, 3, 5, 5)]),
    "activations": (
        lambda x: (
            F.relu(x),
            torch.sigmoid(x),
            torch.tanh(x),
            F.leaky_relu(x),
            F.hardtanh(x),
            F.elu(x),
        ),
        lambda: [r(4, 5)],
    ),
    "cat_stack_pad": (
        lambda x, y: (torch.cat([x, y], 1), torch.stack([x, y]), F.pad(x, (1, 2))),
        lambda: [r(3, 4), r(3, 4)],
    ),
    "flip": (lambda x: torch.flip(x, (0, 2)) * 2, lambda: [r(3, 4, 5)]),
    "cumsum": (lambda x, w: torch.cumsum(x * w, 1), lambda: [r(5, 30), r(5, 30)]),
    "adaptive_avg_pool2d_channels_last": (
        lambda x: F.adaptive_avg_pool2d(x * 2, 1),
        lambda: [r(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)],
    ),
    "adaptive_avg_pool2d_none": (
        lambda x: F.adaptive_avg_pool2d(x, (2, None)),
        lambda: [r(2, 3, 5, 6)],
    ),
    "sdpa": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda: [r(2, 2, 5, 8), r(2, 2, 5, 8), r(2, 2, 5, 8)],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_matches_eager_in_core_set(name):
    fn, make = CASES[name]
    inputs = make()
    gm = trace(fn, inputs)
    kiln_aot.verify_graph(gm)
    expected = fn(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, exp in zip(gm(*inputs), expected):
        assert_close(got, exp)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_eager(name, compiler):
    fn, make = CASES[name]
    inputs = [t.requires_grad_() if t.is_floating_point() else t for t in make()]
    cf = aot_function(fn, compiler)
    out = cf(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    seeds = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(list(outs), seeds)
    got = [t.grad.clone() if t.grad is not None else None for t in inputs if t.is_floating_point()]
    for t in inputs:
        t.grad = None
    ref = fn(*inputs)
    refs = ref if isinstance(ref, tuple) else (ref,)
    torch.autograd.backward(list(refs), seeds)
    for g, t in zip(got, [t for t in inputs if t.is_floating_point()]):
        assert_close(g, t.grad, rtol=1e-4, atol=1e-5)


def test_kiln_decompositions_cover_the_issue_composites():
    for op in (
        aten._softmax.default,
        aten.native_layer_norm.default,
        aten.native_batch_norm.default,
        aten.native_group_norm.default,
        aten.gelu.default,
        aten.silu.default,
        aten.addmm.default,
    ):
        assert op in KILN_DECOMPOSITIONS


def test_caller_decompositions_take_precedence():
    def relu_as_clamp(x):
        return aten.clamp.default(x, 0, None)

    gm = trace(
        lambda x: torch.nn.functional.silu(x),
        [r(3)],
        decompositions={aten.silu.default: lambda x: aten.mul.Tensor(x, aten.sigmoid.default(x))},
    )
    assert [str(n.target) for n in gm.graph.nodes if n.op == "call_function"] == [
        "aten.sigmoid.default",
        "aten.mul.Tensor",
    ]
    del relu_as_clamp


@pytest.mark.parametrize(
    "name",
    ["softmax", "log_softmax", "layer_norm", "group_norm", "gelu", "silu", "batch_norm_train"],
)
def test_low_precision_inputs_are_computed_in_fp32_like_eager(name):
    fn, make = CASES[name]
    inputs = [t.to(torch.bfloat16) for t in make()]
    gm = trace(fn, inputs)
    kiln_aot.verify_graph(gm)
    got, expected = gm(*inputs)[0], fn(*inputs)
    assert got.dtype == expected.dtype == torch.bfloat16
    assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)


def _targets(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("shape", [(), (3, 7)])
def test_bucketize_and_take_trace_to_core_index_ops(shape, right):
    """torch's decompositions index with Python's ``t[i]``, which takes ``i.item()`` for a
    0-dim ``i``; kiln's use ``index.Tensor``: core ops only, eager's values (a tie, NaN)."""
    boundaries = torch.tensor([-1.0, 0.0, 0.0, 0.5, 2.0, float("nan")])
    x = torch.randn(shape)
    if x.dim():
        x[0, :3] = torch.tensor([0.0, float("nan"), 5.0])

    def f(x, b, i):
        return (
            torch.bucketize(x, b, right=right),
            torch.bucketize(x, b, right=right, out_int32=True),
            torch.take(x, i),
        )

    inputs = [x, boundaries, torch.randint(-x.numel(), x.numel(), shape)]
    gm = trace(f, inputs)
    kiln_aot.verify_graph(gm)
    assert all(kiln_aot.core_ops.is_allowed(t) for t in _targets(gm)), gm.code
    for got, want in zip(gm(*inputs), f(*inputs)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, equal_nan=True)


def test_hypot_with_a_0dim_operand_stays_whole():
    """prims.hypot's meta kernel does not broadcast a 0-dim operand: aten.hypot is kept (the
    compiler lowers it)."""
    inputs = [r(5), torch.randn(())]
    gm = trace(torch.hypot, inputs)
    kiln_aot.verify_graph(gm)
    assert aten.hypot.default in _targets(gm), gm.code
    assert_close(gm(*inputs)[0], torch.hypot(*inputs))
