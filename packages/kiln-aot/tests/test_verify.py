import operator

import pytest
import torch
from torch import fx

from kiln_aot import ContractViolation, trace, verify_graph

aten = torch.ops.aten


def test_traced_graphs_pass():
    verify_graph(trace(lambda x: x.softmax(-1), [torch.randn(2, 3)]))


def _graph_with(target, args_fn):
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(3, device="meta")
    n = g.call_function(target, args_fn(x))
    n.meta["val"] = torch.empty(3, device="meta")
    g.output((n,))
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize(
    "target, args_fn, message",
    [
        (aten.add_.Tensor, lambda x: (x, x), "not in the core set"),
        (
            aten.native_layer_norm.default,
            lambda x: (x, [3], None, None, 1e-5),
            "not in the core set",
        ),
        (torch.add, lambda x: (x, x), "not in the core set"),
    ],
)
def test_violations_are_reported(target, args_fn, message):
    with pytest.raises(ContractViolation, match=message):
        verify_graph(_graph_with(target, args_fn))


def test_missing_meta_val_is_reported():
    gm = _graph_with(aten.neg.default, lambda x: (x,))
    next(n for n in gm.graph.nodes if n.op == "call_function").meta.clear()
    with pytest.raises(ContractViolation, match="meta"):
        verify_graph(gm)


def test_getitem_is_allowed():
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(3, 4, device="meta")
    m = g.call_function(aten.max.dim, (x, 1))
    m.meta["val"] = (torch.empty(3, device="meta"), torch.empty(3, dtype=torch.long, device="meta"))
    v = g.call_function(operator.getitem, (m, 0))
    v.meta["val"] = torch.empty(3, device="meta")
    g.output((v,))
    verify_graph(fx.GraphModule(torch.nn.Module(), g))
