"""Partitioners: max-flow correctness, what min-cut saves and recomputes, contract of the split."""

import itertools
import random

import pytest
import torch
from models import Block, GeluMLP

from kiln_aot import config, min_cut_partition, save_all_partition
from kiln_aot.joint import trace_joint
from kiln_aot.module_state import state_names, state_tensors, swapped_state
from kiln_aot.partition import saved_bytes
from kiln_aot.partition.graph_split import placeholders, tangent_dependent
from kiln_aot.partition.maxflow import INF, FlowNetwork

aten = torch.ops.aten


def _brute_force_min_cut(n, edges, s, t):
    best = INF
    others = [v for v in range(n) if v not in (s, t)]
    for bits in itertools.product([0, 1], repeat=len(others)):
        side = {s} | {v for v, b in zip(others, bits) if b}
        best = min(best, sum(c for u, v, c in edges if u in side and v not in side))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_max_flow_equals_brute_force_min_cut(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    edges = [
        (u, v, rng.choice([1, 2, 5, 9, INF]))
        for u in range(n)
        for v in range(n)
        if u != v and rng.random() < 0.35
    ]
    net = FlowNetwork()
    for v in range(n):
        net.node(v)
    for u, v, c in edges:
        net.add_edge(u, v, c)
    value, side = net.min_cut(0, n - 1)
    expected = _brute_force_min_cut(n, edges, 0, n - 1)
    assert min(value, INF) == min(expected, INF)
    if value < INF:
        assert 0 in side and n - 1 not in side
        assert sum(c for u, v, c in edges if u in side and v not in side) == value


def _joint(model, x):
    names = state_names(model)

    def flat_fn(*flat):
        with swapped_state(model, names, flat[: len(names)]):
            return model(*flat[len(names) :])

    flat = [*state_tensors(model, names), x]
    return trace_joint(flat_fn, flat, [a.requires_grad for a in flat])


def test_min_cut_saves_fewer_bytes_than_save_all_on_a_gelu_mlp():
    joint, info = _joint(GeluMLP(32, 128), torch.randn(16, 32))
    fw_a, _ = save_all_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    fw_m, bw_m = min_cut_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    saved_all = _saved_nodes(fw_a, info.num_fwd_outputs)
    saved_min = _saved_nodes(fw_m, info.num_fwd_outputs)
    assert saved_bytes(saved_min) < saved_bytes(saved_all)
    # the GELU is recomputed from its input; the matmuls are not
    targets = {n.target for n in bw_m.graph.nodes if n.op == "call_function"}
    assert aten.erf.default in targets


def _saved_nodes(fw, num_fwd_outputs):
    return list(fw.graph.output_node().args[0][num_fwd_outputs:])


def test_recomputation_comes_just_before_its_first_use_in_the_backward():
    # four GELU MLPs in a row: the backward runs them last to first, and recomputes each
    # GELU (erf) from the saved matmul output just before that layer's gradient, not all
    # four at its start (which would keep every layer's recomputed activation alive)
    model = torch.nn.Sequential(*[GeluMLP(16, 64) for _ in range(4)])
    joint, info = _joint(model, torch.randn(8, 16))
    _, bw = min_cut_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    nodes = list(bw.graph.nodes)
    # per layer: the recomputed GELU's erf and its gradient's, both from the saved input
    erfs = [k for k, n in enumerate(nodes) if n.target == aten.erf.default]
    mms = [k for k, n in enumerate(nodes) if n.target == aten.mm.default]
    assert len(erfs) == 8
    # between consecutive recomputed GELUs lie the matmuls of a layer's gradient
    for a, b in zip(erfs, erfs[1:]):
        assert any(a < k < b for k in mms)
    for k in erfs:  # each one is used soon after it is computed
        first_use = min(nodes.index(u) for u in nodes[k].users)
        assert first_use - k < 15


def test_min_cut_never_recomputes_matmuls_or_large_reductions():
    joint, info = _joint(Block(32, 4, 0.0).train(), torch.randn(2, 16, 32))
    fw, bw = min_cut_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    backward = tangent_dependent(joint.graph)
    forward_names = {
        n.name for n in joint.graph.nodes if n not in backward and n.op == "call_function"
    }
    for n in bw.graph.nodes:
        if n.op == "call_function" and n.name in forward_names:  # recomputed forward node
            assert n.target not in (aten.mm.default, aten.bmm.default, aten.convolution.default)
            if n.target in (aten.sum.dim_IntList, aten.amax.default):
                assert n.args[0].meta["val"].numel() <= config.current().recompute_reduction_numel


def test_reduction_recompute_threshold_is_configurable():
    joint, info = _joint(Block(32, 4, 0.0).train(), torch.randn(2, 16, 32))
    with config.override(recompute_reduction_numel=0):
        fw0, _ = min_cut_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    with config.override(recompute_reduction_numel=10**9):
        fw1, _ = min_cut_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    b0 = saved_bytes(_saved_nodes(fw0, info.num_fwd_outputs))
    b1 = saved_bytes(_saved_nodes(fw1, info.num_fwd_outputs))
    assert b1 <= b0


@pytest.mark.parametrize("partition_fn", [min_cut_partition, save_all_partition])
def test_split_contract(partition_fn):
    joint, info = _joint(GeluMLP(8, 16), torch.randn(4, 8, requires_grad=True))
    fw, bw = partition_fn(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    n_saved = len(fw.graph.output_node().args[0]) - info.num_fwd_outputs
    bw_inputs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    assert [n.name for n in placeholders(fw.graph, "primals")] == [
        n.name for n in placeholders(joint.graph, "primals")
    ]
    assert len(bw_inputs) == n_saved + len(placeholders(joint.graph, "tangents"))
    assert all(n.name.startswith(("saved_", "tangents")) for n in bw_inputs)
    assert len(bw.graph.output_node().args[0]) == len(info.grad_inputs)
    # running fw then bw reproduces the joint graph's outputs
    args = [torch.randn(n.meta["val"].shape) for n in placeholders(joint.graph, "primals")]
    tangents = [torch.randn(n.meta["val"].shape) for n in placeholders(joint.graph, "tangents")]
    expected = joint(*args, *tangents)
    fw_out = fw(*args)
    grads = bw(*fw_out[info.num_fwd_outputs :], *tangents)
    for a, b in zip([*fw_out[: info.num_fwd_outputs], *grads], expected):
        torch.testing.assert_close(a, b)


def test_relu_saves_a_boolean_mask_not_its_float_output():
    def f(x, w):
        return torch.relu(x @ w).sum(-1)

    x, w = torch.randn(8, 16), torch.randn(16, 32, requires_grad=True)
    joint, info = trace_joint(f, [x, w], [False, True])
    fw, _ = min_cut_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    saved = _saved_nodes(fw, info.num_fwd_outputs)
    dtypes = sorted(str(n.meta["val"].dtype) for n in saved)
    assert "torch.bool" in dtypes


def test_dropout_mask_is_saved_as_one_byte_per_element():
    def f(x, w):
        return torch.nn.functional.dropout(x @ w, 0.5, training=True).sum(-1)

    x, w = torch.randn(8, 16), torch.randn(16, 32, requires_grad=True)
    joint, info = trace_joint(f, [x, w], [False, True])
    fw, bw = min_cut_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    saved = _saved_nodes(fw, info.num_fwd_outputs)
    assert [str(n.meta["val"].dtype) for n in saved if n.meta["val"].shape == (8, 32)] == [
        "torch.bool"
    ]
    assert not any(n.target is aten.bernoulli.p for n in bw.graph.nodes)


def test_partition_summary_reports_saved_bytes_and_recomputed_ops():
    from kiln_aot.partition.graph_split import split_with_saved
    from kiln_aot.partition.min_cut import choose_saved, partition_summary

    joint, info = _joint(GeluMLP(32, 128), torch.randn(16, 32))
    saved = choose_saved(joint, info.num_fwd_outputs)
    _, bw = split_with_saved(joint, saved, info.num_fwd_outputs)
    text = partition_summary(saved, bw)
    mb = saved_bytes(saved) / 2**20
    assert f"saves {len(saved)} tensors ({mb:.2f} MB)" in text, text
    recomputed = int(text.split("recomputes ")[1].split()[0])
    assert recomputed >= 1  # the GELU (erf and its pointwise ops) is recomputed


@pytest.mark.parametrize("tagged", [False, True])
def test_recompute_in_backward_tag_recomputes_what_the_cut_would_save(tagged):
    # ``big`` (a matmul of the primal ``w``: never recomputed by default) is what the
    # backward of ``x @ big`` reads; tagged recompute_in_backward (kiln_aot.annotate, as
    # kiln's FSDP graph tags a parameter's all-gather), the forward saves ``w`` instead
    # and the backward computes ``big`` again
    import contextlib

    from kiln_aot import annotate

    def fn(w, x):
        scope = annotate(recompute_in_backward=True) if tagged else contextlib.nullcontext()
        with scope:
            big = torch.mm(w, w)
        return (x @ big).relu()

    w, x = torch.randn(32, 32, requires_grad=True), torch.randn(8, 32, requires_grad=True)
    joint, info = trace_joint(fn, [w, x], [True, True])
    fw, bw = min_cut_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
    saved = _saved_nodes(fw, info.num_fwd_outputs)
    saved_mm = [n for n in saved if n.target == aten.mm.default]
    bw_mms = [n for n in bw.graph.nodes if n.meta.get("recompute_in_backward")]
    if tagged:
        assert not saved_mm and [n.target for n in bw_mms] == [aten.mm.default]
    else:
        assert len(saved_mm) == 1 and not bw_mms
    with annotate(recompute_in_backward=True):  # outside a trace: nothing happens
        torch.testing.assert_close(fn(w, x), (x @ (w @ w)).relu())


def test_recompute_in_backward_false_saves_what_the_cut_would_recompute():
    # ``b`` (a copy of the primal ``w``: cheap, recomputed by default) feeds the pointwise
    # ``x * b`` whose backward reads it; tagged recompute_in_backward=False (as kiln's FSDP
    # graph tags a small parameter's copy out of its unit's gathered buffer) it is saved,
    # and the backward recomputes nothing from ``w``
    import contextlib

    from kiln_aot import annotate

    def fn(w, x, tagged):
        scope = annotate(recompute_in_backward=False) if tagged else contextlib.nullcontext()
        with scope:
            b = torch.clone(w * 2)
        return (x * b).sin()

    w, x = torch.randn(64, requires_grad=True), torch.randn(8, 64, requires_grad=True)
    for tagged in (False, True):
        joint, info = trace_joint(lambda w, x, t=tagged: fn(w, x, t), [w, x], [True, True])
        fw, bw = min_cut_partition(joint, None, num_fwd_outputs=info.num_fwd_outputs)
        saved = _saved_nodes(fw, info.num_fwd_outputs)
        clones = [n for n in saved if n.target == aten.clone.default]
        assert bool(clones) == tagged, saved
        recomputed = [n for n in bw.graph.nodes if n.target == aten.clone.default]
        assert bool(recomputed) != tagged, bw.graph
