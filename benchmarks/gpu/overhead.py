"""Where a compiled model's per-call time goes on the GPU: eager vs torch.compile vs kiln.

    python benchmarks/gpu/overhead.py [--models gpt2,hf_vit] [--size small] [--calls 200]

Small models on a fast GPU are bound by the host: the GPU waits for Python to launch the
next kernel. Per model this prints the host time per call (calls issued back to back, one
synchronize at the end: what the host can sustain) and the device-synchronized latency,
for eager, torch.compile and kiln.compile, kiln with Triton's own launch path instead of
its direct launches, the top of a cProfile of kiln's calls, and from torch.profiler the GPU
kernel time per call (host time above it: host-bound) with the kernels taking the most of it.
Models run in eval mode. JSON goes to --out.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zoo import ZOO


def call(fn, args):
    return fn(**args) if isinstance(args, dict) else fn(*args)


def host_us(fn, args, calls: int) -> float:
    """Median over 5 rounds of host microseconds per call, calls issued back to back."""
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            call(fn, args)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        rounds.append(((t1 - t0) * 1e6 / calls, (t2 - t0) * 1e6 / calls))
    return statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds)


def build(name: str, dtype: torch.dtype, size: str):
    if name == "small_gpt":  # the batch-1 model of triton_kernels.py's reduce-overhead row
        from kiln_triton.testing import SmallGPT

        torch.manual_seed(0)
        model = SmallGPT().to("cuda", dtype).eval()
        return model, (torch.randint(0, 1024, (1, 32), device="cuda"),)
    model, args = ZOO[name][1]("cuda", dtype, size)
    return model.eval(), args


def device_profile(fn, args, calls: int = 20, top: int = 8) -> tuple[float, str]:
    """GPU kernel microseconds per call (summed over kernels: below the host time per call,
    the model is host-bound) and the kernels that take the most of it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call(fn, args)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events) / calls
    lines = [
        f"    {e.self_device_time_total / calls:8.1f} us  {e.count // calls:4d}x  {e.key[:90]}"
        for e in events[:top]
    ]
    return total, "\n".join(lines)


def profile(fn, args, calls: int, top: int = 22) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call(fn, args)
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    pstats.Stats(prof, stream=out).sort_stats("cumtime").print_stats(top)
    return out.getvalue()


def main() -> int:
    import kiln

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", default="gpt2,hf_vit,small_gpt")
    p.add_argument("--size", default="small")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results/gpu"))
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    rows = []
    for name in a.models.split(","):
        model, args = build(name, dtype, a.size)
        row = {"model": name}
        with torch.no_grad():
            row["eager"] = host_us(model, args, a.calls)
            tc = torch.compile(model)
            call(tc, args)
            row["torch.compile"] = host_us(tc, args, a.calls)
            kernels = {
                "eager": device_profile(model, args),
                "torch.compile": device_profile(tc, args),
            }
            for direct in ("1", "0"):
                os.environ["KILN_TRITON_DIRECT_LAUNCH"] = direct
                kiln.reset()
                km = kiln.compile(model)
                call(km, args)
                label = "kiln" if direct == "1" else "kiln (triton launch path)"
                row[label] = host_us(km, args, a.calls)
                if direct == "1":
                    prof = profile(km, args, a.calls)
                    kernels["kiln"] = device_profile(km, args)
            import kiln_triton

            torch._dynamo.reset()
            tk = torch.compile(model, backend=kiln_triton.compile_fx, dynamic=False)
            call(tk, args)
            row["torch.compile(backend=kiln)"] = host_us(tk, args, a.calls)
            os.environ.pop("KILN_TRITON_DIRECT_LAUNCH")
        row["gpu_us"] = {k: v[0] for k, v in kernels.items()}
        rows.append(row)
        print(f"\n== {name} ({a.dtype}, {a.size}): host us/call, synchronized us/call, GPU us/call")
        for k, v in row.items():
            if isinstance(v, tuple):
                gpu = f"{kernels[k][0]:9.1f}" if k in kernels else ""
                print(f"  {k:28s} {v[0]:9.1f} {v[1]:9.1f} {gpu}")
        for k, (total, lines) in kernels.items():
            print(f"  -- {k}: kernels taking the most GPU time per call (of {total:.1f} us)")
            print(lines)
        print(prof)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "overhead.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
