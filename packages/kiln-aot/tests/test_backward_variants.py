"""The backward compiles on its first call, for the tangent strides that arrive
(backward_variants.py, "Lazy compilation"), or with the forward for a compiler that asks;
its state round-trips through plain data (graph_data.py) and compiles again there."""

from __future__ import annotations

import operator
import pickle

import pytest
import torch
from kiln_aot_testing import RecordingCompiler, assert_close

from kiln_aot import aot_function, aot_graph, reset_tangent_copies, tangent_copies
from kiln_aot.backward_variants import BackwardVariants
from kiln_aot.graph_data import graph_data, graph_from_data


def _block(x, w, b):
    h = torch.nn.functional.gelu(x @ w + b)
    return h.softmax(-1) * h


def _inputs():
    return [torch.randn(6, 8, requires_grad=True), torch.randn(8, 5, requires_grad=True),
            torch.randn(5, requires_grad=True)]  # fmt: skip


def _grads(fn, inputs, loss):
    for t in inputs:
        t.grad = None
    loss(fn(*inputs)).backward()
    out = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    return out


def _roles(compiler: RecordingCompiler) -> list[str]:
    return [g.meta.get("kiln_aot_training", {}).get("role", "?") for g in compiler.graphs]


def test_backward_compiles_on_first_call_for_the_strides_that_arrive(compiler):
    inputs = _inputs()
    fn = aot_graph(_block, inputs, fw_compiler=compiler, bw_compiler=compiler)
    assert _roles(compiler) == ["forward"]  # no backward yet
    reset_tangent_copies()
    for _ in range(2):  # the expanded ones of .sum(): compiled once, for stride 0
        for g, e in zip(
            _grads(fn, inputs, lambda y: y.sum()), _grads(_block, inputs, lambda y: y.sum())
        ):
            assert_close(g, e)
    assert _roles(compiler) == ["forward", "backward"]
    (tangent,) = [n for n in compiler.graphs[1].graph.nodes if n.op == "placeholder"][-1:]
    assert tangent.meta["val"].stride() == (0, 0)
    square = lambda y: (y * y).sum()
    for g, e in zip(_grads(fn, inputs, square), _grads(_block, inputs, square)):
        assert_close(g, e)
    assert _roles(compiler) == ["forward", "backward", "backward"]  # the traced strides
    assert tangent_copies() == {}


def test_a_compiler_that_asks_gets_its_backward_with_the_forward(compiler):
    compiler.kiln_eager_backward = True
    inputs = _inputs()
    fn = aot_graph(_block, inputs, fw_compiler=compiler, bw_compiler=compiler)
    assert _roles(compiler) == ["forward", "backward"]
    loss = lambda y: (y * y).sum()
    for g, e in zip(_grads(fn, inputs, loss), _grads(_block, inputs, loss)):
        assert_close(g, e)
    assert len(compiler.graphs) == 2


def _plain(v) -> bool:
    if isinstance(v, (tuple, list)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return v is None or type(v) in (str, int, float, bool)


def test_state_round_trips_through_plain_data_and_compiles_new_strides(compiler):
    inputs = _inputs()
    fn = aot_function(_block, compiler)
    sums = _grads(fn, inputs, lambda y: y.sum())
    (bw,) = [g for g in compiler.graphs if g.meta["kiln_aot_training"]["role"] == "backward"]
    variants = _variants_of(fn)
    data, compiled = variants.state()
    assert _plain(data) and compiled == [bw]
    data = pickle.loads(pickle.dumps(data))
    restored = BackwardVariants.restore(data, compiled)
    assert restored.compiler is None and list(restored.variants) == list(variants.variants)
    # the graph as it was: same nodes, targets, values
    rebuilt = restored.gm
    assert [n.name for n in rebuilt.graph.nodes] == [n.name for n in variants.gm.graph.nodes]
    for a, b in zip(rebuilt.graph.nodes, variants.gm.graph.nodes):
        assert a.target == b.target or a.op != "call_function"
        va, vb = a.meta.get("val"), b.meta.get("val")
        if isinstance(vb, torch.Tensor):
            assert (va.shape, va.stride(), va.dtype, va.device) == (
                vb.shape,
                vb.stride(),
                vb.dtype,
                vb.device,
            )
    # a new compiler compiles the traced strides from the restored graph: same gradients
    again = RecordingCompiler()
    restored.compiler = again
    tangents = [torch.randn(6, 5)]
    bw_fn, given = restored.backward_for(tangents)
    assert given is tangents and len(again.graphs) == 1
    saved = _saved_for(fn, inputs)
    assert_close(list(bw_fn(*saved, *tangents)), list(variants.compile_traced()(*saved, *tangents)))
    assert sums  # the first backward ran


def _plan_of(fn):
    """The training plan of ``aot_function``'s result ``fn``."""
    compiled = [c.cell_contents for c in fn.__closure__ if hasattr(c.cell_contents, "plans")][0]
    (plan,) = [p for p in compiled.plans.values() if getattr(p, "variants", None) is not None]
    return plan


def _variants_of(fn) -> BackwardVariants:
    return _plan_of(fn).variants


def _saved_for(fn, inputs) -> list:
    """The saved values the forward hands the backward, for ``inputs``."""
    plan = _plan_of(fn)
    with torch.no_grad():
        outs = plan.fw(*inputs)
    return list(outs[plan.num_fwd_outputs :])


def test_graph_data_names_targets_and_refuses_what_it_cannot_say():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.split.Tensor, (x, 2))
    g.output((g.call_function(operator.getitem, (y, 0)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    data = graph_data(gm)
    assert _plain(data)
    back = graph_from_data(data)
    t = torch.randn(4, 3)
    assert_close(back(t)[0], gm(t)[0])
    # a target that is no op or operator.getitem is not kept
    g.call_function(torch.sin, (x,))
    assert graph_data(torch.fx.GraphModule(torch.nn.Module(), g)) is None
    # data naming something else is refused, not looked up
    bad = {**data, "nodes": [*data["nodes"]]}
    op, name, _, args, kwargs, val, meta = bad["nodes"][1]
    bad["nodes"][1] = (op, name, ("operator", "system"), args, kwargs, val, meta)
    with pytest.raises(ValueError):
        graph_from_data(bad)


def test_backward_compiled_for_the_strides_the_forward_saves(compiler):
    # a forward whose library ops return channels-last values (kiln-inductor's depthwise
    # convolutions on CPU) where the trace said NCHW: the backward reads them as they come
    def forward_compiler(gm, example_inputs):
        compiler(gm, example_inputs)

        def run(*args):
            outs = gm(*args)
            cl = torch.channels_last
            return tuple(o.contiguous(memory_format=cl) if o.dim() == 4 else o for o in outs)

        return run

    def f(x):
        h = x.sin()
        return h * h

    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    fn = aot_graph(f, [x], fw_compiler=forward_compiler, bw_compiler=compiler)
    got = _grads(fn, [x], lambda y: (y * y).sum())
    assert_close(got[0], _grads(f, [x], lambda y: (y * y).sum())[0])
    saved = [n for n in compiler.graphs[-1].graph.nodes if n.op == "placeholder"][:-1]
    assert saved and all(
        n.meta["val"].is_contiguous(memory_format=torch.channels_last) for n in saved
    )
