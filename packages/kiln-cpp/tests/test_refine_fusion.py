"""A reduction and a consumer that reads its rows in another shape share one kernel
(kiln-inductor's scheduler/refine.py): results match eager, (training through kiln: packages/kiln/tests/test_refine_training.py)."""

from __future__ import annotations

import torch

import kiln_cpp
from kiln_inductor.graph import GraphLowering
from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
from kiln_inductor.testing import PreNormBlock, aten_graph


def test_layer_norm_and_its_reshaped_output_fuse_and_match_eager():
    torch.manual_seed(0)
    model = PreNormBlock().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, 5, 48)
    aten = torch.ops.aten

    def ln(t, w, b, m):
        y = aten.native_layer_norm.default(t, [48], w, b, 1e-5)[0]
        return (aten.mm.default(aten.view.default(y, [15, 48]), m),)

    args = [x, model.norm.weight.detach(), model.norm.bias.detach(), torch.randn(48, 8)]
    ir = GraphLowering(aten_graph(ln, args), args).run()
    assert len([s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]) == 1
    with torch.no_grad():
        got = kiln_cpp.compile_fx(model, [x])(x)
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
