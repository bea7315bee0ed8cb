"""What kiln's bounds checks of indirect accesses cost: the model suite compiled twice with
kiln.compile, checks on (the default) and off (``options={"check_indices": False}``), timed
side by side, with eager and torch.compile in the same rounds for reference.

    python benchmarks/index_check_cost.py                         # CPU, fp32, small configs
    python benchmarks/index_check_cost.py --device cuda --dtype bfloat16 --size large
    python benchmarks/index_check_cost.py --models gpt2,bert --calls 20

Each timing sample is ``--calls`` back-to-back calls (so that on the GPU a per-call
synchronization shows: the host cannot queue the next call's kernels before the last one
ends), on the GPU measured with CUDA events; samples of the four variants are interleaved
round by round; the table gives the median per call and the spread (min-max over samples)
of checked/unchecked, the geomean over models, and per row the graphs, fallbacks and
checked kernels. Results go to benchmarks/results/index_check_cost_<device>_<dtype>.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ["eager", "torch.compile", "kiln", "kiln-nocheck"]  # --no-torch-compile drops one


def _compile(name: str, model):
    import torch

    import kiln

    if name == "eager":
        return model
    if name == "torch.compile":
        return torch.compile(model)
    return kiln.compile(model, options={"check_indices": name == "kiln"})


def _call(model, args):
    return model(**args) if isinstance(args, dict) else model(*args)


def worker(name: str, device: str, dtype_name: str, size: str, calls: int, samples: int) -> dict:
    import torch

    import kiln
    import kiln_inductor.compile as kc

    sys.path.insert(0, str(HERE))
    from zoo import build_model

    source, model, args = build_model(name, device, dtype_name, size)
    if model is None:
        return {"model": name, "skipped": args}
    model.eval()
    out: dict = {"model": name, "source": source}
    runs = {}
    seen: list = []
    original = kc.CompiledGraph.__init__

    def counting(self, *a, **k):  # the graphs kiln compiles, to count checked kernels
        original(self, *a, **k)
        seen.append(self)

    kc.CompiledGraph.__init__ = counting
    with torch.no_grad():
        for v in VARIANTS:
            kiln.reset()
            seen.clear()
            fn = _compile(v, copy.deepcopy(model))
            t0 = time.perf_counter()
            _call(fn, args)
            out[v] = {"compile_s": time.perf_counter() - t0}
            if v.startswith("kiln"):
                stats = kiln.stats()
                out[v].update(graphs=stats["graphs"], fallbacks=stats["fallbacks"])
                out[v]["checked_kernels"] = sum(
                    g.wrapper_source.count("raise_index_error")
                    + g.wrapper_source.count("index_errors.rows[")
                    for g in seen
                )
            runs[v] = fn
        kc.CompiledGraph.__init__ = original

        def sample(fn) -> float:
            if device == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    _call(fn, args)
                end.record()
                end.synchronize()
                return start.elapsed_time(end) / 1e3 / calls
            t0 = time.perf_counter()
            for _ in range(calls):
                _call(fn, args)
            return (time.perf_counter() - t0) / calls

        for fn in runs.values():
            for _ in range(3):
                _call(fn, args)
        times: dict[str, list[float]] = {v: [] for v in runs}
        order = list(runs)
        for r in range(samples):
            for v in order[r % len(order) :] + order[: r % len(order)]:
                times[v].append(sample(runs[v]))
    for v, t in times.items():
        out[v]["median_s"] = statistics.median(t)
    ratios = [a / b for a, b in zip(times["kiln"], times["kiln-nocheck"])]
    out["check_cost"] = {
        "median": out["kiln"]["median_s"] / out["kiln-nocheck"]["median_s"],
        "min": min(ratios),
        "max": max(ratios),
    }
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--size", default="small", choices=["small", "large"])
    p.add_argument("--models", default="gpt2,bert,llama,t5,hf_resnet,hf_vit,gelu_mlp")
    p.add_argument("--calls", type=int, default=10, help="back-to-back calls per sample")
    p.add_argument("--samples", type=int, default=9)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--out", default="")
    p.add_argument("--no-torch-compile", action="store_true", help="skip the torch.compile column")
    p.add_argument("--worker", default="")
    a = p.parse_args()
    if a.no_torch_compile:
        VARIANTS.remove("torch.compile")
    if a.worker:
        res = worker(a.worker, a.device, a.dtype, a.size, a.calls, a.samples)
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    sys.path.insert(0, str(HERE))
    from provenance import commit as source_commit

    commit = source_commit()
    results = []
    names = [n for n in a.models.split(",") if n]
    for k, name in enumerate(names, 1):
        print(f"[{k}/{len(names)}] {name} on {a.device} ({a.dtype}, {a.size})", flush=True)
        cmd = [sys.executable, __file__, "--worker", name, "--device", a.device, "--dtype", a.dtype,
               "--size", a.size, "--calls", str(a.calls), "--samples", str(a.samples),
               *(["--no-torch-compile"] if a.no_torch_compile else [])]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            res = json.loads(line[-1][7:]) if line else {"model": name, "error": proc.stderr[-800:]}
        except subprocess.TimeoutExpired:
            res = {"model": name, "error": "timeout"}
        results.append(res)
    rows = [r for r in results if "check_cost" in r]
    head = f"{'model':12} {'eager ms':>9} {'tc ms':>8} {'kiln ms':>8} {'nocheck ms':>10} {'checked/unchecked':>20} {'checked kernels':>15} {'graphs':>6} {'fallbacks':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        if "check_cost" not in r:
            lines.append(f"{r['model']:12} {r.get('skipped') or r.get('error', '')[:100]}")
            continue
        c = r["check_cost"]
        ms = {v: r[v]["median_s"] * 1e3 for v in VARIANTS}
        ms.setdefault("torch.compile", float("nan"))
        lines.append(
            f"{r['model']:12} {ms['eager']:9.3f} {ms['torch.compile']:8.3f} {ms['kiln']:8.3f} {ms['kiln-nocheck']:10.3f} "
            f"{c['median']:8.4f} [{c['min']:.3f}-{c['max']:.3f}] {r['kiln']['checked_kernels']:15d} "
            f"{r['kiln']['graphs']:6d} {r['kiln']['fallbacks']:9d}"
        )
    g = geomean([r["check_cost"]["median"] for r in rows])
    lines.append(
        f"geomean checked/unchecked over {len(rows)} models: {g:.4f} ({(g - 1) * 100:+.2f}%)"
    )
    with_checks = [r["check_cost"]["median"] for r in rows if r["kiln"]["checked_kernels"]]
    gc = geomean(with_checks)
    lines.append(
        f"geomean over the {len(with_checks)} models with checked kernels: {gc:.4f} ({(gc - 1) * 100:+.2f}%)"
    )
    table = "\n".join(lines)
    print(table)
    out = Path(a.out) if a.out else HERE / "results" / f"index_check_cost_{a.device}_{a.dtype}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": a.device, "dtype": a.dtype, "size": a.size, "calls": a.calls,
                               "samples": a.samples, "commit": commit, "geomean": g,
                               "geomean_checked_models": gc, "results": results},
                              indent=2))  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
