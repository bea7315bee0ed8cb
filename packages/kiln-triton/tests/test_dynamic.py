"""Symbolic sizes in Triton kernels, in Triton's interpreter (CPU tensors): one compiled
graph (one source of each kernel) serves every size, with kernels taking the sizes as
int arguments; results equal eager at odd and prime sizes; autotuning once per size
bucket; CUDA graph runners recording at most one graph per bucket. The same on a GPU:
test_gpu_dynamic.py; kiln-cpp's version of these tests: kiln-cpp's tests/test_dynamic.py."""

from __future__ import annotations

import logging
import os
import re

import pytest
import torch
from symbolic import Counting, launchers, recording, symbolic_graph, symbolic_programs

import kiln_inductor
from kiln_inductor.testing import check_symbolic_training
from kiln_triton.config import settings_scope
from kiln_triton.runtime.buckets import bucket_of, int_specialization
from kiln_triton.testing import use_triton_for_cpu

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="runs kernels in Triton's interpreter"
)
SIZES = [(3, 5), (4, 7), (2, 11), (13, 4), (17, 13), (6, 2)]
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _check_sizes(fn, make_inputs, dynamic, sizes=SIZES, tol=TOL):
    """Compile ``fn`` once for symbolic sizes, run it at every size against eager; the
    compiled ATen graph and its kernel sources."""
    torch.manual_seed(0)
    first = make_inputs(*sizes[0])
    gm, env = symbolic_graph(fn, first, dynamic)
    counting = Counting()
    with use_triton_for_cpu() as backend:
        recording(backend)
        compiled = kiln_inductor.compile_fx(gm, first, compile_graph=counting)
        for size in sizes:
            inputs = make_inputs(*size)
            torch.testing.assert_close(compiled(*inputs), fn(*inputs), **tol)
    # one ATen graph for every size: nothing recompiled, and its kernels take the sizes
    assert len(counting.graphs) == 1, len(counting.graphs)
    assert "s0" in counting.graphs[0].wrapper_source
    assert any(src.size_args for src in backend.sources)
    return counting.graphs[0], backend.sources


def test_pointwise_softmax_and_layer_norm_over_varying_dims():
    program = symbolic_programs()["norms"]
    _, sources = _check_sizes(program.fn, program.inputs, program.dims)
    # rows of 32 stay persistent over a symbolic number of rows; softmax over the
    # symbolic dim 1 loops (RBLOCK is a launch constant, the row length a call's)
    kinds = {src.meta["kind"] for src in sources}
    assert {"persistent", "looped", "pointwise"} <= kinds, kinds


def test_mlp_over_a_varying_batch():
    program = symbolic_programs()["mlp"]
    _check_sizes(program.fn, program.inputs, program.dims)


def test_sizes_used_in_views_slices_masks_and_positions():
    program = symbolic_programs()["views"]
    _, sources = _check_sizes(program.fn, program.inputs, program.dims)
    text = "\n".join(src.source for src in sources)
    assert "// 2)" in text  # t // 2 is an expression of the size argument, not a constant


def test_reductions_over_prime_lengths_with_a_masked_tail():
    def fn(x):
        return x.sum(-1), x.amax(-1), x.var(-1), x.cumsum(-1), x.argmin(-1), (x / 4).prod(-1)

    # rows of 37 * t elements: 111, 185, 259, 1073 (more than one chunk of 1024), and
    # 2257: past the 2048 float32 elements (8 KiB) a persistent row may hold
    sizes = [(3, 5), (2, 3), (5, 7), (2, 29), (2, 61)]
    make = lambda b, t: (torch.randn(b, t * 37),)
    # cumsums of 2257 terms: float32 rounding of another summation order, past 1e-5
    graph, sources = _check_sizes(fn, make, [[0, 1]], sizes, {"rtol": 1e-4, "atol": 1e-4})
    assert all(src.meta["kind"] == "looped" for src in sources)
    # each module holds a looped kernel and a persistent one for rows of symbolic length
    assert all("def kernel_persistent(" in src.source for src in sources)
    assert {src.meta["persistent_limit"] for src in sources} == {2048, 8192}  # scan: 8192
    used = {
        (b, entry.fn is ln.persistent)
        for ln in launchers(graph)
        for b, entry in ln._buckets.items()
        if ln.meta.get("persistent_limit") == 2048
    }
    # rows up to 2048 (buckets of 37 * t) run persistent, the bucket of 2257 loops
    assert {(b[1], p) for b, p in used} == {
        (128, True),
        (256, True),
        (512, True),
        (2048, True),
        (4096, False),
    }


def test_training_step_gradients_at_every_size():
    check_symbolic_training(SIZES, TOL, use_triton_for_cpu)


def test_sizes_of_declared_ranges_that_include_zero_and_one():
    """A size 0 launches nothing (no grid of zero programs); a size 1 is an argument like
    any other (Triton passes 1 as a constant: ``tl.cast`` widens both)."""

    def fn(x):
        return (x * 2).softmax(-1), x.sum(0)

    first = (torch.randn(3, 5),)
    gm, _ = symbolic_graph(fn, first, [[0, 1]], [{0: (0, None), 1: (1, None)}])
    with use_triton_for_cpu():
        compiled = kiln_inductor.compile_fx(gm, list(first), compile_graph=Counting())
        for size in [(1, 1), (0, 4), (4, 1), (2, 3)]:
            x = torch.randn(*size)
            torch.testing.assert_close(compiled(x), fn(x))


def test_kernel_sources_take_size_arguments_and_hold_no_size_of_the_example():
    w = torch.randn(32)

    def fn(x):
        y = torch.nn.functional.layer_norm(x, (32,), w)
        return y.softmax(1) * 2, x.amax(1)

    # 13, 7 and every product of them with 32 would appear if a size were baked in
    graph, sources = _check_sizes(fn, lambda b, t: (torch.randn(b, t, 32),), [[0, 1]], [(13, 7)])
    baked = {"13", "7", "91", "416", "224", "2912"}
    for src in sources:
        text = src.source
        head = text[text.index("def kernel(") :].splitlines()[0]
        assert src.size_args == ("s0", "s1"), src.size_args
        # the sizes follow the tensors and precede the block sizes, and are widened
        assert head.endswith("s0, s1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):")
        assert "s0 = tl.cast(s0, tl.int64)" in text and "tl.int64) * XBLOCK" in text
        assert not baked & set(re.findall(r"\b\d+\b", text)), text
        # masks are never dropped for a symbolic extent
        assert "xmask = xindex < " in text and "mask = tl.full(" not in text
        assert src.meta["int64"] and isinstance(src.meta["xnumel"], str)
    # the wrapper binds the sizes and passes them after the tensors
    assert re.search(r"\.fast\([^)]*, s0, s1\)", graph.wrapper_source), graph.wrapper_source


def test_a_static_kernel_of_a_symbolic_graph_stays_static():
    """Kernels whose sizes are all static keep their constants, int32 indexing and
    dropped masks, and take no size argument."""

    def fn(x, w):
        return x * w.sum(), (w * 2).exp()

    gm, _ = symbolic_graph(fn, [torch.randn(5, 8), torch.randn(64)], [[0], []])
    with use_triton_for_cpu() as backend:
        recording(backend)
        compiled = kiln_inductor.compile_fx(gm, [torch.randn(5, 8), torch.randn(64)])
        for b in (3, 7):
            x, w = torch.randn(b, 8), torch.randn(64)
            torch.testing.assert_close(compiled(x, w), fn(x, w), **TOL)
    static = [s for s in backend.sources if not s.size_args]
    assert static and all(not s.meta["int64"] and "tl.cast(" not in s.source for s in static)


def test_size_buckets_and_triton_specializations():
    assert bucket_of([2, 3, 5, 8, 9, 1000]) == (2, 4, 8, 8, 16, 1024)
    assert bucket_of([0, 1]) == (0, 1)
    # Triton compiles one binary per specialization: 1 a constant, int32/int64, % 16
    assert int_specialization([1, 7, 32, 2**31 + 16]) == (
        1,
        ("i32", False),
        ("i32", True),
        ("i64", True),
    )


def test_autotuning_runs_once_per_size_bucket_and_is_cached_on_disk(tmp_path, monkeypatch):
    """Outside the interpreter a kernel with size arguments measures its candidates on
    the first call of each size bucket, and a later compilation of the same kernels
    reads the winners from disk. Here the measurement is a stand-in (no GPU)."""
    from kiln_triton.runtime import launcher as launcher_mod

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(launcher_mod, "interpreting", lambda: False)
    measured: list[tuple[str, tuple[int, ...]]] = []

    def measure(self, cands, args, rounds=3, launcher_for=None):
        sizes = args[len(args) - len(self.sized.names) :]
        measured.append((self.key, bucket_of(sizes)))
        for c in cands:  # every candidate runs (in the interpreter) on the real sizes
            launcher_for(c)(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        return {c: float(len(cands) - i) for i, c in enumerate(cands)}  # the last wins

    monkeypatch.setattr(launcher_mod.TritonLauncher, "measure", measure)

    def fn(x):
        return (x * 3).softmax(-1)

    def run(sizes):
        gm, _ = symbolic_graph(fn, [torch.randn(3, 5)], [[0, 1]])
        with use_triton_for_cpu(), settings_scope(max_autotune=True, direct_launch=False):
            compiled = kiln_inductor.compile_fx(gm, [torch.randn(3, 5)])
            for b, t in sizes:
                x = torch.randn(b, t)
                torch.testing.assert_close(compiled(x), fn(x), **TOL)

    # buckets (512, 8) three times, (1024, 8), (512, 8) again; rows of 8 and 32 take the
    # persistent kernel of the module, whose candidates differ in warps at these sizes
    run([(300, 5), (400, 7), (301, 6), (1000, 5), (300, 5)])
    assert sorted(b for _, b in measured) == [(512, 8), (1024, 8)]
    assert len({k for k, _ in measured}) == 1  # one kernel
    measured.clear()
    run([(257, 7), (900, 6)])  # a new compilation: the same buckets come from disk
    assert measured == []
    run([(300, 17)])  # a new bucket is measured
    assert [b for _, b in measured] == [(512, 32)]


def test_reduce_overhead_records_one_graph_per_size_bucket_up_to_a_bound(caplog):
    """A CUDA graph runner around a graph with symbolic sizes: the first size of each
    bucket is recorded and replayed when it comes again; other sizes of the bucket and
    buckets past MAX_GRAPHS run the compiled graph without one (simulated on the CPU:
    test_cudagraph_lending.py's CpuGraphRunner; on a GPU: test_gpu_dynamic.py)."""
    from test_cudagraph_lending import CpuGraphRunner

    from kiln_triton.cudagraphs import MAX_GRAPHS

    def fn(x):
        return ((x + 1).relu() * 2,)

    gm, _ = symbolic_graph(fn, [torch.randn(3, 4)], [[0]])
    with use_triton_for_cpu(), caplog.at_level(logging.WARNING, logger="kiln_inductor"):
        compiled = kiln_inductor.compile_fx(gm, [torch.randn(3, 4)], compile_graph=Counting())
        runner = CpuGraphRunner(compiled, "dynamic")
        sizes = [3, 3, 5, 7, 6, 9, 17, 33, 65, 129, 257, 513, 1025, 2049, 7]
        for n in sizes:
            x = torch.randn(n, 4)
            torch.testing.assert_close(runner(x)[0], fn(x)[0])
    buckets = {bucket_of([n]) for n in sizes}
    assert len(buckets) > MAX_GRAPHS
    assert len(runner.graphs) == MAX_GRAPHS and None not in runner.graphs.values()
    recorded = sorted(k[0][0][0] for k in runner.graphs)  # the first size of each bucket
    assert recorded == [3, 5, 9, 17, 33, 65, 129, 257]
    # replays: each recorded size's first call, 3's second call; 7 and 6 (bucket 8 holds
    # 5's graph) and sizes past the bound ran without a graph
    assert runner.replays == MAX_GRAPHS + 1
    assert "one graph per size bucket" in caplog.text
    assert f"has captured {MAX_GRAPHS} CUDA graphs" in caplog.text


def test_matmul_templates_refuse_symbolic_shapes():
    """Under max-autotune a matmul of symbolic shape stays a library call (its epilogue a
    kernel with size arguments) instead of becoming a template."""
    w, bias = torch.randn(24, 16), torch.randn(24)

    def fn(x):
        return (torch.nn.functional.linear(x, w, bias).relu() + 1,)

    gm, _ = symbolic_graph(fn, [torch.randn(5, 16)], [[0]])
    counting = Counting()
    with use_triton_for_cpu() as backend, settings_scope(max_autotune=True):
        recording(backend)
        compiled = kiln_inductor.compile_fx(gm, [torch.randn(5, 16)], compile_graph=counting)
        for b in (5, 11, 2):
            x = torch.randn(b, 16)
            torch.testing.assert_close(compiled(x), fn(x), **TOL)
    (graph,) = counting.graphs
    assert graph.stats["externs"] >= 1
    assert all(src.meta["kind"] != "mm_template" for src in backend.sources)


def test_matmul_templates_refuse_epilogues_that_read_a_size():
    """A static matmul whose epilogue multiplies by a symbolic size (a size argument of
    the epilogue's kernel) stays a library call too."""
    w = torch.randn(24, 16)

    def fn(x, y):
        return (torch.nn.functional.linear(x, w).relu() * y.shape[0],)

    first = [torch.randn(5, 16), torch.randn(3)]
    gm, _ = symbolic_graph(fn, first, [[], [0]])
    counting = Counting()
    with use_triton_for_cpu() as backend, settings_scope(max_autotune=True):
        recording(backend)
        compiled = kiln_inductor.compile_fx(gm, first, compile_graph=counting)
        for n in (3, 7):
            x, y = torch.randn(5, 16), torch.randn(n)
            torch.testing.assert_close(compiled(x, y), fn(x, y), **TOL)
    assert counting.graphs[0].stats["externs"] == 1
    assert [src.size_args for src in backend.sources] == [("s0",)]
