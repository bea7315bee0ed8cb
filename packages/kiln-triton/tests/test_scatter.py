"""Scatter-type ops (index_put, scatter, scatter_add, index_add, embedding_dense_backward)
as Triton kernels under the interpreter (``-m gpu`` runs them on CUDA in test_gpu.py):
results equal eager's, gradients of F.embedding and of advanced indexing equal eager's,
and no library call is left in their graphs."""

from __future__ import annotations

import pytest
import torch

from kiln_inductor.testing import (
    Gather,
    aten_graph,
    check_compiled,
    check_scatter_training,
    scatter_cases,
)
from kiln_triton.testing import use_triton_for_cpu

CASES = scatter_cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_scatter_matches_eager_as_kernels(name):
    fn, inputs, tol = CASES[name]
    with use_triton_for_cpu():
        compiled = check_compiled(fn, inputs, *((tol, tol) if tol else ()))
    stats = compiled.stats
    assert stats["kernels"] >= 2 and not stats["fallbacks"] and not stats["externs"], stats


@pytest.mark.parametrize("padding_idx, by_freq", [(None, False), (3, True)])
def test_embedding_and_indexing_gradients_match_eager(padding_idx, by_freq):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 12, (3, 7), generator=g)
    ids[0, :3] = 3
    rows = torch.randint(-9, 9, (3, 7), generator=g)
    with use_triton_for_cpu():
        graphs = check_scatter_training(Gather(padding_idx, by_freq), ids, rows)
    assert len(graphs) == 2
    for graph in graphs:
        assert not graph.stats["fallbacks"] and not graph.stats["externs"], graph.stats


def test_kernel_adds_atomically_and_skips_bad_lanes():
    """One lane per update, lanes along the gradient's row; ``tl.atomic_add`` masked by
    the lane's range and by its id's check (a bad id writes nothing)."""
    from kiln_inductor.graph import GraphLowering
    from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
    from kiln_triton.codegen.kernel import generate_triton_kernel

    aten = torch.ops.aten

    def f(gr, i):
        return (aten.embedding_dense_backward.default(gr, i, 10, -1, False),)

    inputs = [torch.randn(4, 5, 16), torch.randint(0, 10, (4, 5))]
    with use_triton_for_cpu():
        ir = GraphLowering(aten_graph(f, inputs), inputs).run()
    groups = [s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]
    kernel = generate_triton_kernel(groups[1], ir.buffers, 1024)
    assert kernel.kind == "pointwise" and kernel.meta()["xnumel"] == 4 * 5 * 16
    src = kernel.source
    assert len(kernel.checks) == 1
    order = [
        "xindex = xoffset",
        "z0_0 = (xindex // 80)",  # the ids' dimensions outermost
        "x0 = (xindex % 16)",  # then the gradient's row
        "tl.atomic_max(index_err",
    ]
    pos = [src.find(s) for s in order]
    assert -1 not in pos and pos == sorted(pos), (pos, src)
    (line,) = [ln for ln in src.splitlines() if "tl.atomic_add(" in ln]
    assert 'sem="relaxed"' in line and "== 0))" in line, line
