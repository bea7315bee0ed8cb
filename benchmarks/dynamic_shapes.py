"""Dynamic shapes: how many graphs each compiler builds over a program's sizes, and what
one graph for every size costs against a graph compiled for one size.

    python benchmarks/dynamic_shapes.py                     # CPU, every program of the corpus
    python benchmarks/dynamic_shapes.py --device cuda
    python benchmarks/dynamic_shapes.py --programs causal_attention,hf_gpt2 --scale 8

The corpus is kiln's dynamic-shape test corpus (packages/kiln/tests/dynamic_programs.py:
17 programs, six sizes each, odd and prime ones included). Per program, in one process:

- graphs built over the six sizes by kiln ``dynamic=True``, kiln's default (automatic),
  torch.compile ``dynamic=True`` and torch.compile's default, each checked against eager
  at every size;
- at the largest size (``--scale`` times the corpus' largest), the median time per call of
  eager, kiln's dynamic graph (compiled at the first size, reused), kiln compiled for that
  size alone (``dynamic=False``), and torch.compile's dynamic graph, interleaved round by
  round; ``dyn/static`` = static time / dynamic time (>= 1: the dynamic graph is as fast).

Inference programs run under ``no_grad``; training programs time forward and backward.
The table prints medians and the spread (min-max over ``--samples`` samples); results go to
benchmarks/results/dynamic_shapes_<device>.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from provenance import commit  # noqa: E402
from workers import progress, result, run_worker  # noqa: E402

sys.path.insert(0, str(HERE.parent / "packages" / "kiln" / "tests"))


def _to(args, device):
    import torch

    return tuple(
        a.detach().to(device).requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in args
    )


def _leaves(out):
    if isinstance(out, (tuple, list)):
        return [o for x in out for o in _leaves(x)]
    return [out]


def _graphs(variant: str) -> tuple[int, int]:
    if variant.startswith("kiln"):
        import kiln

        s = kiln.stats()
        return s["graphs"], s["breaks"] + s["fallbacks"]
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


def _compile(variant: str, fn):
    import torch

    import kiln

    if variant == "kiln dynamic":
        return kiln.compile(fn, dynamic=True)
    if variant == "kiln default":
        return kiln.compile(fn)
    if variant == "kiln static":
        return kiln.compile(fn, dynamic=False)
    if variant == "torch dynamic":
        return torch.compile(fn, dynamic=True)
    if variant == "torch default":
        return torch.compile(fn)
    return fn


def _reset() -> None:
    import torch._dynamo

    import kiln

    kiln.reset()
    torch._dynamo.reset()


def worker(name: str, device: str, scale: int, samples: int, calls: int) -> dict:
    import torch
    from dynamic_programs import PROGRAMS, loss_of

    program = next(p for p in PROGRAMS if p.name == name)
    torch.manual_seed(0)
    base = program.make()
    if isinstance(base, torch.nn.Module):
        base = base.to(device)
    out: dict = {"program": name, "sizes": list(program.sizes), "train": program.train}

    def fresh():
        return copy.deepcopy(base) if isinstance(base, torch.nn.Module) else base

    def call(fn, args):
        if program.train:
            loss_of(fn(*args)).backward()
            return None
        with torch.no_grad():
            return fn(*args)

    compiled = {}
    for variant in ["kiln dynamic", "kiln default", "torch dynamic", "torch default"]:
        _reset()
        fn = _compile(variant, fresh())
        ok = True
        t0 = time.perf_counter()
        for n in program.sizes:
            args = _to(program.inputs(n), device)
            with torch.no_grad():
                got, want = fn(*args), base(*args)
            ok = ok and all(
                torch.allclose(g, w, **program.tol) for g, w in zip(_leaves(got), _leaves(want))
            )
        graphs, breaks = _graphs(variant)
        progress(f"{name} {variant}: {graphs} graphs, {time.perf_counter() - t0:.1f} s")
        out[variant] = {
            "graphs": graphs,
            "breaks_fallbacks": breaks,
            "correct": bool(ok),
            "compile_and_run_s": time.perf_counter() - t0,
        }
        if variant in ("kiln dynamic", "torch dynamic"):
            compiled[variant] = fn
    largest = max(program.sizes) * scale
    args = _to(program.inputs(largest), device)
    _reset()
    static = _compile("kiln static", fresh())
    timed = {"eager": base, "kiln dynamic": compiled["kiln dynamic"], "kiln static": static,
             "torch dynamic": compiled["torch dynamic"]}  # fmt: skip
    for fn in timed.values():  # warm-up (the static one compiles here)
        for _ in range(3):
            call(fn, args)
    graphs, breaks = _graphs("kiln static")
    out["kiln static"] = {"graphs": graphs, "breaks_fallbacks": breaks}
    if calls <= 0:  # enough calls for a sample of about 50 ms (µs-scale calls are noisy)
        t0 = time.perf_counter()
        call(timed["kiln static"], args)
        if device == "cuda":
            torch.cuda.synchronize()
        calls = max(5, min(2000, int(0.05 / max(time.perf_counter() - t0, 1e-6))))
    out["calls_per_sample"] = calls
    progress(f"{name}: warm at size {largest}, timing ({calls} calls a sample)")
    times: dict = {k: [] for k in timed}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(samples):
        for k, fn in timed.items():
            sync()
            if device == "cuda":
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(calls):
                    call(fn, args)
                end.record()
                sync()
                times[k].append(start.elapsed_time(end) / calls)
            else:
                t0 = time.perf_counter()
                for _ in range(calls):
                    call(fn, args)
                times[k].append((time.perf_counter() - t0) / calls * 1e3)
    out["largest"] = largest
    out["ms"] = {k: statistics.median(v) for k, v in times.items()}
    out["spread"] = {k: [min(v), max(v)] for k, v in times.items()}
    out["dyn_over_static"] = out["ms"]["kiln static"] / out["ms"]["kiln dynamic"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--programs", default="")
    ap.add_argument("--scale", type=int, default=4, help="largest size = scale * corpus' largest")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--calls", type=int, default=0, help="calls a sample (0: ~50 ms worth)")
    ap.add_argument("--out", help="where the JSON goes (default: benchmarks/results/)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per program")
    ap.add_argument("--worker")
    a = ap.parse_args()
    if a.worker:
        result(worker(a.worker, a.device, a.scale, a.samples, a.calls))
        return
    from dynamic_programs import PROGRAMS

    names = a.programs.split(",") if a.programs else [p.name for p in PROGRAMS]
    res = HERE / "results"
    res.mkdir(exist_ok=True)
    path = Path(a.out) if a.out else res / f"dynamic_shapes_{a.device}.json"
    rows = []
    for k, name in enumerate(names, 1):
        print(f"[dynamic_shapes] {k}/{len(names)} {name} ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--worker", name, "--device", a.device,
               "--scale", str(a.scale), "--samples", str(a.samples), "--calls", str(a.calls)]  # fmt: skip
        rows.append({"program": name, **run_worker(cmd, a.timeout)})
        path.write_text(json.dumps({"commit": commit(), "scale": a.scale, "rows": rows}, indent=1))
    head = (f"{'program':20} {'graphs kiln dyn/def':>19} {'brk+fb d/d/s':>12} {'torch dyn/def':>13} "
            f"{'ok':>3} {'size':>5} "
            f"{'eager ms':>9} {'kiln dyn ms':>11} {'spread':>13} {'kiln static':>11} "
            f"{'torch dyn':>9} {'dyn/static':>10}")  # fmt: skip
    print("\n" + head)
    ratios = []
    for r in rows:
        if "error" in r:
            print(f"{r['program']:20} ERROR {r['error']}")
            continue
        ok = all(r[v]["correct"] for v in ("kiln dynamic", "kiln default"))
        sp = "{:.3f}-{:.3f}".format(*r["spread"]["kiln dynamic"])
        kg = f"{r['kiln dynamic']['graphs']}/{r['kiln default']['graphs']}"
        tg = f"{r['torch dynamic']['graphs']}/{r['torch default']['graphs']}"
        # graph breaks plus graphs that fell back to eager: a row with any is not compiled
        bf = "/".join(
            str(r.get(v, {}).get("breaks_fallbacks", "-"))
            for v in ("kiln dynamic", "kiln default", "kiln static")
        )
        ms = r["ms"]
        print(
            f"{r['program']:20} {kg:>19} {bf:>12} {tg:>13} {'yes' if ok else 'NO':>3} "
            f"{r['largest']:>5} "
            f"{ms['eager']:9.3f} {ms['kiln dynamic']:11.3f} {sp:>13} {ms['kiln static']:11.3f} "
            f"{ms['torch dynamic']:9.3f} {r['dyn_over_static']:9.2f}x"
        )
        ratios.append(r["dyn_over_static"])
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"\ngeomean dynamic vs static (static ms / dynamic ms) over {len(ratios)} programs: "
              f"{geo:.3f}x (goal >= 0.9x)")  # fmt: skip
    print(f"written {path}")


if __name__ == "__main__":
    main()
