"""passes/collectives.py: a collective moves up to just after its input (never above an
earlier collective) and its wait down to just before its first reader, so the work
between them overlaps the communication. Graphs are built by hand (no process group is
needed to reorder them)."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx

from kiln_inductor.passes.collectives import is_collective, is_wait, schedule_collectives

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


def _layers(n: int, grouped: bool = True) -> torch.fx.GraphModule:
    """``n`` layers ``h = relu(h @ t(gather(shard_k)))`` (FSDP's forward), each shard's
    all-gather and its wait where capture leaves them (the graph's start), the gathered
    weight transposed there too, each all-gather tagged with its layer's group; then each
    layer's weight gradient reduce-scattered (tagged ``("rs", k)``) and only returned."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    shards = [g.placeholder(f"shard{k}") for k in range(n)]
    weights = []
    for k, shard in enumerate(shards):
        start = g.call_function(c10d.all_gather_into_tensor.default, (shard, 2, "0"))
        start.name = f"ag{k}"
        wait = g.call_function(c10d.wait_tensor.default, (start,))
        wait.name = f"wait{k}"
        t = g.call_function(aten.permute.default, (wait, [1, 0]))
        t.name = f"t{k}"
        if grouped:
            start.meta["collective_group"] = ("all_gather", k)
        weights.append(t)
    h, grads = x, []
    for k, t in enumerate(weights):
        mm = g.call_function(aten.mm.default, (h, t))
        mm.name = f"mm{k}"
        h = g.call_function(aten.relu.default, (mm,))
        grad = g.call_function(
            aten.mm.default, (g.call_function(aten.permute.default, (h, [1, 0])), x)
        )
        rs = g.call_function(c10d.reduce_scatter_tensor.default, (grad, "avg", 2, "0"))
        rs.name = f"rs{k}"
        if grouped:
            rs.meta["collective_group"] = ("rs", k)
        done = g.call_function(c10d.wait_tensor.default, (rs,))
        done.name = f"done{k}"
        grads.append(done)
    g.output((h, *grads))
    return torch.fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("prefetch", [0, 1, 2, -1])
def test_grouped_all_gathers_start_at_most_prefetch_groups_ahead(prefetch):
    gm = _layers(5)
    schedule_collectives(gm, prefetch=prefetch)
    order = _names(gm)
    for k in range(5):
        # each transpose (a view) just before its matmul, the wait before it
        assert order.index(f"wait{k}") < order.index(f"t{k}") == order.index(f"mm{k}") - 1
        if prefetch < 0 or k < prefetch:
            assert order.index(f"ag{k}") < order.index("wait0"), order  # at the start
        elif prefetch == 0:  # just before its own wait: nothing in flight under a matmul
            assert order.index(f"ag{k}") + 1 == order.index(f"wait{k}"), order
        else:  # as the layer `prefetch` uses earlier is waited on (then computes)
            assert order.index(f"ag{k}") == order.index(f"wait{k - prefetch}") + 1, order
        if k and prefetch != 0:
            # the layer's gather is in flight while an earlier layer's matmul runs
            assert order.index(f"ag{k}") < order.index(f"mm{k - 1}"), order


def test_grouped_reduce_scatters_keep_one_group_in_flight():
    gm = _layers(4)
    schedule_collectives(gm, prefetch=1)
    order = _names(gm)
    for k in range(4):
        # issued once its gradient exists, under the next layer's matmul
        assert order.index(f"rs{k}") < (order.index(f"mm{k + 1}") if k < 3 else len(order))
        if k < 3:  # waited on before the next one starts (only the output reads it)
            assert order.index(f"done{k}") + 1 == order.index(f"rs{k + 1}"), order


def test_ungrouped_collectives_start_after_their_inputs_as_before():
    gm = _layers(3, grouped=False)
    schedule_collectives(gm)
    order = _names(gm)
    assert [order.index(f"ag{k}") for k in range(3)] == [0, 1, 2]  # all at the start
    assert all(order.index(f"done{k}") > order.index("mm2") for k in range(3))  # at the end


def _in_flight_counts(gm: torch.fx.GraphModule) -> list[int]:
    """How many collectives are issued and not yet waited on, after each node."""
    flying, counts = set(), []
    for n in gm.graph.nodes:
        if is_wait(n):
            flying.discard(n.args[0])
        elif is_collective(n):
            flying.add(n)
        counts.append(len(flying))
    return counts


def _on(gm: torch.fx.GraphModule, device: str) -> torch.fx.GraphModule:
    """``gm`` with each collective's value recorded on ``device`` (as capture records it)."""
    for n in gm.graph.nodes:
        if is_collective(n):
            n.meta["val"] = torch.empty(4, device=device)
    return gm


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("grouped", [False, True])
def test_cpu_collectives_run_one_at_a_time(device, grouped):
    """gloo (CPU tensors): each collective is waited on before the next starts, so two
    never run at once (torch 2.13's gloo corrupts its heap with several in flight; the
    pass's docstring); the last one still overlaps the matmuls after it. Collectives on
    another device keep several in flight."""
    gm = _on(_layers(3, grouped=grouped), device)
    schedule_collectives(gm, prefetch=1)
    order, counts = _names(gm), _in_flight_counts(gm)
    if device == "cpu":
        assert max(counts) == 1, order
        flying_at = [counts[k] for k, n in enumerate(gm.graph.nodes) if n.name.startswith("mm")]
        assert any(flying_at), order  # communication still under some matmul
    else:
        assert max(counts) >= 2, order


@pytest.mark.parametrize("most", [0, 2])
def test_the_cpu_bound_is_a_setting(monkeypatch, most):
    """KILN_CPU_COLLECTIVES_IN_FLIGHT: 2 lets two CPU collectives run at once, 0 any number
    (the schedule's own)."""
    monkeypatch.setenv("KILN_CPU_COLLECTIVES_IN_FLIGHT", str(most))
    gm = _on(_layers(3, grouped=False), "cpu")
    schedule_collectives(gm, prefetch=1)
    counts = _in_flight_counts(gm)
    assert max(counts) == 2 if most == 2 else max(counts) > 2, _names(gm)


def test_copies_out_of_a_result_move_down_with_its_wait():
    """A coalesced all-gather's parameters are copies out of its buffer (not views): they
    sink to just before their readers, so the wait does too and the work between overlaps
    the gather."""
    g = torch.fx.Graph()
    shard, x, w = (g.placeholder(n) for n in ("shard", "x", "w"))
    start = g.call_function(c10d.all_gather_into_tensor.default, (shard, 2, "0"))
    wait = g.call_function(c10d.wait_tensor.default, (start,))
    part = g.call_function(
        aten.slice.Tensor, (g.call_function(aten.view.default, (wait, [2, -1])), 1, 0, 4)
    )
    copy = g.call_function(aten.clone.default, (part,))
    other = g.call_function(aten.mm.default, (x, w))  # independent of the gather
    out = g.call_function(aten.add.Tensor, (other, copy))
    for n, name in (
        (start, "start"),
        (wait, "wait"),
        (copy, "copy"),
        (other, "other"),
        (out, "out"),
    ):
        n.name = name
    g.output((out,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    schedule_collectives(gm)
    order = _names(gm)
    assert order.index("start") < order.index("other") < order.index("wait"), order
    assert order.index("copy") == order.index("out") - 1, order


def test_the_ops_packing_a_collectives_input_move_with_it():
    """A coalesced all-gather's input is its unit's shards flattened into one buffer (views
    and a cat of graph inputs): recorded just before the unit's first use, the packing
    moves up with the gather (one unit ahead of the group's first use, here the start),
    not the gather alone, which the cat would hold at its place."""
    g = torch.fx.Graph()
    x, w, s1, s2 = (g.placeholder(n) for n in ("x", "w", "s1", "s2"))
    h = g.call_function(aten.mm.default, (x, w))
    h.name = "h"
    flat = [g.call_function(aten.view.default, (s, [-1])) for s in (s1, s2)]
    cat = g.call_function(aten.cat.default, (flat,))
    cat.name = "cat"
    start = g.call_function(c10d.all_gather_into_tensor.default, (cat, 2, "0"))
    wait = g.call_function(c10d.wait_tensor.default, (start,))
    start.name, wait.name = "start", "wait"
    start.meta["collective_group"] = ("all_gather", 1)
    out = g.call_function(aten.add.Tensor, (h, g.call_function(aten.sum.default, (wait,))))
    g.output((out,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    schedule_collectives(gm, prefetch=1)
    order = _names(gm)
    assert order.index("cat") == order.index("start") - 1, order
    assert order.index("start") < order.index("h") < order.index("wait"), order


def test_a_gradient_split_out_of_a_coalesced_reduce_scatter_is_only_returned():
    """Units' reduce-scatters whose results the graph only returns, split into their
    parameters' gradients (slices and views of each result): no prefetch groups to fetch
    ahead of, so each starts after its input, not held behind the later units' work."""
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    outs, h = [], x
    for unit in (0, 1):
        grad = g.call_function(aten.mm.default, (h, w))
        start = g.call_function(c10d.reduce_scatter_tensor.default, (grad, "avg", 2, "0"))
        wait = g.call_function(c10d.wait_tensor.default, (start,))
        start.meta["collective_group"] = ("reduce_scatter", unit)
        h = g.call_function(aten.mm.default, (grad, w))  # the next unit's backward
        grad.name, start.name, wait.name, h.name = (
            f"{n}{unit}" for n in ("grad", "rs", "wait", "h")
        )
        parts = [g.call_function(aten.slice.Tensor, (wait, 0, k, k + 1)) for k in (0, 1)]
        outs += [g.call_function(aten.view.default, (p, [-1])) for p in parts]
    g.output((*outs, h))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    schedule_collectives(gm, prefetch=1)
    order = _names(gm)
    assert order.index("rs0") == order.index("grad0") + 1, order
    # the second waits for the first (one group of an op in flight), not for the end
    assert order.index("grad1") < order.index("wait0") < order.index("rs1"), order
    assert order.index("rs1") < order.index("h1"), order
