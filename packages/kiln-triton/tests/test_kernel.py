"""Generated Triton source for each kernel shape, checked with ordered fragments, and run
under the interpreter against eager."""

from __future__ import annotations

import torch
from batch import make

from kiln_inductor import compile_aten_graph
from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
from kiln_inductor.testing import aten_graph
from kiln_triton.codegen.kernel import TritonKernel
from kiln_triton.config import settings_scope
from kiln_triton.testing import use_triton_for_cpu

aten = torch.ops.aten


def kernels_of(fn, inputs, persistent_max=8192):
    """(kernel sources, compiled graph) of ``fn`` through the Triton backend."""
    from kiln_inductor.graph import GraphLowering

    gm = aten_graph(fn, inputs)
    ir = GraphLowering(gm, inputs).run()
    groups = [s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]
    kernels = [TritonKernel(g, ir.buffers, persistent_max) for g in groups]
    sources = [k.generate() for k in kernels]
    with use_triton_for_cpu(), settings_scope(persistent_max=persistent_max):
        compiled = compile_aten_graph(aten_graph(fn, inputs), inputs)
    got, expected = compiled(*inputs), fn(*inputs)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    return kernels, sources


def in_order(text: str, *fragments: str) -> None:
    pos = 0
    for f in fragments:
        found = text.find(f, pos)
        assert found >= 0, f"{f!r} not found after position {pos} in:\n{text}"
        pos = found + len(f)


def test_contiguous_pointwise_is_1d_over_the_flat_index():
    def fn(x, y):
        return (aten.sigmoid.default(aten.add.Tensor(aten.mul.Tensor(x, 2), y)),)

    kernels, (src,) = kernels_of(fn, [make((6, 70), torch.float32), make((70,), torch.float32)])
    assert kernels[0].kind == "pointwise"
    in_order(
        src,
        "def kernel(in_ptr0, in_ptr1, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):",
        "xindex = xoffset + tl.arange(0, XBLOCK)\n",
        "xmask = xindex < 420",
        "tl.load(in_ptr0 + xindex, xmask, other=0)",
        "tl.load(in_ptr1 + x1, xmask, other=0)",
        "tl.store(out_ptr0 + xindex,",
    )


def test_softmax_is_one_persistent_kernel_loading_the_row_once():
    def fn(x):
        return (aten._softmax.default(x, -1, False),)

    kernels, (src,) = kernels_of(fn, [make((10, 300), torch.float32)])
    assert kernels[0].kind == "persistent" and kernels[0].rblock == 512
    assert src.count("tl.load(") == 1
    assert src.count("tl.exp(") == 1
    in_order(src, "rmask0 = rbase < 300", "tl.max(", "tl.sum(", "tl.store(out_ptr0")


def test_long_rows_loop_with_accumulators():
    def fn(x):
        return aten.var_mean.correction(x, [1], correction=1)

    kernels, (src,) = kernels_of(fn, [make((3, 1000), torch.float32)], persistent_max=256)
    assert kernels[0].kind == "looped"
    # one pass of per-lane Welford updates, merged across lanes after the loop
    in_order(
        src,
        "_mean = tl.full([XBLOCK, RBLOCK], 0, tl.float32)",
        "for roffset in range(0, 1000, RBLOCK):",
        "rmask = rindex < 1000",
        "tl.reduce((",
        "libm.welford_combine)",
    )
    assert src.count("for roffset") == 1 and src.count("tl.load(") == 1


def test_layer_norm_fuses_statistics_and_normalization():
    def fn(x, w, b):
        return aten.native_layer_norm.default(x, [96], w, b, 1e-5)

    inputs = [
        make((5, 7, 96), torch.float32),
        make((96,), torch.float32),
        make((96,), torch.float32),
    ]
    kernels, sources = kernels_of(fn, inputs)
    assert len(sources) == 1 and kernels[0].kind == "persistent"
    assert sources[0].count("tl.load(in_ptr0") == 1


def test_reduction_with_inner_ranges_runs_a_scalar_loop():
    # two reductions sharing only their first dimension: the second keeps an inner range
    def fn(x, y):
        return (aten.sum.dim_IntList(x, [1]), aten.sum.dim_IntList(y, [2]))

    kernels, sources = kernels_of(fn, [make((4, 9), torch.float32), make((4, 3, 5), torch.float32)])
    assert len(sources) == 1
    in_order(sources[0], "tl.sum(", "for yflat1 in range(0, 3):", "tl.sum(", "tl.store(out_ptr1")


def test_huge_buffers_index_in_int64():
    from kiln_inductor.graph import GraphLowering

    x = torch.empty((2**16, 2**15 + 1), dtype=torch.bfloat16, device="meta")

    def fn(t):
        return (aten.mul.Tensor(t, 2),)

    gm = aten_graph(fn, [x])
    ir = GraphLowering(gm, [x]).run()
    (group,) = [s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]
    kernel = TritonKernel(group, ir.buffers, 8192)
    assert kernel.int64
    assert "tl.program_id(0).to(tl.int64)" in kernel.generate()


def test_column_sums_are_launched_with_wide_x_tiles():
    """A sum over the rows of a row-major matrix (a bias gradient) reads along x: its
    kernel says so in its meta (``columns``), and the launch candidates start with wide
    XBLOCKs; a sum along the rows does not."""
    from kiln_triton.runtime.configs import candidate_configs

    def columns(x):
        return (aten.sum.dim_IntList(x, [0]),)

    def rows(x):
        return (aten.sum.dim_IntList(x, [1]),)

    x = make((96, 256), torch.float32)
    (col,), _ = kernels_of(columns, [x])
    (row,), _ = kernels_of(rows, [x])
    assert col.kind != "pointwise" and col.meta().get("columns") is True
    assert "columns" not in row.meta()
    for exhaustive in (False, True):
        cands = candidate_configs(col.meta(), exhaustive)
        assert cands[0].XBLOCK >= 64 and cands[0].XBLOCK * cands[0].RBLOCK <= 1 << 14
        assert candidate_configs(row.meta(), exhaustive)[0].XBLOCK < 64
