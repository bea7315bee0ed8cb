"""The shape of generated C++ (ordered fragments), that GCC really vectorizes it, and the
kernel cache across processes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kiln_cpp.config import read_cpp_config
from kiln_cpp.kernel import generate_cpp_kernel
from kiln_inductor.graph import GraphLowering
from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
from kiln_inductor.testing import aten_graph, check_compiled

aten = torch.ops.aten


def kernel_sources(fn, inputs):
    gm = aten_graph(fn, inputs)
    ir = GraphLowering(gm, inputs).run()
    return [
        generate_cpp_kernel(s, ir.buffers)[0] for s in fuse_nodes(ir) if isinstance(s, FusedGroup)
    ]


def assert_in_order(text: str, fragments: list[str]) -> None:
    pos = 0
    for frag in fragments:
        found = text.find(frag, pos)
        assert found >= 0, f"{frag!r} not found after position {pos} in:\n{text[-3000:]}"
        pos = found + len(frag)


def test_softmax_kernel_shape(monkeypatch):
    """One kernel, three loops per row: max, sum of exp (kept in a per-row scratch array,
    summed in partial sums), then the exp read back times the reciprocal of the sum (exp is
    computed once)."""
    monkeypatch.setenv("KILN_CPP_STREAM_BYTES", "0")  # ordinary stores, on any cache size
    (src,) = kernel_sources(
        lambda x: (aten._softmax.default(x, -1, False),), [torch.randn(4096, 1024)]
    )
    body = src[src.index('extern "C" int64_t kernel') :]
    assert_in_order(
        body,
        [
            "const float* __restrict__ in_ptr0, float* __restrict__ out_ptr0",
            "#pragma omp parallel for",
            "for (int64_t x0 = 0; x0 < 4096L",
            "alignas(64) float scr0[1024L];",
            "int acc0_nan = 0;",
            "#pragma omp simd reduction(max:acc0) reduction(|:acc0_nan)",
            "kiln::max<float>",
            "_p[32] = {};",  # the sum of exp in 32 partial sums
            "c_q0_0 += 32",
            "#pragma omp simd",
            "kiln_expf(",
            "scr0[q0_0] = ",
            "_p[q0_0 - c_q0_0] = ",
            "#pragma omp simd reduction(+:",
            "#pragma omp simd",
            "= scr0[q0_0];",
            "(1.0f / acc",
            "out_ptr0[",
        ],
    )
    assert body.count("expf(") == 1


def test_row_sharing_keeps_different_values_apart():
    """exp(where(pad, x, 0)) and where(pad, exp(x), 0) look alike but differ: only equal
    structural keys are shared between the loops of a row; the result matches eager."""
    from kiln_inductor.testing import check_compiled

    def fn(x):
        e = aten.exp.default(x)
        pad = aten.constant_pad_nd.default(e, [0, 4], 0.0)  # exp under a mask
        s = aten.sum.dim_IntList(pad, [-1], True)
        return (aten.div.Tensor(aten.exp.default(aten.constant_pad_nd.default(x, [0, 4])), s),)

    check_compiled(fn, [torch.randn(16, 60)])


def test_division_by_a_literal_stays_a_division():
    (src,) = kernel_sources(
        lambda x: (
            aten.div.Tensor(x, aten.sum.dim_IntList(x, [-1], True)),
            aten.div.Tensor(x, 3.0),
        ),
        [torch.randn(64, 256)],
    )
    assert "(1.0f / acc" in src
    assert "/ tmp" in src or "/ 3.0f" in src


def test_full_reduction_uses_per_thread_partials():
    (src,) = kernel_sources(lambda x: (aten.sum.default(x),), [torch.randn(1 << 20)])
    assert_in_order(
        src,
        [
            "#pragma omp parallel if(",
            "#pragma omp for nowait",
            "#pragma omp simd reduction(+:",
            "#pragma omp critical",
        ],
    )


def test_bfloat16_is_computed_in_float():
    (src,) = kernel_sources(lambda x: (aten.exp.default(x),), [torch.randn(64).bfloat16()])
    assert_in_order(
        src,
        [
            "const uint16_t* __restrict__ in_ptr0",
            "kiln_bf16_to_f32(in_ptr0[",
            "expf(",
            "kiln_f32_to_bf16(",
        ],
    )


def test_gcc_vectorizes_the_inner_loops(tmp_path):
    """Checked once on the compiler's own report: every pointwise and reduction loop of a
    softmax + pointwise chain kernel is vectorized."""
    srcs = kernel_sources(
        lambda x: (aten._softmax.default(x, -1, False), aten.tanh.default(aten.mul.Tensor(x, x))),
        [torch.randn(256, 1024)],
    )
    cfg = read_cpp_config()
    for k, src in enumerate(srcs):
        path = tmp_path / f"k{k}.cpp"
        path.write_text(src)
        cmd = [
            cfg.cxx,
            *cfg.flags.split(),
            "-fopt-info-vec-optimized",
            str(path),
            "-o",
            str(tmp_path / f"k{k}.so"),
            *cfg.libs.split(),
        ]
        report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        simd_loops = [
            i + 1
            for i, line in enumerate(src.splitlines())
            if "#pragma omp simd" in line or "parallel for simd" in line
        ]
        vectorized = {
            int(ln.split(":")[1])
            for ln in report.splitlines()
            if "loop vectorized" in ln and ln.startswith(str(path))
        }
        for pragma_line in simd_loops:
            # GCC names the pragma's line or the loop's line
            assert {pragma_line, pragma_line + 1, pragma_line + 2} & vectorized, (
                f"loop at line {pragma_line + 1} not vectorized:\n{report}"
            )
        assert simd_loops


def _assembly(src: str, tmp_path: Path) -> str:
    import shutil

    if shutil.which("objdump") is None:
        pytest.skip("objdump not found")
    cfg = read_cpp_config()
    path = tmp_path / "k.cpp"
    path.write_text(src)
    so = tmp_path / "k.so"
    subprocess.run(
        [cfg.cxx, *cfg.flags.split(), str(path), "-o", str(so), *cfg.libs.split()], check=True
    )
    return subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True).stdout


def test_max_reduction_loop_is_packed(tmp_path):
    """GCC's report can call a loop vectorized when only an epilogue is: the assembly of
    softmax's max loop must hold a packed max (a bool NaN flag used to keep it scalar)."""
    (src,) = kernel_sources(lambda x: (aten.amax.default(x, [-1]),), [torch.randn(512, 1024)])
    assert "maxps" in _assembly(src, tmp_path)


def test_masked_softmax_with_a_bool_mask_is_vectorized(tmp_path):
    """GPT-2's attention softmax reads a bool mask: passed as uint8_t, the loops vectorize
    (through a bool pointer GCC kept them scalar, calling libm's scalar expf)."""

    def fn(x, m):
        bias = aten.where.self(
            m, aten.scalar_tensor.default(0.0), aten.scalar_tensor.default(-math.inf)
        )
        return (aten._softmax.default(aten.add.Tensor(x, bias), -1, False),)

    inputs = [torch.randn(4, 64, 64), torch.ones(64, 64, dtype=torch.bool).tril()]
    (src,) = kernel_sources(fn, inputs)
    assert "const uint8_t* __restrict__ in_ptr1" in src
    asm = _assembly(src, tmp_path)
    assert "maxps" in asm and "<expf@plt>" not in asm
    from kiln_inductor.testing import check_compiled

    check_compiled(fn, inputs)


def test_second_process_with_warm_cache_compiles_no_kernel(tmp_path):
    script = textwrap.dedent(
        """
        import torch, kiln_cpp
        from kiln_inductor.testing import check_compiled
        from kiln_inductor.runtime.cache import STATS
        aten = torch.ops.aten
        check_compiled(lambda x: (aten._softmax.default(aten.mul.Tensor(x, 3.0), -1, False),), [torch.randn(8, 64)])
        print("builds", STATS.builds, "hits", STATS.hits)
        """
    )
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    second = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert "builds 1 hits 0" in first.stdout, first.stdout + first.stderr
    assert "builds 0 hits 1" in second.stdout, second.stdout + second.stderr
    # a corrupted binary is detected, removed and rebuilt, and the result is still right
    (so,) = list(Path(tmp_path / "cache").rglob("kernel.so"))
    so.write_bytes(so.read_bytes()[: len(so.read_bytes()) // 2])
    third = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert "builds 1 hits 0" in third.stdout, third.stdout + third.stderr


def test_kiln_log_kernels_and_debug_dir(monkeypatch, capsys, tmp_path):
    from kiln_inductor.testing import check_compiled

    monkeypatch.setenv("KILN_LOG", "kernels")
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path / "dbg"))
    check_compiled(lambda x: (aten.relu.default(aten.add.Tensor(x, 1.0)),), [torch.randn(8, 8)])
    err = capsys.readouterr().err
    assert_in_order(err, ["[kiln:kernels] kernel0", "pointwise[", 'extern "C" int64_t kernel'])
    (graph_dir,) = list((tmp_path / "dbg").iterdir())
    names = {p.name for p in graph_dir.iterdir()}
    assert {"aten.py", "ir", "sched", "kernel0.cpp", "wrapper.py"} <= names


def test_large_row_outputs_are_streamed_and_stay_right(monkeypatch):
    """Past the stream threshold the last loop computes a row on the stack and writes it
    with non-temporal stores; rows of 100 floats start unaligned (head and tail paths)."""
    from kiln_inductor.testing import check_compiled

    monkeypatch.setenv("KILN_CPP_STREAM_BYTES", "1")

    def fn(x, w):
        y = aten._softmax.default(x, -1, False)
        return (y, aten.add.Tensor(aten.mul.Tensor(x, w), 1.0))

    inputs = [torch.randn(37, 100), torch.randn(100)]
    (src,) = kernel_sources(fn, inputs)
    assert_in_order(src, ["alignas(64) float row0[100L];", "row0[q", "kiln_stream_f32(out_ptr"])
    check_compiled(fn, inputs)


def test_small_outputs_are_not_streamed(monkeypatch):
    monkeypatch.delenv("KILN_CPP_STREAM_BYTES", raising=False)
    (src,) = kernel_sources(
        lambda x: (aten._softmax.default(x, -1, False),), [torch.randn(64, 256)]
    )
    assert "kiln_stream_f32(out" not in src


def test_batch_one_fusions_match_eager():
    """The kernels the scheduler fuses across size-1 dimensions and after an embedding
    gather compute what eager does."""
    from kiln_inductor.testing import check_compiled

    def ln(x, w, b):
        out = aten.native_layer_norm.default(x, [256], w, b, 1e-5)[0]
        return (aten.view.default(out, [256, 256]),)

    def sm(s, m):
        scores = aten.add.Tensor(aten.view.default(s, [1, 4, 64, 64]), m)
        return (aten._softmax.default(scores, -1, False),)

    def emb_ln(table, ids, w, b):
        x = aten.embedding.default(table, ids)
        return (aten.native_layer_norm.default(x, [64], w, b, 1e-5)[0],)

    check_compiled(ln, [torch.randn(1, 256, 256), torch.randn(256), torch.randn(256)], 1e-4)
    check_compiled(sm, [torch.randn(4, 64, 64), torch.randn(1, 1, 64, 64)], 1e-5)
    ids = torch.randint(0, 100, (1, 32))
    check_compiled(emb_ln, [torch.randn(100, 64), ids, torch.randn(64), torch.randn(64)], 1e-4)


def test_large_rows_prefetch_the_next_row_and_stay_right():
    """A row-wise kernel over a large input prefetches the next outer iteration's row (one
    prefetch per cache line, guarded on the last row); weights read every row are not
    prefetched. Rows with -inf and NaN still give eager's softmax."""
    from kiln_inductor.testing import check_compiled

    def sm(x):
        return (aten._softmax.default(x, -1, False),)

    def ln(x, w, b):
        return (aten.native_layer_norm.default(x, [1024], w, b, 1e-5)[0],)

    x = torch.randn(256, 1024)
    (src,) = kernel_sources(sm, [x])
    assert_in_order(
        src,
        [
            "for (int64_t x0 = 0; x0 < 256L",
            "if (x0 + 1 < 256L) for (int64_t pf = 0; pf < 1024L; pf += 16) "
            "__builtin_prefetch(in_ptr0 + (((1024L * x0) + 1024L)) + pf);",
            "reduction(max:acc0)",
        ],
    )
    assert src.count("__builtin_prefetch(") == 1  # three loops read the row: one prefetch
    ln_inputs = [x, torch.randn(1024), torch.randn(1024)]
    (src,) = kernel_sources(ln, ln_inputs)
    assert src.count("__builtin_prefetch(in_ptr0") == 1
    assert "__builtin_prefetch(in_ptr1" not in src and "__builtin_prefetch(in_ptr2" not in src
    x[3] = float("-inf")
    x[5, :512] = float("-inf")
    x[7, 100] = float("nan")
    check_compiled(sm, [x], 1e-5)
    check_compiled(ln, ln_inputs, 1e-4)
    (small,) = kernel_sources(sm, [torch.randn(64, 1024)])  # 256 KiB: stays in L2
    assert "__builtin_prefetch" not in small


def test_row_sums_use_partial_sums_and_stay_right():
    """Sums along a row of a multiple of 32 (>= 64) go to 32 partial sums (independent
    vector adds, in float), others keep one accumulator (a float32 one in double); float64
    too; results match eager, inf/NaN included."""
    from kiln_inductor.testing import check_compiled

    def fn(x):
        s = aten.sum.dim_IntList(x, [-1])
        return (s, aten.mul.Tensor(x, aten.unsqueeze.default(s, -1)))

    (src,) = kernel_sources(fn, [torch.randn(16, 96)])
    assert_in_order(src, ["float acc0_p[32] = {};", "c_q", "+= 32", "#pragma omp simd"])
    (src,) = kernel_sources(fn, [torch.randn(16, 48)])
    assert "_p[32]" not in src
    (src,) = kernel_sources(fn, [torch.randn(16, 64, dtype=torch.float64)])
    assert "double acc0_p[32] = {};" in src
    x = torch.randn(16, 96)
    x[2, 5] = float("inf")
    x[3, 7] = float("nan")
    x[4, 1], x[4, 90] = float("inf"), float("-inf")
    check_compiled(fn, [x], 1e-5)
    check_compiled(fn, [torch.randn(16, 64, dtype=torch.float64)], 1e-12)


def test_transposed_computed_matmul_operand_matches_eager():
    """``relu(x).T @ g`` (a weight gradient): the operand is stored untransposed and the
    matmul reads it transposed (GraphLowering.realize_transposed); values match eager."""

    def weight_grad(x, g, h):
        act = aten.mul.Tensor(aten.relu.default(x), 0.5)
        return (
            aten.mm.default(aten.permute.default(act, [1, 0]), g),
            aten.bmm.default(aten.permute.default(aten.exp.default(h), [0, 2, 1]), h),
        )

    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=gen) for s in ((12, 20), (12, 8), (3, 5, 7))]
    check_compiled(weight_grad, inputs, rtol=1e-5, atol=1e-5)


def test_float_sums_over_strided_rows_are_as_close_to_float64_as_eager():
    """A batch-norm-style sum over (N, H*W) per channel, whose terms cancel: one float
    accumulator per channel drifted 1e-4 from the float64 sum where eager's cascade was
    exact; accumulated in double, kiln is as close as eager."""
    from kiln_inductor.testing import check_compiled

    def fn(x):
        return (aten.sum.dim_IntList(x, [0, 2]),)

    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-1, 1, 256 * 8 * 16)[torch.randperm(256 * 8 * 16, generator=g)]
    x = (x.view(256, 8, 16) * 1000).float()
    exact = fn(x.double())[0]
    got = check_compiled(fn, [x], 1e-3, 1e-3)(x)[0]
    eager_err = (fn(x)[0].double() - exact).abs().max().item()
    kiln_err = (got.double() - exact).abs().max().item()
    assert kiln_err <= 2 * eager_err + 1e-6, (kiln_err, eager_err)


def test_column_sums_walk_the_rows_once_per_tile_of_columns():
    """Sums over the rows of a row-major matrix (a bias gradient): tiles of 64 columns,
    the rows outside and a vector loop over the tile inside, an epilogue per column; a
    tail tile, a leading outer dimension and inf/NaN match eager."""
    from kiln_inductor.testing import check_compiled

    def fn(x):
        s = aten.sum.dim_IntList(x, [0])
        t = aten.sum.dim_IntList(aten.mul.Tensor(x, x), [0])
        return (aten.add.Tensor(aten.mul.Tensor(s, 2.0), t),)

    (src,) = kernel_sources(fn, [torch.randn(300, 200)])
    assert_in_order(
        src,
        ["t_x0 += 64", "double acc0_c[64] = {};", "#pragma omp simd", "for (int64_t x0 = t_x0"],
    )
    x = torch.randn(300, 200)
    x[7, 3], x[9, 150] = float("inf"), float("nan")
    check_compiled(fn, [x], 1e-4, 1e-4)
    check_compiled(fn, [torch.randn(16, 3, 130)], 1e-4, 1e-4)  # outer (3, 130), a tail
    (src,) = kernel_sources(fn, [torch.randn(300, 100)])  # too narrow for two tiles
    assert "_c[64]" not in src


def test_one_element_of_an_input_is_read_once_at_the_kernel_start():
    """AdamW's bias correction ``beta ** (step + 1)`` reads a 0-d step count: the element
    is read before the loops (``kc0``), so GCC computes what depends only on it once
    instead of calling powf for every element; results match eager."""
    from kiln_inductor.testing import check_compiled

    def fn(x, step):
        corr = aten.pow.Scalar(0.999, aten.add.Tensor(step, 1.0))
        return (aten.div.Tensor(x, aten.rsub.Scalar(corr, 1.0)),)

    inputs = [torch.randn(64, 128), torch.tensor(3.0)]
    (src,) = kernel_sources(fn, inputs)
    assert_in_order(src, ["const float kc0 = in_ptr", "[0L];", "#pragma omp", "kc0"])
    check_compiled(fn, inputs, 1e-5, 1e-5)


def test_no_element_is_read_at_the_kernel_start_of_a_loop_that_does_not_run():
    """An input of no elements (a size-0 expand: no element 0 to read) in a kernel whose
    loops run no iteration: the element is not read at the start (it was, and segfaulted:
    fuzzer seed 951822). With sizes known only at run time the start read is guarded by
    the loops' extents (checked end to end through kiln.compile(dynamic=True) in kiln's
    tests/test_dynamic.py)."""
    from kiln_inductor.testing import check_compiled

    def fn(a):
        return (aten.add.Tensor(a, a),)

    empty = torch.randint(-8, 9, (1,)).to(torch.int32).expand(0)
    (src,) = kernel_sources(fn, [empty])
    assert "kc0" not in src
    check_compiled(fn, [empty], 0, 0)
