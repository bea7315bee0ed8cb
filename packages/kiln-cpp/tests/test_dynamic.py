"""Symbolic sizes end to end on the CPU: one compiled graph (one build of each kernel)
serves every size, with kernels taking the sizes as arguments.

The graphs are made as kiln-capture makes them: placeholders whose ``meta["val"]`` has
symbolic sizes of a ``kiln_shapes.ShapeEnv``; the example inputs are real tensors."""

from __future__ import annotations

import re

import pytest
import torch
import torch.fx
from kiln_shapes import ShapeEnv

import kiln_cpp  # noqa: F401  (registers the CPU backend)
import kiln_inductor
from kiln_inductor.testing import CountingCompiler as Counting
from kiln_inductor.testing import check_symbolic_training, symbolic_graph, symbolic_programs

SIZES = [(3, 5), (4, 7), (2, 11), (13, 4), (17, 13), (6, 2)]


def _check_sizes(fn, make_inputs, dynamic, sizes=SIZES, grad=False):
    first = make_inputs(*sizes[0])
    gm, env = symbolic_graph(fn, first, dynamic)
    counting = Counting()
    compiled = kiln_inductor.compile_fx(gm, first, compile_graph=counting)
    for size in sizes:
        inputs = make_inputs(*size)
        got = compiled(*inputs)
        want = fn(*inputs)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # one ATen graph for every size: nothing recompiled
    assert len(counting.graphs) == 1, len(counting.graphs)
    assert "s0" in counting.graphs[0].wrapper_source
    return counting.graphs[0], env


@pytest.mark.parametrize("name", ["norms", "mlp", "views"])
def test_symbolic_programs_one_build_for_every_size(name):
    """Pointwise/softmax/layer_norm over varying dims, an MLP over a varying batch, sizes
    in views, slices, masks and positions (kiln_inductor.testing.symbolic_programs)."""
    program = symbolic_programs()[name]
    _check_sizes(program.fn, program.inputs, program.dims)


def test_reductions_over_a_prime_length_vectorize_with_a_tail():
    def fn(x):
        return x.sum(-1), x.amax(-1), x.var(-1), x.cumsum(-1)

    graph, _ = _check_sizes(
        fn, lambda b, t: (torch.randn(b, t * 37),), [[0, 1]], sizes=[(3, 5), (2, 3), (5, 7)]
    )


def test_values_shared_between_loops_of_symbolic_rows_live_in_scratch_rows_that_fit(
    tmp_path, monkeypatch
):
    """softmax's exp, computed by its sum loop and reused by its normalizing loop: a
    symbolic row keeps it in a stack array when the row fits, else recomputes it; one
    kernel has both versions and picks per call."""
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))

    def fn(x):
        return x.softmax(-1) * 2

    sizes = [(3, 5), (2, 9), (2, 20000 // 37), (3, 17000 // 37)]  # rows of 185..20000
    _check_sizes(fn, lambda b, t: (torch.randn(b, t * 37),), [[0, 1]], sizes=sizes)
    (src,) = [p.read_text() for p in tmp_path.rglob("kernel*.cpp")]
    assert "static int64_t kernel_rows(" in src and "static int64_t kernel_recompute(" in src
    assert "scr0[" in src and ") * 8 <= 131072) return kernel_rows(" in src


def test_training_step_gradients_at_every_size():
    check_symbolic_training(SIZES, {"rtol": 1e-4, "atol": 1e-5})


def test_a_graph_built_with_a_declared_range_refuses_other_sizes_at_capture():
    env = ShapeEnv()
    with pytest.raises(ValueError, match="min <= max"):
        env.symbolic_tensor(torch.randn(4, 8), "L['x']", [0], {0: (8, 2)})


def test_graphs_from_torch_capture_with_dynamic_sizes_compile_per_size():
    """DESIGN.md contract 1: kiln's compiler as a backend of torch's capture. With
    ``dynamic=True`` torch hands a graph with torch's own symbolic sizes and SymInt inputs;
    kiln compiles it for each size it is called with (torch's symbols are not kiln's)."""

    def fn(x, y):
        return (x.sin() * y).softmax(-1) + x.shape[1]

    compiled = torch.compile(fn, backend=kiln_inductor.compile_fx, dynamic=True)
    for n in (5, 9, 17):
        x, y = torch.randn(3, n), torch.randn(3, n)
        torch.testing.assert_close(compiled(x, y), fn(x, y))


def test_memory_efficient_attention_bias_of_symbolic_length_is_padded():
    """CUDA's memory-efficient attention reads its bias in 16-element rows: a bias of
    symbolic length computed in the graph is realized with rows rounded up at call time
    (the lowering compared symbolic strides and failed, so HF GPT-2 ran eagerly on the
    H200). Compiled here, not run: the CPU has no kernel for the op."""
    aten = torch.ops.aten

    def fn(q, k, v, m):
        bias = (m[:, None, :, None] * m[:, None, None, :]).expand(-1, 4, -1, -1)
        return (aten._scaled_dot_product_efficient_attention(q, k, v, bias, False)[0] * 2,)

    t = 7
    ins = [torch.randn(2, 4, t, 16) for _ in range(3)] + [torch.randn(2, t)]
    gm, _ = symbolic_graph(fn, ins, [[2], [2], [2], [1]])
    counting = Counting()
    kiln_inductor.compile_fx(gm, ins, compile_graph=counting)
    (graph,) = counting.graphs
    # the bias's rows: 16 * ceil(t / 16) elements
    assert re.search(r"16\*\(\(s\d+ \+ 15\) // 16\), 1\)", graph.wrapper_source)


def test_constant_padding_of_a_symbolic_dimension():
    """The pad's bounds test reads the padded dimension's size as an index expression
    (it converted the size to an int and failed: HF GPT-2's attention bias on the H200)."""

    def fn(x):
        pad = torch.ops.aten.constant_pad_nd(x * 2, [1, 3, 0, 2], 0.5)
        return (pad.softmax(-1),)

    _check_sizes(fn, lambda b, t: (torch.randn(b, t),), [[0, 1]])
