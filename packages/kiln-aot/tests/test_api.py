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
    assert len(compiler.graphs) == 2  # forward and backward
    out = fn(x)
    out.pow(2).sum().backward()
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
        return torch.nonzero(x)

    gm = torch.fx.symbolic_trace(f)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.meta["stack_trace"] = (
                '  File "/models/net.py", line 42, in forward\n    y = torch.nonzero(x)\n'
            )
    with pytest.raises(Unsupported) as e:
        aot_graph(gm, [torch.randn(4)], fw_compiler=compiler)
    assert "nonzero" in str(e.value.op)
    assert e.value.where == "/models/net.py:42   y = torch.nonzero(x)"


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
