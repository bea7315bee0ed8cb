"""passes/collectives.py: a collective moves up to just after its input (never above an
earlier collective) and its wait down to just before its first reader, so the work
between them overlaps the communication. Graphs are built by hand (no process group is
needed to reorder them)."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx

from kiln_inductor.passes.collectives import schedule_collectives

c10d = getattr(torch.ops, "_c10d_functional", None)
pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or c10d is None, reason="needs torch.distributed"
)
aten = torch.ops.aten


def _names(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "call_function"]


def _graph(late_start: bool) -> torch.fx.GraphModule:
    """relu(x @ w) all-reduced, sin(v @ w) independent of it, then their sum; the
    collective as capture leaves it: its wait right after it (and, with ``late_start``,
    the collective itself after the independent work)."""
    g = torch.fx.Graph()
    x, w, v = (g.placeholder(n) for n in "xwv")
    y = g.call_function(aten.relu.default, (g.call_function(aten.mm.default, (x, w)),))
    y.name = "y"

    def collective():
        start = g.call_function(c10d.all_reduce.default, (y, "sum", "0"))
        return start, g.call_function(c10d.wait_tensor.default, (start,))

    if not late_start:
        start, wait = collective()
    z = g.call_function(aten.sin.default, (g.call_function(aten.mm.default, (v, w)),))
    z.name = "z"
    if late_start:
        start, wait = collective()
    start.name, wait.name = "start", "wait"
    out = g.call_function(aten.add.Tensor, (g.call_function(aten.mul.Tensor, (wait, 2)), z))
    g.output((out, g.call_function(operator.getitem, ((z,), 0))))
    return torch.fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("late_start", [False, True])
def test_the_collective_starts_early_and_its_wait_comes_before_its_first_reader(late_start):
    gm = _graph(late_start)
    assert schedule_collectives(gm) >= 1
    order = _names(gm)
    assert order.index("start") == order.index("y") + 1  # right after its input
    assert order.index("z") < order.index("wait") < order.index("mul_tensor")
    assert order.index("wait") == order.index("mul_tensor") - 1


def test_collectives_keep_their_order_and_a_graph_without_them_is_untouched():
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    s1 = g.call_function(
        c10d.all_reduce.default, (g.call_function(aten.cos.default, (a,)), "sum", "0")
    )
    s2 = g.call_function(c10d.all_reduce.default, (b, "sum", "0"))  # its input exists first
    w1 = g.call_function(c10d.wait_tensor.default, (s1,))
    w2 = g.call_function(c10d.wait_tensor.default, (s2,))
    g.output((w1, w2))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    schedule_collectives(gm)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert nodes.index(s1) < nodes.index(s2)  # never above the earlier collective

    plain = torch.fx.symbolic_trace(lambda x: x.sin() + 1)
    before = plain.code
    assert schedule_collectives(plain) == 0 and plain.code == before
