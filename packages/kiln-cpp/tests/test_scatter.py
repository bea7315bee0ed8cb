"""Scatter-type ops (index_put, scatter, scatter_add, index_add, embedding_dense_backward)
as generated C++ kernels: results equal eager's, gradients of F.embedding and of advanced
indexing equal eager's, and no library call is left in their graphs."""

from __future__ import annotations

import pytest
import torch

import kiln_cpp
from kiln_inductor.testing import (
    Gather,
    aten_graph,
    check_compiled,
    check_scatter_training,
    scatter_cases,
)

CASES = scatter_cases()


def _no_library_call(stats):
    assert stats["kernels"] >= 2 and not stats["fallbacks"] and not stats["externs"], stats


@pytest.mark.parametrize("name", sorted(CASES))
def test_scatter_matches_eager_as_kernels(name):
    fn, inputs, tol = CASES[name]
    compiled = check_compiled(fn, inputs, *((tol, tol) if tol else ()))
    _no_library_call(compiled.stats)
    assert "# in place" in compiled.wrapper_source  # the scatter updates its base's storage


@pytest.mark.parametrize(
    "padding_idx, by_freq", [(None, False), (3, False), (None, True), (-2, True)]
)
def test_embedding_and_indexing_gradients_match_eager(padding_idx, by_freq):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 12, (3, 7), generator=g)
    ids[0, :3] = 3  # duplicates, and the padding row
    rows = torch.randint(-9, 9, (3, 7), generator=g)
    graphs = check_scatter_training(Gather(padding_idx, by_freq), ids, rows)
    assert len(graphs) == 2  # forward and backward
    for graph in graphs:
        assert not graph.stats["fallbacks"] and not graph.stats["externs"], graph.stats


def test_kernel_runs_columns_in_parallel_and_ids_in_order():
    """embedding_dense_backward: threads split the gradient's rows into column chunks; each
    walks the ids in order (no atomics, eager's order of the sums), the id checked once per
    row before a vectorized loop, and a bad id's row is not written."""
    from kiln_cpp.kernel import generate_cpp_kernel
    from kiln_inductor.graph import GraphLowering
    from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes

    aten = torch.ops.aten

    def f(gr, i):
        return (aten.embedding_dense_backward.default(gr, i, 10, -1, False),)

    inputs = [torch.randn(4, 5, 160), torch.randint(0, 10, (4, 5))]
    ir = GraphLowering(aten_graph(f, inputs), inputs).run()
    groups = [s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]
    assert [b.kind for g in groups for b in g.blocks] == ["pointwise", "scatter"]
    src, checks, _ = generate_cpp_kernel(groups[1], ir.buffers)
    assert len(checks) == 1 and checks[0].error is IndexError
    body = src[src.index('extern "C" int64_t kernel') :]
    order = [
        "#pragma omp parallel for collapse(1)",
        "for (int64_t c_x0 = 0; c_x0 < 160L; c_x0 += 64)",
        "for (int64_t q0_0 = 0; q0_0 < 4L; ++q0_0)",  # the ids' dimensions, in order
        "for (int64_t q0_1 = 0; q0_1 < 5L; ++q0_1)",
        "kiln_index_fail(&kiln_err, 1L",
        "#pragma omp simd",
        "if (!(hk0_b)) out_ptr0[((160L * hk0) + x0)] += ",
    ]
    pos = [body.find(s) for s in order]
    assert -1 not in pos and pos == sorted(pos), (pos, body)
    assert "atomic" not in body


@pytest.mark.parametrize(
    "shape,dim",
    [((4,), 0), ((4, 3), 0), ((4, 3), 1), ((7, 5, 2), 0), ((7, 5, 2), 1), ((7, 5, 2), 2),
     ((2, 5, 3, 2), 2)],
)  # fmt: skip
def test_index_add_bad_index_raises_eagers_exception_type(shape, dim):
    """Eager's CPU index_add raises RuntimeError along the first or last dimension of a
    tensor of 2+ dimensions and IndexError otherwise (found by the fuzzer)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    src = torch.randn([3 if k == dim else s for k, s in enumerate(shape)], generator=g)

    def fn(x, i, src):
        return torch.index_add(x, dim, i, src) * 2

    good = torch.tensor([0, shape[dim] - 1, 0])
    compiled = kiln_cpp.compile_fx(fn, [x, good, src])
    torch.testing.assert_close(compiled(x, good, src), fn(x, good, src))
    for bad in (shape[dim], -1, 10**6):
        i = torch.tensor([0, bad, 1 % shape[dim]])
        with pytest.raises(Exception) as eager:
            fn(x, i, src)
        with pytest.raises(eager.type, match="checked in the compiled kernel of aten.index_add"):
            compiled(x, i, src)
    torch.testing.assert_close(compiled(x, good, src), fn(x, good, src))
