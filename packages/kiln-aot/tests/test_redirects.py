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
