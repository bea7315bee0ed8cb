"""scaled_dot_product_attention reaches the math kernel with the public op's mask semantics."""

import pytest
import torch
import torch.nn.functional as F

import kiln_aot


@pytest.mark.parametrize("mask_kind", ["bool", "bool_broadcast", "float"])
def test_sdpa_masks_match_eager(mask_kind):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    keep = torch.rand(2, 1, 16, 16) > 0.3
    keep[..., 0] = True  # every query attends somewhere
    if mask_kind == "bool":
        mask = keep.expand(2, 4, 16, 16).contiguous()
    elif mask_kind == "bool_broadcast":
        mask = keep
    else:
        mask = torch.randn(2, 1, 16, 16)

    def attend(q, k, v, mask):
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3),)

    gm = kiln_aot.trace(attend, [q, k, v, mask])
    torch.testing.assert_close(gm(q, k, v, mask)[0], attend(q, k, v, mask)[0])


def test_bool_mask_conversion_stays_on_the_query_device():
    q = kiln_aot.FakeTensor(torch.empty(2, 2, 4, 8, device="meta"), torch.device("cuda"))
    m = kiln_aot.FakeTensor(
        torch.empty(2, 1, 4, 4, dtype=torch.bool, device="meta"), torch.device("cuda")
    )
    gm = kiln_aot.trace(lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m), [q, m])
    kiln_aot.verify_graph(gm)
    devices = {
        n.meta["val"].device.type
        for n in gm.graph.nodes
        if n.op == "call_function" and n.meta["val"].dim() > 0
    }
    assert devices == {"cuda"}
    assert all(
        n.kwargs.get("device") == torch.device("cuda")
        for n in gm.graph.nodes
        if n.target is torch.ops.aten.scalar_tensor.default
    )


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_mask_constant_along_keys_runs_the_fused_kernel_unmasked(monkeypatch, mask_kind):
    """A mask expanded along the keys (last stride 0) keeps CUDA's fused kernels away, so
    eager runs the math kernel: kiln runs the fused kernel without the mask and zeroes the
    fully masked rows, as the math kernel does. The rule is for CUDA; here it is switched
    on for the CPU so that the result can be compared with the math kernel."""
    from kiln_aot import redirects

    monkeypatch.setattr(redirects, "ROW_MASK_DEVICES", ("cpu",))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    rows = torch.rand(2, 1, 16, 1) > 0.3
    rows[0, 0, 3] = False  # at least one fully masked row
    if mask_kind == "bool":
        mask = rows.expand(2, 1, 16, 16)
    else:
        shift = torch.randn(2, 1, 16, 1)
        mask = torch.where(rows, shift, float("-inf")).expand(2, 1, 16, 16)
    assert mask.stride(-1) == 0

    def attend(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3),)

    gm = kiln_aot.trace(attend, [q, k, v])
    attention = [n for n in gm.graph.nodes if "flash_attention" in str(n.target)]
    assert attention and all(n.kwargs.get("attn_mask") is None for n in attention)
    got = gm(q, k, v)[0]
    math_mask = mask if mask_kind == "float" else torch.where(mask, 0.0, float("-inf"))
    expected = torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, math_mask, 0.0, False, None, scale=0.3
    )[0]
    assert got[0, :, 3].abs().max() == 0 and not got.isnan().any()
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got.pow(2).sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.pow(2).sum(), (q, k, v))
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e)


def test_mask_constant_along_keys_is_left_alone_on_the_cpu():
    """On the CPU the fused kernel takes such a mask as it is: the call is not rewritten."""
    q = torch.randn(2, 2, 8, 4)
    mask = (torch.rand(2, 1, 8, 1) > 0.5).expand(2, 1, 8, 8)
    gm = kiln_aot.trace(lambda q: (F.scaled_dot_product_attention(q, q, q, attn_mask=mask),), [q])
    attention = [n for n in gm.graph.nodes if "flash_attention" in str(n.target)]
    assert attention and all(n.kwargs.get("attn_mask") is not None for n in attention)


def _attention_nodes(gm):
    return [n for n in gm.graph.nodes if "attention" in str(n.target)]


def _causal_args(node):
    """(is_causal, has a mask) of a traced fused attention call."""
    schema = node.target._schema
    args = dict(zip((a.name for a in schema.arguments), node.args))
    args.update(node.kwargs)
    return bool(args.get("is_causal")), args.get("attn_mask", args.get("attn_bias")) is not None


@pytest.mark.parametrize("form", ["bool", "additive_inf", "additive_min"])
def test_constant_causal_mask_runs_as_is_causal(form):
    """A causal mask the function builds from aranges (transformers' decoders under a
    compiler) is evaluated at trace time and attention runs with is_causal=True and no
    mask, as eager runs it; outputs and gradients equal the masked call's."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))

    def attend(q, k, v):
        pos = torch.arange(16)
        keep = (pos[None, :] <= pos[:, None])[None, None].expand(2, 1, 16, 16)
        if form == "bool":
            mask = keep
        else:
            low = float("-inf") if form == "additive_inf" else torch.finfo(q.dtype).min
            mask = torch.zeros(2, 1, 16, 16).masked_fill(~keep, low)
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3),)

    gm = kiln_aot.trace(attend, [q, k, v])
    attention = _attention_nodes(gm)
    assert attention and all(_causal_args(n) == (True, False) for n in attention)
    got = gm(q, k, v)[0]
    expected = attend(q, k, v)[0]
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got.pow(2).sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.pow(2).sum(), (q, k, v))
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("kind", ["sliding_window", "from_input", "shifted"])
def test_other_masks_keep_the_mask(kind):
    """A constant mask that is not exactly causal (a sliding window, a causal mask whose
    diagonal is shifted) or one computed from an input is passed on as it is."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    limit = torch.tensor(16)

    def attend(q, k, v, limit):
        pos = torch.arange(16)
        keep = pos[None, :] <= pos[:, None]
        if kind == "sliding_window":
            keep = keep & (pos[None, :] > pos[:, None] - 4)
        elif kind == "from_input":
            keep = keep & (pos[None, :] < limit)
        else:
            keep = pos[None, :] <= pos[:, None] + 1
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.3),)

    gm = kiln_aot.trace(attend, [q, k, v, limit])
    attention = _attention_nodes(gm)
    assert attention and all(_causal_args(n) == (False, True) for n in attention)
    torch.testing.assert_close(gm(q, k, v, limit)[0], attend(q, k, v, limit)[0])
