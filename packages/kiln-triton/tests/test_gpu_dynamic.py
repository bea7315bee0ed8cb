"""Symbolic sizes through kiln-triton on a real GPU (``-m gpu``; skipped without CUDA or
under the interpreter): one compilation serving every size with direct launches per size
specialization, sizes past int32, autotuning once per size bucket with its disk cache,
training, and ``mode="reduce-overhead"`` recording one CUDA graph per size bucket up to a
bound. The interpreter's versions: test_dynamic.py.

    KILN_TRITON_TEST_GPU=1 python -m pytest packages/kiln-triton/tests/test_gpu_dynamic.py -m gpu
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from symbolic import Counting, launchers, symbolic_graph
from torch import nn

import kiln_inductor
import kiln_triton
from kiln_triton.config import settings_scope
from kiln_triton.cudagraphs import MAX_GRAPHS, CudaGraphRunner
from kiln_triton.runtime.buckets import bucket_of
from kiln_triton.runtime.launcher import TritonLauncher

pytestmark = pytest.mark.gpu
CUDA = "cuda"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dynamic_sizes_one_compilation_and_direct_launches(dtype, monkeypatch):
    monkeypatch.setenv("KILN_TRITON_AUTOTUNE", "0")
    torch.manual_seed(0)
    w = torch.randn(768, device=CUDA, dtype=dtype)

    def fn(x, y):
        a = F.layer_norm(x.sin() * y + 1, (768,), w)
        return a.softmax(-1), a.sum(1), x.float().softmax(1), x.float().cumsum(1)

    def inputs(b, t):
        return (
            torch.randn(b, t, 768, device=CUDA, dtype=dtype),
            torch.randn(b, t, 768, device=CUDA, dtype=dtype),
        )

    sizes = [(3, 5), (2, 1021), (1, 9001), (8, 128), (3, 5), (2, 1021), (5, 17)]
    first = inputs(*sizes[0])
    gm, _ = symbolic_graph(fn, first, [[0, 1], [0, 1]])
    counting = Counting()
    compiled = kiln_inductor.compile_fx(gm, first, compile_graph=counting)
    low = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    for b, t in sizes:
        # a bfloat16 sum of the fused layer_norm's float32 values (eager sums them rounded,
        # static shapes differ alike): about one rounding of each term, sqrt(t) of them
        # (float32: another summation order)
        wide = {"rtol": 1e-4, "atol": 2e-5 * t**0.5}
        total = {"rtol": 2e-2, "atol": 0.05 * t**0.5} if dtype == torch.bfloat16 else wide
        # a bfloat16 softmax of layer_norm values: a value rounded to the other side of a
        # bfloat16 boundary (an ulp of 0.0625 past 8) moves its exp by up to 6.5%
        soft = {"rtol": 0.1, "atol": 1e-2} if dtype == torch.bfloat16 else low
        tols = [soft, total, {"rtol": 1e-4, "atol": 1e-5}, {"rtol": 1e-4, "atol": 1e-2}]
        x, y = inputs(b, t)
        for k, (got, want, tol) in enumerate(zip(compiled(x, y), fn(x, y), tols)):
            where = f"sizes {(b, t)}, output {k}"
            torch.testing.assert_close(got, want, **tol, msg=lambda m, w=where: f"{w}: {m}")
    assert len(counting.graphs) == 1
    sized = [ln for ln in launchers(counting.graphs[0]) if ln.sized is not None]
    assert sized
    # sizes seen again launched directly (one direct launch per bucket and specialization)
    assert all(any(b.directs for b in ln._buckets.values()) for ln in sized)
    # and through kiln_triton._launch, the sizes after the tensors (the sizes seen again
    # above were checked against eager on that path)
    directs = [d for ln in sized for b in ln._buckets.values() for d in b.directs.values() if d]
    assert any(d.c_shape is not None for d in directs)
    # whose kernels the wrapper calls through a SizedLauncher: at sizes seen before, they
    # launch from its table with no call into Python (TritonLauncher.__call__)
    entered: list = []
    real_call = TritonLauncher.__call__

    def call(self, *args):
        entered.append(self)
        return real_call(self, *args)

    monkeypatch.setattr(TritonLauncher, "__call__", call)
    x, y = inputs(2, 1021)
    for got, want in zip(compiled(x, y), fn(x, y)):
        assert got.shape == want.shape
    from_c = [ln for ln in sized if type(ln.fast).__name__ == "SizedLauncher"]
    assert from_c and any(all(e is not ln for e in entered) for ln in from_c), entered
    # rows of symbolic length t (softmax and sum over dim 1): the module's persistent
    # kernel up to its limit (t = 5, 17, 128, 1021), the looped one past it (t = 9001)
    variants = {(b, e.fn is ln.persistent) for ln in sized for b, e in ln._buckets.items()}
    assert any(p for _, p in variants) and any(not p for _, p in variants)


def test_dynamic_size_past_int32_runs_the_int64_specialization():
    def fn(x):
        return (x * 2 + 1,)

    first = torch.ones(1000, dtype=torch.int8, device=CUDA)
    gm, _ = symbolic_graph(fn, [first], [[0]])
    compiled = kiln_inductor.compile_fx(gm, [first], compile_graph=Counting())
    torch.testing.assert_close(compiled(first)[0], fn(first)[0])
    big = torch.ones(2**31 + 17, dtype=torch.int8, device=CUDA)
    big[-1] = 3
    out = compiled(big)[0]
    assert out.shape == big.shape and int(out[-1]) == 7 and int(out[0]) == 3
    assert bool((out[: 2**20] == 3).all()) and bool((out[-(2**20) : -1] == 3).all())
    del big, out
    torch.cuda.empty_cache()


def test_dynamic_autotuning_once_per_size_bucket_with_a_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    measured: list[tuple[int, ...]] = []
    real = TritonLauncher.measure

    def measure(self, cands, args, rounds=3, launcher_for=None):
        if self.sized is not None:
            measured.append(bucket_of(args[len(args) - len(self.sized.names) :]))
        return real(self, cands, args, rounds, launcher_for)

    monkeypatch.setattr(TritonLauncher, "measure", measure)

    def fn(x):
        return (x.softmax(-1) * 2,)

    def run(sizes):
        gm, _ = symbolic_graph(fn, [torch.randn(64, 100, device=CUDA)], [[0, 1]])
        with settings_scope(autotune=True, max_autotune=True):
            compiled = kiln_inductor.compile_fx(gm, [torch.randn(64, 100, device=CUDA)])
            for b, t in sizes:
                x = torch.randn(b, t, device=CUDA)
                torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-5)

    run([(64, 100), (50, 120), (64, 100), (1000, 3000)])
    assert sorted(set(measured)) == [(64, 128), (1024, 4096)]
    assert len(measured) == 2  # one kernel, two buckets, each measured once
    assert len(list((tmp_path / "triton-autotune").rglob("winner.json"))) == 2
    measured.clear()
    run([(60, 127), (999, 2049)])  # a new compilation: both buckets from disk
    assert measured == []


class Mixer(nn.Module):
    """Linear layers, layer norm and a softmax over the (symbolic) sequence dimension.
    (Causal attention with 4-D matmuls does not trace under torch 2.11 with symbolic
    sizes yet: kiln-aot's decomposition of matmul reaches ``aten.size``.)"""

    def __init__(self, d: int = 64):
        super().__init__()
        self.ln, self.lin, self.out = nn.LayerNorm(d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = F.silu(self.lin(self.ln(x)))
        return x + self.out(h * h.softmax(1))


def test_dynamic_training_step():
    torch.manual_seed(0)
    model = Mixer().to(CUDA)
    ref = Mixer().to(CUDA)
    ref.load_state_dict(model.state_dict())
    first = torch.randn(2, 9, 64, device=CUDA, requires_grad=True)
    gm, _ = symbolic_graph(model, [first], [[0, 1]])
    counting = Counting()
    compiled = kiln_inductor.compile_fx(gm, [first], compile_graph=counting)
    for b, t in [(2, 9), (3, 31), (1, 130), (4, 7)]:
        x = torch.randn(b, t, 64, device=CUDA)
        x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        out, want = compiled(x1), ref(x2)
        out.square().mean().backward()
        want.square().mean().backward()
        torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-3, atol=1e-4)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)
            p.grad = q.grad = None
    assert len(counting.graphs) == 2  # one forward and one backward graph for every size


def test_dynamic_reduce_overhead_records_one_cuda_graph_per_size_bucket(caplog):
    torch.manual_seed(0)
    w = torch.randn(64, 64, device=CUDA)

    def fn(x):
        return ((x @ w).relu().softmax(-1),)

    first = torch.randn(3, 64, device=CUDA)
    gm, _ = symbolic_graph(fn, [first], [[0]])
    sizes = [3, 3, 5, 7, 5, 9, 17, 33, 65, 129, 257, 513, 1025, 2049, 5, 7]
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln_inductor"):
        runner = kiln_triton.compile_fx(gm, [first], mode="reduce-overhead")
        assert isinstance(runner, CudaGraphRunner)
        for n in sizes:
            x = torch.randn(n, 64, device=CUDA)
            torch.testing.assert_close(runner(x)[0], fn(x)[0], rtol=1e-4, atol=1e-4)
    assert len(runner.graphs) == MAX_GRAPHS and None not in runner.graphs.values()
    assert sorted(k[0][0][0] for k in runner.graphs) == [3, 5, 9, 17, 33, 65, 129, 257]
    # replays: each recorded size when recorded, then 3 once and 5 twice again; 7 (bucket
    # 8 holds 5's graph) and the sizes past the bound ran the compiled graph without one
    assert runner.replays == MAX_GRAPHS + 3
    assert "one graph per size bucket" in caplog.text
    assert f"has captured {MAX_GRAPHS} CUDA graphs" in caplog.text
