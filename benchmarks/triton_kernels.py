"""Triton kernels on a GPU: eager vs torch.compile vs kiln (kiln_triton), side by side.

    python benchmarks/triton_kernels.py [--out DIR] [--iters 50]

Rows, all measured in one run on one GPU:
  copy         device-to-device copy of 64M float32: the bandwidth ceiling of this run
  pointwise8   an 8-op pointwise chain over 64M float32 (goal: kiln >= 80% of copy)
  softmax      over (32768, 4096), bfloat16 and float32 (goal: kiln >= torch.compile)
  layer_norm   over (32768, 4096) with weight and bias, bfloat16 and float32
  small model  a batch-1 GPT-style model: per-call time of default vs reduce-overhead
               (CUDA graphs), for kiln and for torch.compile; and per-step time of its
               training (forward, backward, an SGD step), the same way

Large kernels are timed with CUDA events around 10 calls issued back to back (median of
``--iters`` such batches after warm-up, so host launch overhead overlaps the GPU's work),
the compilers taking turns in five slices so drift during the run falls on all of them;
effective bandwidth counts each input read once and each output written once. The small model is timed on the host (synchronized), since per-call overhead is
what CUDA graphs remove. Every compiled result is compared with eager first. The table is
printed; JSON goes to ``--out`` (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
N_POINTWISE = 64 * 1024 * 1024
ROWS, COLS = 32768, 4096
MATMUL = (8192, 4096, 4096)  # M, K, N of the linear layer with a fused GELU
DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def cuda_times_ms(fn: Callable[[], Any], iters: int, reps: int = 10) -> list[float]:
    """Device milliseconds per call, ``iters`` samples: ``reps`` calls back to back between
    two CUDA events each. Back to back, the host prepares the next launch while the GPU
    runs the last one, so this is the kernels' time, not the host's (unless the host is
    the slower of the two, which is then what a caller sees); host_time_us measures that."""
    for _ in range(3):
        fn()
    if DEVICE != "cuda":  # --cpu-smoke: host timing
        return [host_time_us(fn, calls=1, repeats=iters) / 1e3]
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return times


def cuda_time_ms(fn: Callable[[], Any], iters: int, reps: int = 10) -> float:
    return statistics.median(cuda_times_ms(fn, iters, reps))


def interleaved_ms(
    fns: dict[str, Callable[[], Any]], iters: int, rounds: int = 5
) -> dict[str, float]:
    """Median ms per call of each function, timed in ``rounds`` alternating slices so that
    clock and thermal drift during the run falls on every compiler alike."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name] += cuda_times_ms(fn, max(iters // rounds, 1))
    return {name: statistics.median(t) for name, t in samples.items()}


def host_time_us(fn: Callable[[], Any], calls: int = 200, repeats: int = 5) -> float:
    if DEVICE != "cuda":  # --cpu-smoke: the interpreter is slow
        calls, repeats = 1, min(repeats, 2)
    for _ in range(2):
        fn()
    sync()
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per_call)


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def pointwise8(x: torch.Tensor) -> torch.Tensor:
    y = x * 1.5 + 0.5  # 2
    y = torch.relu(y) - 0.25  # 4
    y = y * x  # 5
    y = torch.sigmoid(y) * 2.0  # 7
    return y + x  # 8


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def kiln_backend(mode: str | None = None) -> Callable[..., Any]:
    import kiln_triton

    return lambda gm, ex: kiln_triton.compile_fx(gm, ex, mode=mode)


def compilers(mode: str | None = None) -> dict[str, Callable[[Callable], Callable]]:
    return {
        "eager": lambda f: f,
        "torch.compile": lambda f: torch.compile(f, mode=mode, dynamic=False),
        "kiln": lambda f: torch.compile(f, backend=kiln_backend(mode), dynamic=False),
    }


def bench_kernel(
    name: str, fn: Callable, args: tuple, nbytes: int, iters: int, tol: float
) -> list[dict]:
    ref = fn(*args)
    compiled: dict[str, Callable] = {}
    rows = []
    for cname, make in compilers().items():
        torch._dynamo.reset()
        c = compiled[cname] = make(fn)
        t0 = time.perf_counter()
        out = c(*args)
        sync()
        compile_s = time.perf_counter() - t0
        err = rel_error(out, ref)
        rows.append({
            "kernel": name, "compiler": cname, "rel_error": err, "correct": err <= tol,
            "compile_s": compile_s if cname != "eager" else 0.0,
        })  # fmt: skip
        del out
    times = interleaved_ms({n: (lambda c=c: c(*args)) for n, c in compiled.items()}, iters)
    for row in rows:
        row["ms"] = times[row["compiler"]]
        row["GB/s"] = nbytes / row["ms"] / 1e6
    return rows


def linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def bench_matmul_epilogue(iters: int, m: int, k: int, n: int) -> list[dict]:
    """A linear layer with its GELU: eager, torch.compile (default mode), kiln default
    (cuBLAS + a fused bias/GELU kernel) and kiln max-autotune (a Triton matmul template
    with bias and GELU fused into it, or cuBLAS, whichever measured faster). torch.compile's
    max-autotune is left out: it spends minutes benchmarking templates in subprocesses."""
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    ref = linear_gelu(x, w, b)
    rows = []
    makers = {
        "eager": lambda f: f,
        "torch.compile": lambda f: torch.compile(f, dynamic=False),
        "kiln": lambda f: torch.compile(f, backend=kiln_backend(None), dynamic=False),
        "kiln max-autotune": lambda f: torch.compile(
            f, backend=kiln_backend("max-autotune-no-cudagraphs"), dynamic=False
        ),
    }
    for cname, make in makers.items():
        torch._dynamo.reset()
        compiled = make(linear_gelu)
        t0 = time.perf_counter()
        out = compiled(x, w, b)
        sync()
        compile_s = time.perf_counter() - t0
        err = rel_error(out, ref)
        ms = cuda_time_ms(lambda c=compiled: c(x, w, b), iters)
        rows.append({
            "kernel": f"linear+gelu bf16 {m}x{k}x{n}", "compiler": cname, "ms": ms,
            "TFLOP/s": 2 * m * k * n / ms / 1e9, "rel_error": err, "correct": err <= 1e-2,
            "compile_s": compile_s if cname != "eager" else 0.0,
        })  # fmt: skip
    return rows


def print_matmul_table(rows: list[dict]) -> str:
    lines = [
        f"{'matmul + epilogue':<34}{'compiler':<20}{'ms':>8}{'TFLOP/s':>9}{'compile s':>11}  correct"
    ]
    for r in rows:
        lines.append(
            f"{r['kernel']:<34}{r['compiler']:<20}{r['ms']:>8.3f}{r['TFLOP/s']:>9.0f}"
            f"{r['compile_s']:>11.1f}  {'yes' if r['correct'] else 'NO'}"
        )
    return "\n".join(lines)


def bench_small_model() -> list[dict]:
    torch.manual_seed(0)
    from kiln_triton.testing import SmallGPT

    model = SmallGPT().to(DEVICE).eval()
    idx = torch.randint(0, 1024, (1, 32), device=DEVICE)
    rows = []
    with torch.no_grad():
        ref = model(idx)
        for mode in (None, "reduce-overhead"):
            for cname, make in compilers(mode).items():
                if cname == "eager" and mode is not None:
                    continue
                torch._dynamo.reset()
                compiled = make(model)
                t0 = time.perf_counter()
                out = compiled(idx)
                sync()
                compile_s = time.perf_counter() - t0
                idx2 = torch.randint(0, 1024, (1, 32), device=DEVICE)  # new values each check
                err = max(rel_error(out, ref), rel_error(compiled(idx2), model(idx2)))
                us = host_time_us(lambda c=compiled: c(idx))
                rows.append({
                    "kernel": "small model b=1", "compiler": cname, "mode": mode or "default",
                    "us_per_call": us, "rel_error": err, "correct": err <= 1e-4, "compile_s": compile_s,
                })  # fmt: skip
    return rows


def bench_small_training(steps: int = 3) -> list[dict]:
    """A training step of the same model at batch 1 (forward, backward, an SGD step):
    per-step time of default vs reduce-overhead (CUDA graphs for the forward and the
    backward graph). Correct: the first step's gradients and the loss after ``steps``
    steps match eager's, from the same initial weights."""
    import copy

    from kiln_triton.testing import SmallGPT

    torch.manual_seed(0)
    base = SmallGPT().to(DEVICE).train()
    idx = torch.randint(0, 1024, (1, 32), device=DEVICE)
    tgt = torch.randint(0, 1024, (1, 32), device=DEVICE)

    def trainer(make: Callable[[Callable], Callable]) -> tuple[Callable[[], Any], Any, list]:
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=True)

        def loss_of(i: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(model(i).flatten(0, 1), t.flatten())

        compiled = make(loss_of)

        def step() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = compiled(idx, tgt)
            loss.backward()
            opt.step()
            return loss

        return step, model, opt

    ref_step, ref_model, _ = trainer(lambda f: f)
    ref_step()
    ref_grads = [p.grad.clone() for p in ref_model.parameters()]
    for _ in range(steps - 1):
        ref_last = ref_step().detach()
    rows = []
    for mode in (None, "reduce-overhead"):
        for cname, make in compilers(mode).items():
            if cname == "eager" and mode is not None:
                continue
            torch._dynamo.reset()
            step, model, _ = trainer(make)
            t0 = time.perf_counter()
            step()
            sync()
            compile_s = time.perf_counter() - t0
            # (no reference to a gradient may outlive the check: a replay of the backward
            # graph would overwrite it, so kiln's runs without its graph while one is alive)
            err = max(rel_error(p.grad, r) for p, r in zip(model.parameters(), ref_grads))
            for _ in range(steps - 1):
                last = step().detach()
            err = max(err, rel_error(last, ref_last))
            us = host_time_us(step, calls=50)
            rows.append({
                "kernel": "small model training b=1", "compiler": cname, "mode": mode or "default",
                "us_per_call": us, "rel_error": err, "correct": err <= 1e-4, "compile_s": compile_s,
            })  # fmt: skip
    return rows


def print_table(rows: list[dict], copy_gbs: float) -> str:
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (interpreter smoke run)"
    lines = [f"device: {name}   copy bandwidth: {copy_gbs:.0f} GB/s", ""]
    lines.append(
        f"{'kernel':<26}{'eager ms':>10}{'torch.compile':>15}{'kiln':>10}{'kiln GB/s':>11}{'% copy':>8}{'kiln/tc':>9}  correct"
    )
    by_kernel: dict[str, dict[str, dict]] = {}
    for r in rows:
        if "ms" in r:
            by_kernel.setdefault(r["kernel"], {})[r["compiler"]] = r
    for k, rs in by_kernel.items():
        if k == "copy":
            continue
        e, t, kl = rs["eager"], rs["torch.compile"], rs["kiln"]
        ok = (
            "yes"
            if t["correct"] and kl["correct"]
            else f"NO (tc {t['rel_error']:.1e}, kiln {kl['rel_error']:.1e})"
        )
        lines.append(
            f"{k:<26}{e['ms']:>10.3f}{t['ms']:>15.3f}{kl['ms']:>10.3f}{kl['GB/s']:>11.0f}"
            f"{100 * kl['GB/s'] / copy_gbs:>7.0f}%{t['ms'] / kl['ms']:>9.2f}  {ok}"
        )
    for title in ("small model b=1", "small model training b=1"):
        small = [r for r in rows if "us_per_call" in r and r["kernel"] == title]
        if not small:
            continue
        lines += ["", f"{title:<26}{'mode':<18}{'us/call':>10}{'compile s':>11}  correct"]
        for r in small:
            lines.append(
                f"{r['compiler']:<26}{r['mode']:<18}{r['us_per_call']:>10.1f}{r['compile_s']:>11.1f}  {r['correct']}"
            )
        k = {r["mode"]: r["us_per_call"] for r in small if r["compiler"] == "kiln"}
        if len(k) == 2:
            lines.append(
                f"kiln reduce-overhead vs default: {k['default'] / k['reduce-overhead']:.2f}x faster per call"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument(
        "--only",
        default="",
        help="run only the rows whose name contains this (no matmul)",
    )
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="tiny sizes on CPU through Triton's interpreter"
    )
    args = ap.parse_args()
    if args.cpu_smoke:
        return cpu_smoke(args)
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU (or --cpu-smoke)"
    return run(args)


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    rows: list[dict] = []
    x = torch.randn(N_POINTWISE, device=DEVICE)
    dst = torch.empty_like(x)
    copy_ms = cuda_time_ms(lambda d=dst, s=x: d.copy_(s), args.iters)
    copy_gbs = 2 * x.numel() * 4 / copy_ms / 1e6
    rows.append({"kernel": "copy", "compiler": "eager", "ms": copy_ms, "GB/s": copy_gbs})
    del dst

    def wanted(name: str) -> bool:
        return args.only in name

    if wanted("pointwise8 64M fp32"):
        rows += bench_kernel(
            "pointwise8 64M fp32", pointwise8, (x,), 2 * x.numel() * 4, args.iters, 1e-5
        )
    del x
    for dtype in (torch.bfloat16, torch.float32):
        tag = "bf16" if dtype == torch.bfloat16 else "fp32"
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
        x = torch.randn(ROWS, COLS, device=DEVICE, dtype=dtype)
        nbytes = 2 * x.numel() * x.element_size()
        if wanted(f"softmax {tag}"):
            rows += bench_kernel(f"softmax {tag}", softmax, (x,), nbytes, args.iters, tol)
        w = torch.randn(COLS, device=DEVICE, dtype=dtype)
        b = torch.randn(COLS, device=DEVICE, dtype=dtype)
        if wanted(f"layer_norm {tag}"):
            rows += bench_kernel(
                f"layer_norm {tag}", layer_norm, (x, w, b), nbytes, args.iters, tol
            )
        del x
        torch.cuda.empty_cache()
    mm_rows = bench_matmul_epilogue(args.iters, *MATMUL) if not args.only else []
    if not args.skip_model and wanted("small model b=1"):
        rows += bench_small_model()
    if not args.skip_model and wanted("small model training b=1"):
        rows += bench_small_training()
    table = print_table(rows, copy_gbs) + "\n\n" + print_matmul_table(mm_rows)
    rows += mm_rows
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "triton_kernels.json").write_text(json.dumps({
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
        "copy_GBps": copy_gbs, "rows": rows,
    }, indent=1))  # fmt: skip
    (out / "triton_kernels.txt").write_text(table + "\n")
    return 0


def cpu_smoke(args: argparse.Namespace) -> int:
    """Check the script's logic without a GPU: tiny sizes, CPU tensors, Triton's
    interpreter through kiln_triton.testing.use_triton_for_cpu."""
    import os

    global DEVICE, N_POINTWISE, ROWS, COLS, MATMUL
    os.environ["TRITON_INTERPRET"] = "1"
    from kiln_triton.testing import use_triton_for_cpu

    DEVICE, N_POINTWISE, ROWS, COLS = "cpu", 4096, 16, 256
    MATMUL = (64, 32, 48)
    args.iters, args.out = 3, args.out + "/cpu-smoke"
    with use_triton_for_cpu():
        return run(args)


if __name__ == "__main__":
    sys.exit(main())
