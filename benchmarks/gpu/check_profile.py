"""Where the GPU index checks' cost goes, for one model (default: small HF GPT-2, bf16):
kiln with checks, without checks, and with checks whose host-side read is made a no-op
(the kernels still check and write their error rows), side by side:

    python3 benchmarks/gpu/check_profile.py [--model gpt2] [--size small]

For each variant: host time per call (perf_counter over back-to-back calls, one
synchronization at the end), device time per call (CUDA events; the variants interleaved round by round), kernels per call and
the CUDA runtime calls made per call (torch.profiler), and host time by Python function
(cProfile).
Prints a table; writes $OUT/check_profile.json when OUT is set."""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--size", default="small")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    args = p.parse_args()

    from zoo import build_model

    import kiln
    import kiln_inductor.compile as kc
    from kiln_inductor.index_check import DeviceIndexErrors

    _, model, inputs = build_model(args.model, args.device, args.dtype, args.size)
    model.eval()

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def elapsed_us(t0: float, e0, e1) -> float:
        if not cuda:
            return (time.perf_counter() - t0) * 1e6
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) * 1e3

    def call(fn):
        return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)

    seen: list = []
    original = kc.CompiledGraph.__init__

    def counting(self, *a, **k):
        original(self, *a, **k)
        seen.append(self)

    kc.CompiledGraph.__init__ = counting
    variants = {}
    sources = {}
    with torch.no_grad():
        for name, checks in (("checked", True), ("unchecked", False), ("no-read", True)):
            kiln.reset()
            seen.clear()
            fn = kiln.compile(copy.deepcopy(model), options={"check_indices": checks})
            call(fn)
            variants[name] = fn
            sources[name] = [g.wrapper_source for g in seen]
    kc.CompiledGraph.__init__ = original

    start, finish = DeviceIndexErrors.start, DeviceIndexErrors.finish

    def reads(on: bool) -> None:
        if on:
            DeviceIndexErrors.start, DeviceIndexErrors.finish = start, finish
        else:
            DeviceIndexErrors.start = lambda self: None
            DeviceIndexErrors.finish = lambda self: None

    host: dict[str, list[float]] = {v: [] for v in variants}
    dev: dict[str, list[float]] = {v: [] for v in variants}
    order = list(variants)
    with torch.no_grad():
        for fn in variants.values():
            for _ in range(10):
                call(fn)
        sync()
        for r in range(args.rounds):  # variants interleaved, the order rotated each round
            for name in order[r % 3 :] + order[: r % 3]:
                fn = variants[name]
                reads(name != "no-read")
                sync()
                e0 = torch.cuda.Event(enable_timing=True) if cuda else None
                e1 = torch.cuda.Event(enable_timing=True) if cuda else None
                if cuda:
                    e0.record()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    call(fn)
                t1 = time.perf_counter()
                dev[name].append(elapsed_us(t0, e0, e1) / args.calls)
                host[name].append((t1 - t0) / args.calls * 1e6)
        reads(True)
        rows = {}
        for name, fn in variants.items():
            reads(name != "no-read")
            with torch.profiler.profile(
                activities=[
                    torch.profiler.ProfilerActivity.CPU,
                    torch.profiler.ProfilerActivity.CUDA,
                ]
            ) as prof:
                for _ in range(10):
                    call(fn)
                sync()
            kernels: Counter = Counter()
            runtime: Counter = Counter()
            kernel_us = 0.0
            for ev in prof.events():
                dt = getattr(ev, "device_type", None)
                if dt is not None and "CUDA" in str(dt):
                    kernels[ev.name[:60]] += 1
                    kernel_us += getattr(ev, "device_time_total", 0)
                elif ev.name.startswith(("cuda", "cu")):
                    runtime[ev.name] += 1
            # host time by function (cProfile over the same calls)
            prof_py = cProfile.Profile()
            prof_py.enable()
            for _ in range(args.calls):
                call(fn)
            prof_py.disable()
            sync()
            stats = pstats.Stats(prof_py)
            top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:14]
            reads(True)
            rows[name] = {
                "host_us_per_call": statistics.median(host[name]),
                "host_us_all": host[name],
                "device_us_per_call": statistics.median(dev[name]),
                "device_us_all": dev[name],
                "kernels_per_call": sum(kernels.values()) / 10,
                "kernel_us_per_call": kernel_us / 10,
                "runtime_calls_per_call": {k: v / 10 for k, v in runtime.most_common(12)},
                "top_kernels": kernels.most_common(8),
                "host_top_us_per_call": [
                    (f"{Path(f).name}:{line}:{fn_}", round(tt / args.calls * 1e6, 1), nc)
                    for (f, line, fn_), (_, nc, tt, _, _) in top
                ],
                "wrapper_lines": [len(s.splitlines()) for s in sources[name]],
            }
    print(f"{'variant':10} {'host us':>9} {'device us':>10} {'kernels':>8} {'kernel us':>10}")
    for name, r in rows.items():
        print(
            f"{name:10} {r['host_us_per_call']:9.1f} {r['device_us_per_call']:10.1f} "
            f"{r['kernels_per_call']:8.1f} {r['kernel_us_per_call']:10.1f}"
        )
    for name, r in rows.items():
        print(name, "host samples us:", [round(x) for x in r["host_us_all"]])
        print(name, "runtime calls/call:", r["runtime_calls_per_call"])
    for name in ("checked", "unchecked"):
        print(name, "host tottime us/call (cProfile):")
        for where, us, n in rows[name]["host_top_us_per_call"][:10]:
            print(f"    {us:8.1f}  {n:6d}  {where}")
    out = os.environ.get("OUT")
    if out:
        for name, srcs in sources.items():
            Path(out, f"check_profile_wrapper_{name}.py").write_text("\n\n".join(srcs))
        Path(out, "check_profile.json").write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
