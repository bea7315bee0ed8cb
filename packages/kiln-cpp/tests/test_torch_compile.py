"""kiln_cpp.compile_fx as a backend under torch's own capture (DESIGN.md contract 1)."""

from __future__ import annotations

import torch

import kiln_cpp


def test_torch_compile_inference_matches_eager():
    def f(x, y):
        return torch.softmax(x @ y, -1) * torch.sigmoid(x.sum(-1, keepdim=True))

    x, y = torch.randn(8, 16), torch.randn(16, 16)
    compiled = torch.compile(f, backend=kiln_cpp.compile_fx)
    torch.testing.assert_close(compiled(x, y), f(x, y))


def test_torch_compile_module_training_gradients_match_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )
    x = torch.randn(8, 16)
    compiled = torch.compile(model, backend=kiln_cpp.compile_fx)
    loss = compiled(x).square().mean()
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected_loss = model(x).square().mean()
    expected_loss.backward()
    torch.testing.assert_close(loss, expected_loss)
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)


def _compile_recording(fn):
    """torch.compile with kiln-cpp, and the CompiledGraphs it built (their stats)."""
    import kiln_inductor
    from kiln_inductor.compile import compile_aten_graph

    graphs = []

    def record(gm, inputs):
        graphs.append(compile_aten_graph(gm, inputs))
        return graphs[-1]

    def backend(gm, inputs):
        return kiln_inductor.compile_fx(gm, inputs, compile_graph=record)

    return torch.compile(fn, backend=backend), graphs


def _assert_same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, equal_nan=True)


def test_0dim_indices_and_operands_compile_to_kernels():
    """take and bucketize of 0-dim tensors (torch's decompositions took ``.item()``), hypot
    with a 0-dim operand (prims.hypot's meta kernel did not broadcast it): kernels only."""

    def f(x, s, b, i):
        return (
            torch.take(x, i),
            torch.bucketize(s, b),
            torch.bucketize(x, b, right=True, out_int32=True),
            torch.hypot(x, s),
        )

    x = torch.randn(4, 5)
    x[0, :2] = torch.tensor([float("nan"), 0.5])
    inputs = [x, torch.tensor(0.5), torch.tensor([-1.0, 0.0, 0.5, 0.5, 2.0]), torch.tensor(-3)]
    compiled, graphs = _compile_recording(f)
    _assert_same(compiled(*inputs), f(*inputs))
    (graph,) = graphs
    assert graph.stats["kernels"] >= 1 and not graph.stats["fallbacks"], graph.stats


def test_ops_without_a_meta_kernel_run_as_library_calls_in_the_graph():
    """geqrf and the histogram ops (no meta kernel in torch): one graph, the ops around them
    as kernels, each of them a library call inside it."""

    def f(x, b):
        a, tau = torch.geqrf(x.exp())
        hist, edges = torch.histogram(x.flatten() * 2, 4)
        dd, dd_edges = torch.histogramdd(x[:, :2] + 1, [b, b])
        return a.sin(), tau, hist + 1, edges, dd, *dd_edges

    inputs = [torch.randn(6, 3), torch.tensor([-1.0, 0.0, 1.0, 3.0])]
    compiled, graphs = _compile_recording(f)
    _assert_same(compiled(*inputs), f(*inputs))
    (graph,) = graphs
    assert graph.stats["kernels"] >= 1, graph.stats
    assert {
        "aten.geqrf.default",
        "aten.histogram.bin_ct",
        "aten._histogramdd_from_bin_tensors.default",
    } <= set(graph.stats["fallbacks"]), graph.stats
