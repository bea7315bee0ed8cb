"""Model suite: eager vs torch.compile vs kiln.compile, side by side, one process per model.

    python benchmarks/models.py                       # CPU, fp32, inference, small configs
    python benchmarks/models.py --train               # + forward/backward
    python benchmarks/models.py --device cuda --dtype bfloat16 --size large
    python benchmarks/models.py --models gpt2,bert --no-warm
    python benchmarks/models.py --compilers kiln,kiln-math   # fused vs math attention

For each model a worker subprocess (with a timeout) builds it with random weights, runs
eager, torch.compile and kiln.compile on the same inputs, and reports per compiler:
correctness against eager (outputs, and gradients with --train), median latency (eager
and the compilers timed in interleaved rounds, so load on a shared machine hits each
alike) and speed-up over eager, compile time (first call), peak memory a steady-state call
adds over what is resident before it, and graph/break counts. A second worker over the same cache folders gives warm-cache
compile times. The table (with geomeans) is printed, the results are written as JSON
under benchmarks/results/ and drawn as a PNG chart when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# kiln-math: kiln with attention decomposed to matmuls + softmax (KILN_AOT_FUSED_ATTENTION=0)
KNOWN_COMPILERS = ("torch.compile", "kiln", "kiln-math")
COMPILERS = ["torch.compile", "kiln"]  # --compilers

# -- worker ------------------------------------------------------------------------------


def _leaves(out):
    import torch
    from torch.utils._pytree import tree_leaves

    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def _peak_rss_reset() -> None:
    try:  # Linux: "5" resets the peak resident set size (VmHWM) of this process
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _release_free_memory() -> None:
    """Give freed heap pages back to the OS (glibc), so a call's allocations show in RSS."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _allocated_peak_mb(run) -> float:
    """The most bytes ``run()`` had allocated through torch's CPU allocator at once, above
    what was allocated when it started (the profiler's memory events; the CPU's
    counterpart of ``torch.cuda.max_memory_allocated``). Unlike the process's peak RSS it
    does not depend on what the C allocator kept from earlier calls."""
    import json
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    finally:
        os.unlink(path)
    mem = [e["args"] for e in events if e.get("name") == "[memory]" and "args" in e]
    if not mem:
        return 0.0
    start = mem[0]["Total Allocated"] - mem[0]["Bytes"]
    return max(0, max(m["Total Allocated"] for m in mem) - start) / 2**20


def _rss_field_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _call(model, args):
    return model(**args) if isinstance(args, dict) else model(*args)


class Runner:
    def __init__(self, device: str, train: bool, runs: int):
        import torch

        self.torch = torch
        self.device = device
        self.train = train
        self.runs = runs

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def step(self, model, args):
        """One call (and backward with --train); returns (outputs, grads)."""
        torch = self.torch
        if self.train:
            model.zero_grad(set_to_none=True)
            outs = _leaves(_call(model, args))
            loss = sum(o.float().mean() for o in outs if o.is_floating_point())
            loss.backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            return [o.detach() for o in outs], grads
        with torch.no_grad():
            return _leaves(_call(model, args)), []

    def timed_step(self, model, args) -> float:
        """Seconds of one step (CUDA events on the GPU)."""
        torch = self.torch
        if self.device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            self.step(model, args)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        self.step(model, args)
        return time.perf_counter() - t0

    def latencies(self, models: dict, args) -> dict[str, float]:
        """Median seconds per step of each model, after warm-up, timed in interleaved rounds."""
        for model in models.values():
            for _ in range(3):
                self.step(model, args)
        self.sync()
        times: dict[str, list[float]] = {name: [] for name in models}
        order = list(models)
        for r in range(self.runs):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                times[name].append(self.timed_step(models[name], args))
        return {name: statistics.median(t) for name, t in times.items()}

    def peak_memory_mb(self, model, args) -> float:
        torch = self.torch
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.step(model, args)
            self.sync()
            return torch.cuda.max_memory_allocated() / 2**20
        # Memory the call itself takes on top of what is resident before it: the process's
        # baseline (models built earlier in this worker) would otherwise bias later columns.
        _release_free_memory()
        _peak_rss_reset()
        before = _rss_field_mb("VmRSS")
        self.step(model, args)
        return _rss_field_mb("VmHWM") - before


def _close(got, want, dtype) -> tuple[bool, float]:
    torch = sys.modules["torch"]
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    worst = 0.0
    ok = len(got) == len(want)
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return False, float("inf")
        if not g.is_floating_point():
            ok = ok and torch.equal(g, w)
            continue
        err = (
            ((g.float() - w.float()).abs() / (w.float().abs() + 1.0)).max().item()
            if g.numel()
            else 0.0
        )
        worst = max(worst, err)
        ok = ok and err <= tol
    return ok, worst


def _compile(name: str, model):
    torch = sys.modules["torch"]
    if name == "torch.compile":
        return torch.compile(model)
    import kiln

    if name == "kiln":
        return kiln.compile(model)
    import kiln_aot

    class MathAttention(torch.nn.Module):
        """Compiles (on its first call) and runs with kiln-aot's fused attention off."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            with kiln_aot.config.override(fused_attention=False):
                return self.inner(*args, **kwargs)

    return MathAttention(kiln.compile(model))


def _graph_counts(name: str) -> dict:
    if name == "torch.compile":
        from torch._dynamo.utils import counters

        return {
            "graphs": int(counters["stats"]["unique_graphs"]),
            "breaks": int(sum(counters["graph_break"].values())),
        }
    import kiln

    stats = kiln.stats()
    return {
        "graphs": stats["graphs"],
        "breaks": stats["breaks"],
        "fallbacks": stats["fallbacks"],
        "eager_frames": stats.get("eager_frames", 0),
    }


def worker(
    name: str, device: str, dtype_name: str, size: str, train: bool, runs: int, compile_only: bool
) -> dict:
    import torch

    sys.path.insert(0, str(HERE))
    from zoo import build_model

    dtype = getattr(torch, dtype_name)
    source, model, args = build_model(name, device, dtype_name, size)
    if model is None:
        return {"model": name, "source": source, "skipped": args}
    model.train(train)
    runner = Runner(device, train, runs)
    result = {"model": name, "source": source, "task": "training" if train else "inference"}
    reference = copy.deepcopy(model)
    want_out, want_grads = runner.step(reference, args)
    compiled_models = {}
    for cname in COMPILERS:
        entry: dict = {}
        candidate = copy.deepcopy(model)
        try:
            before = _graph_counts(cname)  # counters are per process: count this compiler's
            compiled = _compile(cname, candidate)
            t0 = time.perf_counter()
            got_out, got_grads = runner.step(compiled, args)
            runner.sync()
            entry["compile_s"] = time.perf_counter() - t0
            ok_out, err_out = _close(got_out, want_out, dtype)
            ok_grad, err_grad = _close(got_grads, want_grads, dtype)
            entry["correct"] = ok_out and ok_grad
            entry["max_rel_err"] = max(err_out, err_grad)
            entry.update({k: v - before[k] for k, v in _graph_counts(cname).items()})
            compiled_models[cname] = compiled
        except Exception as e:  # a failing compiler is a result, not a crash of the suite
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        result[cname] = entry
    if compile_only:
        return result
    # Timed in interleaved rounds (eager, then each compiler, in turn), so that load from
    # other processes on a shared machine slows every column alike instead of one.
    timed = {"eager": reference, **compiled_models}
    latencies = runner.latencies(timed, args)
    result["eager"] = {
        "latency_s": latencies["eager"],
        "peak_mb": runner.peak_memory_mb(reference, args),
    }
    for cname, compiled in compiled_models.items():
        entry = result[cname]
        try:
            entry["latency_s"] = latencies[cname]
            entry["peak_mb"] = runner.peak_memory_mb(compiled, args)
            entry["speedup"] = latencies["eager"] / latencies[cname]
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return result


# -- driver -----------------------------------------------------------------------------


def run_worker(argv: list[str], env: dict, timeout: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", *argv]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout}s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"worker exited {proc.returncode}: {' | '.join(tail)}"[:400]}


def geomean(values: list[float]) -> float:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def compiled_for_real(e: dict) -> bool:
    """A compiler's row counts as compiled only if it is correct, built a graph and no graph
    of it fell back to eager (kiln's ``fallbacks`` and ``eager_frames``)."""
    return (
        bool(e.get("correct"))
        and "speedup" in e
        and e.get("graphs") != 0
        and not e.get("fallbacks")
        and not e.get("eager_frames")
    )


def print_table(results: list[dict]) -> str:
    head = (
        f"{'model':<22}{'task':<10}"
        + "".join(
            f"{c + ' ok':>16}{'speedup':>9}{'compile s':>11}{'warm s':>8}{'gr/brk/fb':>10}{'peak MB':>9}"
            for c in COMPILERS
        )
        + f"{'eager ms':>10}{'eager MB':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        if "skipped" in r or "eager" not in r:
            lines.append(f"{r['model']:<22}{r.get('skipped') or r.get('error', '')}"[:160])
            continue
        row = f"{r['model']:<22}{r['task']:<10}"
        for c in COMPILERS:
            e = r.get(c, {})
            if "error" in e:
                row += f"{'ERROR':>16}{'':>9}{'':>11}{'':>8}{'':>10}{'':>9}"
                continue
            # a compiler that captured no graph, or whose graphs fell back, ran the model
            # (partly) eagerly: not a compiled result
            verdict = "yes" if e.get("correct") else "NO"
            if e.get("graphs") == 0:
                verdict += " (eager)"
            elif e.get("fallbacks") or e.get("eager_frames"):
                verdict += " (fallback)"
            counts = f"{e.get('graphs', '?')}/{e.get('breaks', '?')}/{e.get('fallbacks', '-')}"
            row += (
                f"{verdict:>16}{e.get('speedup', float('nan')):>8.2f}x"
                f"{e.get('compile_s', float('nan')):>11.1f}{e.get('warm_compile_s', float('nan')):>8.1f}"
                f"{counts:>10}"
                f"{e.get('peak_mb', float('nan')):>9.0f}"
            )
        row += f"{r['eager']['latency_s'] * 1e3:>10.2f}{r['eager']['peak_mb']:>9.0f}"
        lines.append(row)
    lines.append("-" * len(head))
    # every compiler's geomean over the same models: a model a compiler did not compile for
    # real (error, wrong, eager, fallback) counts 1.0x for it and is listed
    rows = [r for r in results if "eager" in r]
    for c in COMPILERS:
        speed, missed = [], []
        for r in rows:
            e = r.get(c, {})
            if compiled_for_real(e):
                speed.append(e["speedup"])
            else:
                speed.append(1.0)
                missed.append(r["model"] + ("" if r["task"] == "inference" else f"/{r['task']}"))
        correct = sum(1 for r in rows if r.get(c, {}).get("correct"))
        lines.append(
            f"{c:<14} correct {correct}/{len(rows)}   geomean speed-up over eager "
            f"{geomean(speed):.2f}x over all {len(rows)} rows"
            + (f" (1.0x for {', '.join(missed)}: not compiled)" if missed else "")
        )
    text = "\n".join(lines)
    print(text)
    return text


def draw_chart(results: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in results if "eager" in r]
    labels = [f"{r['model']}\n{r['task']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    width = 0.76 / len(COMPILERS)
    for i, c in enumerate(COMPILERS):
        vals = [
            r.get(c, {}).get("speedup", 0.0) if r.get(c, {}).get("correct") else 0.0 for r in rows
        ]
        ax.bar(
            [x + (i - (len(COMPILERS) - 1) / 2) * width for x in range(len(rows))],
            vals,
            width,
            label=c,
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("speed-up over eager (0 = incorrect or failed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--size", default="small", choices=["small", "large"])
    p.add_argument("--train", action="store_true", help="also benchmark forward+backward")
    p.add_argument("--models", default="", help="comma-separated names (default: all)")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--no-warm", action="store_true", help="skip the warm-cache compile run")
    p.add_argument("--out", default="")
    p.add_argument("--worker", default="")
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--task", default="inference")
    p.add_argument(
        "--compilers",
        default=",".join(COMPILERS),
        help=f"comma-separated, of {', '.join(KNOWN_COMPILERS)} (kiln-math: attention decomposed)",
    )
    a = p.parse_args()
    COMPILERS[:] = [c for c in a.compilers.split(",") if c]
    unknown = set(COMPILERS) - set(KNOWN_COMPILERS)
    if unknown:
        p.error(f"unknown compilers {sorted(unknown)}; known: {', '.join(KNOWN_COMPILERS)}")

    if a.worker:
        res = worker(
            a.worker, a.device, a.dtype, a.size, a.task == "training", a.runs, a.compile_only
        )
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    sys.path.insert(0, str(HERE))
    from zoo import ZOO

    names = [n for n in a.models.split(",") if n] or list(ZOO)
    tasks = ["inference", "training"] if a.train else ["inference"]
    results = []
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(a.out) if a.out else RESULTS / f"models_{a.device}_{a.dtype}.json"
    total = len(names) * len(tasks)
    for i, (name, task) in enumerate(((n, t) for n in names for t in tasks), 1):
        print(f"[{i}/{total}] {name} {task} on {a.device} ({a.dtype})", flush=True)
        with tempfile.TemporaryDirectory(prefix="kiln-bench-") as cache:
            env = dict(
                os.environ,
                KILN_CACHE_DIR=f"{cache}/kiln",
                TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor",
            )
            base = [
                name,
                "--device",
                a.device,
                "--dtype",
                a.dtype,
                "--size",
                a.size,
                "--task",
                task,
                "--runs",
                str(a.runs),
                "--compilers",
                a.compilers,
            ]
            t0 = time.perf_counter()
            res = run_worker(base, env, a.timeout)
            res.setdefault("model", name)
            res.setdefault("task", task)
            if not a.no_warm and "eager" in res:
                warm = run_worker([*base, "--compile-only"], env, a.timeout)
                for c in COMPILERS:
                    if "compile_s" in warm.get(c, {}) and c in res:
                        res[c]["warm_compile_s"] = warm[c]["compile_s"]
            print(
                f"      done in {time.perf_counter() - t0:.0f}s: "
                + ", ".join(
                    f"{c}: {'ok' if res.get(c, {}).get('correct') else res.get(c, {}).get('error', 'mismatch')}"
                    for c in COMPILERS
                )
                if "eager" in res
                else f"      {res.get('skipped') or res.get('error')}",
                flush=True,
            )
            results.append(res)
            out.write_text(
                json.dumps(
                    {"device": a.device, "dtype": a.dtype, "partial": True, "results": results},
                    indent=2,
                )
            )
    table = print_table(results)
    out.write_text(
        json.dumps(
            {
                "device": a.device,
                "dtype": a.dtype,
                "size": a.size,
                "results": results,
                "table": table,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    if draw_chart(results, out.with_suffix(".png")):
        print(f"wrote {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
