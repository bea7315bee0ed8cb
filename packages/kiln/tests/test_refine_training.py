"""Training through a pre-norm MLP block whose layer_norm statistics and normalized rows
(read by the matmul as a (batch * tokens, width) matrix) are one kernel (kiln-inductor's
scheduler/refine.py): loss and gradients match eager."""

from __future__ import annotations

import torch

import kiln
from kiln_inductor.testing import PreNormBlock


def test_training_through_the_fused_block_matches_eager():
    kiln.reset()
    torch.manual_seed(0)
    model, ref = PreNormBlock(), PreNormBlock()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(3, 5, 48)
    out = kiln.compile(model)(x)
    expected = ref(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    out.backward(g)
    expected.backward(g)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    kiln.reset()
