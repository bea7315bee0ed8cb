"""kiln-triton on a real GPU (``-m gpu``; skipped without CUDA or under the interpreter):
the op sweep on CUDA tensors (libdevice math, float64, bfloat16, persistent and looped
reductions), int64 indexing, autotuning with its disk cache, CUDA graphs in
reduce-overhead mode, and transformer-style models (inference and training) through
``torch.compile(backend=kiln_triton.compile_fx)``, all compared with eager."""

from __future__ import annotations

import logging

import pytest
import test_ops_sweep as sweep
import torch
import torch.nn as nn
import torch.nn.functional as F
from batch import Case, assert_case, make, run_batch

import kiln_triton
from kiln_triton.config import settings_scope
from kiln_triton.cudagraphs import CudaGraphRunner
from kiln_triton.testing import Block, SmallGPT

pytestmark = pytest.mark.gpu
aten = torch.ops.aten
CUDA = "cuda"
GPU_ONLY_UNARY = {
    "asin": (aten.asin.default, "unit"),
    "acos": (aten.acos.default, "unit"),
    "atan": (aten.atan.default, "any"),
    "lgamma": (aten.lgamma.default, "pos"),
}


def _gpu(fn):
    return lambda s, *a, **k: fn(s, *a, device=CUDA, **k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_unary_sweep_on_gpu(dtype):
    cases = []
    ops = {**sweep.UNARY, **GPU_ONLY_UNARY}
    for name, (fn, domain) in ops.items():
        for vname, variant in sweep.VARIANTS.items():
            x = variant(lambda s, d=domain: make(s, dtype, d, device=CUDA))
            cases.append(Case(f"{name}/{vname}", fn, (x,)))
    results = run_batch(cases)
    for c in cases:
        tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
        if c.label.startswith("to_bf16") or c.label.startswith("lgamma"):
            tol = {"rtol": 1e-2, "atol": 1e-2} if dtype != torch.float64 else {}
        assert_case(results[c.label], **tol)


def test_binary_sweep_on_gpu():
    cases = []
    for name, (fn, dts, domain) in sweep.BINARY.items():
        for dt in dts:
            for vname, variant in sweep.BINARY_VARIANTS.items():
                a, b = variant(
                    lambda s, side, dt=dt, d=domain: make(
                        s, dt, d if side == "r" else "any", device=CUDA
                    )
                )
                cases.append(Case(f"{name}/{dt}/{vname}", fn, (a, b)))
    results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label])


@pytest.mark.parametrize(
    "dtype,persistent_max",
    [(torch.float32, 8192), (torch.float32, 64), (torch.bfloat16, 8192)],
    ids=["float32-persistent", "float32-looped", "bfloat16-persistent"],
)
def test_reduction_sweep_on_gpu(dtype, persistent_max):
    cases = []
    for name, fn in sweep.REDUCTIONS.items():
        for vname, variant in {**sweep.RED_VARIANTS, "large": lambda mk: mk((4, 70000))}.items():
            if name == "prod" and vname == "large":
                continue  # a product of 70000 factors under- or overflows by order
            x = variant(lambda s: make(s, dtype, device=CUDA))
            cases.append(Case(f"{name}/{vname}", fn, (x,)))
    with settings_scope(persistent_max=persistent_max):
        results = run_batch(cases)
    for c in cases:
        if dtype == torch.bfloat16 and c.label.endswith("/large") and "sum" in c.label:
            continue  # eager accumulates bfloat16 sums differently over huge rows
        tol = (
            {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 5e-2, "atol": 5e-2}
        )
        assert_case(results[c.label], **tol)


def test_nan_propagates_through_max_and_argmax():
    x = make((8, 300), torch.float32, device=CUDA)
    x[3, 17] = float("nan")
    x[5, 250] = float("nan")
    cases = [
        Case("amax", lambda t: aten.amax.default(t, [1]), (x,)),
        Case("argmax", lambda t: aten.argmax.default(t, 1), (x,)),
        Case("max_dim", lambda t: aten.max.dim(t, 1), (x,)),
        Case("softmax", lambda t: aten._softmax.default(t, 1, False), (x,)),
    ]
    results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label])


def test_views_cat_and_indexing_on_gpu():
    for layout in ("contig", "noncontig"):
        base = make((4, 6, 5), torch.float32, device=CUDA)
        if layout == "noncontig":
            base = make((5, 6, 4), torch.float32, device=CUDA).permute(2, 1, 0)
        results = run_batch([Case(n, fn, (base,)) for n, fn in sweep.VIEWS.items()])
        for n in sweep.VIEWS:
            assert_case(results[n])
    table = make((1000, 64), torch.bfloat16, device=CUDA)
    tokens = torch.randint(0, 1000, (4, 33), device=CUDA)
    pad = make((4, 6, 5), torch.float32, device=CUDA)
    cases = [
        Case("embedding", lambda w, t: aten.embedding.default(w, t), (table, tokens)),
        Case("pad", lambda a: aten.constant_pad_nd.default(a, [1, 2, 0, 1], 1), (pad,)),
        Case("cat", lambda a: aten.cat.default([a, aten.mul.Tensor(a, 2)], 2), (pad,)),
    ]
    results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label])


def test_scatter_ops_on_gpu():
    """index_put, scatter, scatter_add, index_add and embedding_dense_backward as kernels
    with atomic adds on CUDA tensors (the cases test_scatter.py runs in the interpreter),
    and the gradients of F.embedding and advanced indexing they compute in training."""
    from kiln_inductor.testing import Gather, check_compiled, check_scatter_training, scatter_cases

    for name, (fn, inputs, tol) in scatter_cases(CUDA).items():
        compiled = check_compiled(fn, inputs, *((tol, tol) if tol else ()))
        stats = compiled.stats
        assert not stats["fallbacks"] and not stats["externs"], (name, stats)
    ids = torch.randint(0, 12, (4, 64), device=CUDA)
    rows = torch.randint(-9, 9, (4, 64), device=CUDA)
    for graph in check_scatter_training(Gather(3, True).to(CUDA), ids, rows):
        assert not graph.stats["fallbacks"] and not graph.stats["externs"], graph.stats


def test_int64_indexing_past_two_billion_elements():
    x = torch.randn(2**31 + 1024, dtype=torch.bfloat16, device=CUDA)
    results = run_batch([Case("mul", lambda t: aten.add.Tensor(aten.mul.Tensor(t, 2), 1), (x,))])
    ((e, g),) = results["mul"]
    assert torch.equal(e[-4096:], g[-4096:]) and torch.equal(e[:4096], g[:4096])
    del x, e, g, results
    torch.cuda.empty_cache()


def test_autotuning_picks_and_caches_a_winner(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    x = make((4096, 1000), torch.float32, device=CUDA)
    with settings_scope(autotune=True, max_autotune=True):
        results = run_batch([Case("softmax", lambda t: aten._softmax.default(t, 1, False), (x,))])
    assert_case(results["softmax"])
    assert list((tmp_path / "triton-autotune").rglob("winner.json"))


def test_direct_launch_after_the_first_call_and_triton_path_for_misaligned_input(monkeypatch):
    from kiln_triton.runtime.direct import DirectLaunch

    outcomes = []
    real = DirectLaunch.__call__

    def record(self, args):
        outcomes.append(real(self, args))
        return outcomes[-1]

    monkeypatch.setattr(DirectLaunch, "__call__", record)
    # the Python direct path: with C launches on, the wrapper calls a C Launcher instead
    # (test_c_launch_runs_kernels_between_calls_and_in_cuda_graphs)
    monkeypatch.setenv("KILN_TRITON_C_LAUNCH", "0")
    fn = torch.fx.symbolic_trace(lambda x, y: (torch.sigmoid(x) * y + 1,))
    x, y = make((1000,), torch.float32, device=CUDA), make((1000,), torch.float32, device=CUDA)
    compiled = kiln_triton.compile_fx(fn, [x, y])
    for k in range(3):  # new values each call
        x = make((1000,), torch.float32, device=CUDA) * (k + 1)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert outcomes == [True, True]  # the first call goes through Triton and builds it
    base = make((1001,), torch.float32, device=CUDA)
    shifted = base[1:]  # 4 bytes past a 16-byte boundary: Triton's path specializes anew
    seen = len(outcomes)
    torch.testing.assert_close(compiled(shifted, y), fn(shifted, y))
    assert True not in outcomes[seen:]  # refused (or a new graph for the new offset)
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert outcomes[-1] is True


class _LinearGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(384, 768)

    def forward(self, x):
        return (F.gelu(self.lin(x), approximate="tanh") * 2,)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_matmul_template_with_epilogue_under_max_autotune(tmp_path, monkeypatch, dtype):
    from kiln_triton.runtime.template import CUBLAS, MatmulConfig, TemplateLauncher

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    x = torch.randn(512, 384, device=CUDA, dtype=dtype)
    fn = torch.fx.symbolic_trace(_LinearGelu().to(CUDA, dtype))
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    choices = []
    real = TemplateLauncher.choose

    def record(self, args):
        choices.append(real(self, args))
        return choices[-1]

    monkeypatch.setattr(TemplateLauncher, "choose", record)
    # the measured choice, even where the run turns autotuning off (final.sh does)
    with torch.no_grad(), settings_scope(autotune=True):
        compiled = kiln_triton.compile_fx(fn, [x], mode="max-autotune-no-cudagraphs")
        for _ in range(2):
            x = torch.randn(512, 384, device=CUDA, dtype=dtype)
            torch.testing.assert_close(compiled(x), fn(x), **tol)
    assert len(choices) == 1 and (choices[0] == CUBLAS or isinstance(choices[0], MatmulConfig))
    assert list((tmp_path / "triton-autotune").rglob("winner.json"))
    # each way on its own is right
    for forced in (CUBLAS, MatmulConfig(64, 64, 32, 8, 4, 3)):
        monkeypatch.setattr(TemplateLauncher, "choose", lambda self, args, f=forced: f)
        with torch.no_grad():
            compiled = kiln_triton.compile_fx(fn, [x], mode="max-autotune-no-cudagraphs")
            torch.testing.assert_close(compiled(x), fn(x), **tol)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 64))


def test_reduce_overhead_replays_cuda_graphs_correctly():
    torch.manual_seed(0)
    model = _mlp().to(CUDA).eval()
    x = torch.randn(1, 64, device=CUDA)
    with torch.no_grad():
        runner = kiln_triton.compile_fx(torch.fx.symbolic_trace(model), [x], mode="reduce-overhead")
        assert isinstance(runner, CudaGraphRunner)
        torch.testing.assert_close(runner(x), model(x), rtol=1e-4, atol=1e-4)
        assert len(runner.graphs) == 1 and None not in runner.graphs.values()
        for _ in range(3):  # new values each call: replays must read them
            x2 = torch.randn(1, 64, device=CUDA)
            torch.testing.assert_close(runner(x2), model(x2), rtol=1e-4, atol=1e-4)
        assert runner.replays == 4  # the first call replays the graph it captured
        kept = runner(x2)
        runner(torch.randn(1, 64, device=CUDA))
        torch.testing.assert_close(kept, model(x2), rtol=1e-4, atol=1e-4)  # not overwritten
        x3 = torch.randn(5, 64, device=CUDA)  # a new shape: captured anew
        torch.testing.assert_close(runner(x3), model(x3), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(runner(x3 * 2), model(x3 * 2), rtol=1e-4, atol=1e-4)
        assert len(runner.graphs) == 2 and runner.replays == 8


def test_torch_compile_reduce_overhead_mode():
    torch.manual_seed(0)
    model = _mlp().to(CUDA).eval()
    compiled = torch.compile(
        model,
        dynamic=False,
        backend=lambda gm, ex: kiln_triton.compile_fx(gm, ex, mode="reduce-overhead"),
    )
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 64, device=CUDA)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_transformer_block_inference(dtype):
    torch.manual_seed(0)
    model = Block(d=128, heads=4).to(CUDA, dtype).eval()
    x = torch.randn(4, 64, 128, device=CUDA, dtype=dtype)
    with torch.no_grad():
        compiled = torch.compile(model, backend=kiln_triton.compile_fx)
        tol = (
            {"rtol": 1e-3, "atol": 1e-3} if dtype == torch.float32 else {"rtol": 3e-2, "atol": 3e-2}
        )
        torch.testing.assert_close(compiled(x), model(x), **tol)


def test_gpt2_style_forward_and_backward_match_eager():
    torch.manual_seed(0)
    model = SmallGPT(vocab=512, d=128).to(CUDA)
    ref = SmallGPT(vocab=512, d=128).to(CUDA)
    ref.load_state_dict(model.state_dict())
    idx = torch.randint(0, 512, (4, 64), device=CUDA)
    target = torch.randint(0, 512, (4, 64), device=CUDA)
    compiled = torch.compile(model, backend=kiln_triton.compile_fx)
    loss = F.cross_entropy(compiled(idx).flatten(0, 1), target.flatten())
    loss.backward()
    ref_loss = F.cross_entropy(ref(idx).flatten(0, 1), target.flatten())
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)


def test_reduce_overhead_training_replays_forward_and_backward_graphs(caplog):
    # a GPT-style model trained for a few steps under torch.compile(mode="reduce-overhead"):
    # the forward and the backward graph replay every step, parameters and losses stay
    # with eager's; gradients accumulated over two steps run without the backward's graph
    import copy

    from kiln_triton import cudagraphs

    torch.manual_seed(0)
    model = SmallGPT(vocab=256, d=64, ctx=32).to(CUDA)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)

    def loss_of(m, i, t):
        return F.cross_entropy(m(i).flatten(0, 1), t.flatten())

    earlier = set(cudagraphs._RUNNERS)
    compiled = torch.compile(
        lambda i, t: loss_of(model, i, t),
        dynamic=False,
        backend=lambda gm, ex: kiln_triton.compile_fx(gm, ex, mode="reduce-overhead"),
    )
    for step in range(4):
        i = torch.randint(0, 256, (2, 32), device=CUDA)
        t = torch.randint(0, 256, (2, 32), device=CUDA)
        loss, want = compiled(i, t), loss_of(ref, i, t)
        loss.backward()
        want.backward()
        torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-4)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=f"{step} {name}")
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    mine = set(cudagraphs._RUNNERS) - earlier
    runners = {r.name.rsplit(".", 1)[-1]: r for r in mine if "." in r.name}
    fw, bw = runners["forward"], runners["backward"]
    assert fw.replays >= 4 and bw.replays >= 4
    assert all(e is not None and e.borrowed for e in bw.graphs.values())
    with caplog.at_level(logging.WARNING, logger="kiln_inductor"):
        before = bw.replays
        for _ in range(2):  # accumulated: the second backward may not overwrite param.grad
            i = torch.randint(0, 256, (2, 32), device=CUDA)
            t = torch.randint(0, 256, (2, 32), device=CUDA)
            compiled(i, t).backward()
            loss_of(ref, i, t).backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)
        assert bw.replays == before + 1
    assert "lent out are still alive" in caplog.text


class _Cached(nn.Module):
    """Decoding with a cache written in place: the pattern of static KV caches."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.register_buffer("cache", torch.zeros(16, 32))

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, self.proj(x))
        return torch.softmax(x @ self.cache.T, dim=-1) @ self.cache


@pytest.mark.parametrize("grad_off", [torch.no_grad, torch.inference_mode])
def test_reduce_overhead_updates_a_cache_written_in_place(grad_off):
    torch.manual_seed(0)
    model = _Cached().to(CUDA).eval()
    ref = _Cached().to(CUDA).eval()
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(
        model,
        dynamic=False,
        backend=lambda gm, ex: kiln_triton.compile_fx(gm, ex, mode="reduce-overhead"),
    )
    with grad_off():
        for k in range(5):
            x = torch.randn(1, 32, device=CUDA)
            pos = torch.tensor([k], device=CUDA)
            torch.testing.assert_close(compiled(x, pos), ref(x, pos), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(model.cache, ref.cache, rtol=1e-5, atol=1e-5)


# last: a failed capture is the most likely to disturb the CUDA context for what follows
def test_capture_failure_falls_back_with_a_logged_reason(caplog):
    def fn(x):
        return (x * x.sum().item(),)  # .item() synchronizes: not capturable

    x = torch.randn(64, device=CUDA)
    runner = CudaGraphRunner(fn, "syncing")
    with caplog.at_level(logging.WARNING, logger="kiln_inductor"):
        out, out2 = runner(x)[0], runner(x * 2)[0]
    torch.testing.assert_close(out, fn(x)[0])
    torch.testing.assert_close(out2, fn(x * 2)[0])
    assert list(runner.graphs.values()) == [None] and runner.replays == 0
    assert "CUDA graph capture of syncing failed" in caplog.text
    # the failed capture left CUDA's random number generator usable (it raised "Offset
    # increment outside graph capture encountered unexpectedly" before)
    torch.manual_seed(0)
    a = torch.randint(0, 50, (4, 32), device=CUDA)
    torch.manual_seed(0)
    assert torch.equal(a, torch.randint(0, 50, (4, 32), device=CUDA))
    torch.testing.assert_close(runner(x)[0], fn(x)[0])


def test_c_launch_runs_kernels_between_calls_and_in_cuda_graphs(monkeypatch):
    from kiln_triton.runtime.direct import DirectLaunch

    built = []
    real = DirectLaunch.build.__func__

    def record(cls, *a, **k):
        built.append(real(cls, *a, **k))
        return built[-1]

    monkeypatch.setattr(DirectLaunch, "build", classmethod(record))
    fn = torch.fx.symbolic_trace(
        lambda x, y: (torch.softmax(torch.sigmoid(x) * y + 1, -1), (x * y).sum(-1))
    )
    x, y = (
        make((64, 1000), torch.float32, device=CUDA),
        make((64, 1000), torch.float32, device=CUDA),
    )
    for mode in (None, "reduce-overhead"):
        compiled = kiln_triton.compile_fx(fn, [x, y], mode=mode)
        for k in range(4):  # new values each call: every launch reads them
            x = make((64, 1000), torch.float32, device=CUDA) * (k + 1)
            for got, want in zip(compiled(x, y), fn(x, y)):
                torch.testing.assert_close(got, want)
    assert built and all(b is not None and b.c_shape is not None for b in built)
    # a misaligned input the kernel assumes aligned: the C Launcher hands it to Triton
    shifted = make((64 * 1000 + 1,), torch.float32, device=CUDA)[1:].view(64, 1000)
    compiled = kiln_triton.compile_fx(fn, [x, y])
    compiled(x, y)
    for got, want in zip(compiled(shifted, y), fn(shifted, y)):
        torch.testing.assert_close(got, want)


def test_reduce_overhead_forwards_the_guarded_call_for_training_and_replays():
    # parameters are graph inputs, as in the graphs kiln-capture hands over
    def mlp(x, w1, b1, w2, b2):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)

    torch.manual_seed(0)
    params = [
        (torch.randn(*s, device=CUDA) * 0.1).requires_grad_()
        for s in ((128, 64), (128,), (32, 128), (32,))
    ]
    from kiln_triton import cudagraphs

    gm = torch.fx.symbolic_trace(mlp)
    x = torch.randn(16, 64, device=CUDA)
    earlier = set(cudagraphs._RUNNERS)
    runner = kiln_triton.compile_fx(gm, [x, *params], mode="reduce-overhead")
    call = runner.kiln_guarded_call  # for inputs matching the examples' metadata
    for _ in range(3):  # training: the guarded call runs the forward and backward runners
        xk = torch.randn(16, 64, device=CUDA)
        out = call(xk, *params)
        got = torch.autograd.grad(out.square().sum(), params)
        ref = mlp(xk, *params)
        want = torch.autograd.grad(ref.square().sum(), params)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        del got, g  # lent gradients: the next backward replays once they are gone
    roles = {r.name.rsplit(".", 1)[-1]: r for r in set(cudagraphs._RUNNERS) - earlier}
    assert roles["forward"].replays == 3 and roles["backward"].replays == 3
    assert runner.graphs == {}  # training went past the runner around the call
    with torch.no_grad():  # inference: captured once, then replayed with new values
        for k in range(3):
            xk = torch.randn(16, 64, device=CUDA) * (k + 1)
            torch.testing.assert_close(call(xk, *params), mlp(xk, *params), rtol=1e-4, atol=1e-4)
    assert runner.replays == 3
