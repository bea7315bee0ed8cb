import pytest
import torch
from kiln_aot_testing import assert_close, grads_of

import kiln_aot
from kiln_aot import aot_function, aot_graph, aot_module


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.l2(torch.nn.functional.gelu(self.l1(x)))


def test_aot_graph_inference_on_a_symbolically_traced_module(compiler):
    m = MLP()
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(4, 16)
    with torch.no_grad():
        fn = aot_graph(gm, [x], fw_compiler=compiler)
        assert len(compiler.graphs) == 1  # forward only
        assert_close(fn(x), gm(x))


def test_aot_graph_training_params_as_get_attr(compiler):
    m = MLP()
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(4, 16, requires_grad=True)
    fn = aot_graph(gm, [x], fw_compiler=compiler)
    assert len(compiler.graphs) == 1  # the forward; the backward compiles on its first call
    out = fn(x)
    out.pow(2).sum().backward()
    assert len(compiler.graphs) == 2
    got = grads_of([x, *m.parameters()])
    x.grad = None
    m.zero_grad()
    gm(x).pow(2).sum().backward()
    for a, b in zip(got, grads_of([x, *m.parameters()])):
        assert_close(a, b)


def test_aot_graph_with_parameters_as_graph_inputs(compiler):
    def f(x, w, b):
        return (torch.tanh(x @ w.t() + b),)

    x = torch.randn(3, 5, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    fn = aot_graph(f, [x, w, b], fw_compiler=compiler, bw_compiler=compiler)
    (out,) = fn(x, w, b)
    out.sum().backward()
    got = grads_of([x, w, b])
    for t in (x, w, b):
        t.grad = None
    f(x, w, b)[0].sum().backward()
    for a, e in zip(got, grads_of([x, w, b])):
        assert_close(a, e)


def test_no_grad_at_call_time_uses_a_forward_only_graph(compiler):
    m = MLP()
    cm = aot_module(m, compiler)
    x = torch.randn(4, 16)
    cm(x).sum().backward()  # parameters require grad: training graphs
    n_training = len(compiler.graphs)
    with torch.no_grad():
        out = cm(x)
    assert len(compiler.graphs) == n_training + 1
    assert not out.requires_grad
    assert_close(out, m(x))


def test_aot_function_pytree_inputs_and_outputs(compiler):
    def f(d, k):
        return {"y": d["a"] * k + d["b"], "n": k}

    a, b = torch.randn(3, requires_grad=True), torch.randn(3)
    cf = aot_function(f, compiler)
    out = cf({"a": a, "b": b}, 3)
    assert out["n"] == 3
    assert_close(out["y"], a * 3 + b)
    out["y"].sum().backward()
    assert_close(a.grad, torch.full((3,), 3.0))


def test_public_names():
    for name in (
        "trace",
        "aot_graph",
        "aot_function",
        "aot_module",
        "min_cut_partition",
        "save_all_partition",
        "CORE_ATEN_OPS",
        "KEPT_OPS",
        "Unsupported",
    ):
        assert hasattr(kiln_aot, name)
    assert isinstance(kiln_aot.CORE_ATEN_OPS, frozenset)


def test_runs_as_a_backend_under_torch_compile_capture(compiler):
    """DESIGN.md: kiln's compiler also runs under torch's own capture (torch.compile is the
    graph producer here; the result is compared with eager)."""
    import copy

    from models import ConvBNReLU

    model = ConvBNReLU()
    ref = copy.deepcopy(model)

    def backend(gm, example_inputs):
        return aot_graph(gm, example_inputs, fw_compiler=compiler)

    x = torch.randn(2, 3, 8, 8)
    out = torch.compile(model, backend=backend)(x)
    expected = ref(x)
    assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert_close(a.grad, b.grad)
    for a, b in zip(model.buffers(), ref.buffers()):
        assert_close(a.float(), b.float())


def test_debug_dir_gets_one_file_per_stage(compiler, tmp_path):
    from kiln_aot import config

    with config.override(debug_dir=str(tmp_path)):
        cf = aot_function(lambda x: torch.nn.functional.gelu(x) * 2, compiler)
        cf(torch.randn(4, requires_grad=True)).sum().backward()
        with torch.no_grad():
            cf(torch.randn(4))
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert files == [
        "aot.bw.py",
        "aot.fw.py",
        "aot.inference.py",
        "aot.joint.py",
        "aot.partition.txt",
    ]
    report = next(tmp_path.rglob("aot.partition.txt")).read_text()
    assert report.startswith("saved ")


def test_unsupported_points_at_the_captured_source_line(compiler):
    """A capture layer sets ``meta["stack_trace"]``; errors quote that line."""
    from kiln_aot import Unsupported

    def f(x):
        return torch.bincount(x)  # its output's length is the data's maximum

    gm = torch.fx.symbolic_trace(f)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.meta["stack_trace"] = (
                '  File "/models/net.py", line 42, in forward\n    y = torch.bincount(x)\n'
            )
    with pytest.raises(Unsupported) as e:
        aot_graph(gm, [torch.arange(4)], fw_compiler=compiler)
    assert "bincount" in str(e.value.op)
    assert e.value.where == "/models/net.py:42   y = torch.bincount(x)"


def test_aten_nodes_keep_the_torch_level_stack_trace(compiler):
    def f(x):
        return torch.nn.functional.gelu(x)

    gm = torch.fx.symbolic_trace(f)
    st = '  File "/models/net.py", line 7, in forward\n    return F.gelu(x)\n'
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.meta["stack_trace"] = st
    with torch.no_grad():
        aot_graph(gm, [torch.randn(3)], fw_compiler=compiler)
    (aten_gm,) = compiler.graphs
    assert all(
        n.meta.get("stack_trace") == st for n in aten_gm.graph.nodes if n.op == "call_function"
    )


def _affine(x, w, b):
    return (torch.tanh(x @ w + b),)


def test_guarded_call_runs_the_example_plan_without_recompiling(compiler):
    x, w, b = torch.randn(3, 5), torch.randn(5, 4, requires_grad=True), torch.randn(4)
    fn = aot_graph(_affine, [x, w, b], fw_compiler=compiler, bw_compiler=compiler)
    fast = fn.kiln_guarded_call
    n = len(compiler.graphs)  # the forward (the backward compiles on its first call)
    for _ in range(2):
        x = torch.randn(3, 5)
        (out,) = fast(x, w, b)
        assert_close(out, _affine(x, w, b)[0])
        out.sum().backward()
        got = w.grad
        w.grad = None
        _affine(x, w, b)[0].sum().backward()
        assert_close(got, w.grad)
        w.grad = None
    # the one more graph is the backward for the expanded ones tangent of ``.sum()``
    # (backward_variants.py), compiled on the first backward and reused on the second;
    # none is compiled for the traced strides, which never come
    assert len(compiler.graphs) == n + 1


def test_guarded_call_takes_the_checked_path_when_grad_mode_differs(compiler):
    x, w, b = torch.randn(3, 5), torch.randn(5, 4, requires_grad=True), torch.randn(4)
    fn = aot_graph(_affine, [x, w, b], fw_compiler=compiler, bw_compiler=compiler)
    n = len(compiler.graphs)
    with torch.no_grad():
        (out,) = fn.kiln_guarded_call(x, w, b)
    assert not out.requires_grad
    assert len(compiler.graphs) == n + 1  # the forward-only plan, compiled now
    assert_close(out, _affine(x, w, b)[0].detach())


def _view_of_input(x):
    return x.view(2, 3), x.sin()


def test_guarded_call_rebuilds_alias_outputs_of_a_shifted_input(compiler):
    base = torch.randn(10)
    with torch.no_grad():
        fn = aot_graph(_view_of_input, [base[:6]], fw_compiler=compiler)
        other = base[4:]  # same size and stride, another storage offset
        view, s = fn.kiln_guarded_call(other)
    assert view.storage_offset() == 4 and view.untyped_storage().data_ptr() == (
        base.untyped_storage().data_ptr()
    )
    assert_close(view, other.view(2, 3))
    assert_close(s, other.sin())


def _write_first(a, b):
    a.add_(1)
    return (b * 2,)


def test_guarded_call_runs_eagerly_when_a_written_input_shares_storage(compiler):
    a, b = torch.randn(3), torch.randn(3)
    with torch.no_grad():
        fn = aot_graph(_write_first, [a, b], fw_compiler=compiler)
        x = torch.randn(3)
        y = x.clone()
        with pytest.warns(UserWarning, match="running eagerly"):
            (out,) = fn.kiln_guarded_call(x, x)
    expected = _write_first(y, y)
    assert_close(out, expected[0])
    assert_close(x, y)


def test_guarded_call_follows_the_training_flag_and_is_absent_with_graph_state(compiler):
    gm = torch.fx.symbolic_trace(lambda x: torch.nn.functional.dropout(x, 0.5, True) * 0 + x)
    x = torch.randn(4)
    with torch.no_grad():
        fn = aot_graph(gm, [x], fw_compiler=compiler)
        assert_close(fn.kiln_guarded_call(x), x)
        n = len(compiler.graphs)
        gm.train(False)  # a new plan key: the guarded call must not run the old plan
        out = fn.kiln_guarded_call(x)
        assert len(compiler.graphs) == n + 1
        assert_close(out, x)
    stateful = aot_graph(torch.fx.symbolic_trace(MLP()), [torch.randn(2, 16)], fw_compiler=compiler)
    assert getattr(stateful, "kiln_guarded_call", None) is None
