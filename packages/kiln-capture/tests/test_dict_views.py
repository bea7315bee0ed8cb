"""Dict views stay live, Tensor.type() names the real tensor's type, and explain() offers
torch's field names."""

from __future__ import annotations

import torch

import kiln_capture


def _views(x):
    d = {"a": x, "b": x * 2}
    keys, values, items = d.keys(), d.values(), d.items()
    d["c"] = x + 1
    del_ok = "c" in keys
    out = x * 0
    for v in values:
        out = out + v
    return out, len(keys), list(keys), len(items), del_ok


def _types(x):
    return x.type(), x.double().type(), x.type(torch.float64) * 2


def _graphs_of(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return kiln_capture.optimize(backend)(fn)(*args), graphs


def test_dict_views_see_later_changes():
    x = torch.randn(3)
    got, graphs = _graphs_of(_views, x)
    want = _views(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] == (3, ["a", "b", "c"], 3, True)
    assert len(graphs) == 1


def test_tensor_type_names_the_real_tensor():
    x = torch.randn(3)
    got, graphs = _graphs_of(_types, x)
    want = _types(x)
    assert got[:2] == want[:2] == ("torch.FloatTensor", "torch.DoubleTensor")
    torch.testing.assert_close(got[2], want[2])
    assert len(graphs) == 1


def test_explain_has_torchs_field_names():
    out = kiln_capture.explain(lambda x: torch.sin(x).cos(), torch.randn(2))
    assert out.graph_break_count == out.break_count == 0
    assert out.graph_count == 1 and out.op_count == 2
    assert out.out_guards == out.guards and out.break_reasons == out.breaks
