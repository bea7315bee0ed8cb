"""Where a compiled model's per-call time goes on the GPU: eager vs torch.compile vs kiln.

    python benchmarks/gpu/overhead.py [--models gpt2,hf_vit] [--size small] [--calls 200]

Small models on a fast GPU are bound by the host: the GPU waits for Python to launch the
next kernel. Per model this prints the host time per call (calls issued back to back, one
synchronize at the end: what the host can sustain) and the device-synchronized latency,
for eager, torch.compile and kiln.compile, kiln with Triton's own launch path instead of
its direct launches, and the top of a cProfile of kiln's calls. JSON goes to --out.
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
    return ZOO[name][1]("cuda", dtype, size)


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
            for direct in ("1", "0"):
                os.environ["KILN_TRITON_DIRECT_LAUNCH"] = direct
                kiln.reset()
                km = kiln.compile(model)
                call(km, args)
                label = "kiln" if direct == "1" else "kiln (triton launch path)"
                row[label] = host_us(km, args, a.calls)
                if direct == "1":
                    prof = profile(km, args, a.calls)
            import kiln_triton

            torch._dynamo.reset()
            tk = torch.compile(model, backend=kiln_triton.compile_fx, dynamic=False)
            call(tk, args)
            row["torch.compile(backend=kiln)"] = host_us(tk, args, a.calls)
            os.environ.pop("KILN_TRITON_DIRECT_LAUNCH")
        rows.append(row)
        print(f"\n== {name} ({a.dtype}, {a.size}): host us/call, synchronized us/call")
        for k, v in row.items():
            if isinstance(v, tuple):
                print(f"  {k:28s} {v[0]:9.1f} {v[1]:9.1f}")
        print(prof)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "overhead.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
