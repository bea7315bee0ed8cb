"""First-call time of a fresh process: eager, kiln cold / warm, torch.compile cold / warm.

Issue #19's goals: kiln's warm first call (every cache filled by an earlier process) at
most 3x eager's first call; kiln's cold first call at 24 layers at most 1.3x its cold
first call at 6 layers. Models: HF GPT-2, BERT and LLaMA from small-width configs (random
weights, no downloads) at 6 and 24 layers, inference (``torch.no_grad``) on CPU.

Each measurement runs in a fresh Python process with its own cache directory: "cold" is
an empty one, "warm" the one a cold process of the same model just filled. The first
call's time includes capture and compilation, not imports (those are reported apart).
kiln's warm rows also break the first call down: the backend (artifact cache key and
load), the steady-state call, and the rest (capture: bytecode analysis, guards, and the
torch modules its meta tensors import on first use), plus whether the cache hit (and,
in the JSON, whether kiln-capture's generated guard and entry code came from disk), and
whether the whole capture was loaded from disk ("kept capture": kiln-capture's
frame_store.py; "reloaded" when its compiled graph came from the backend's reload recipe
without rebuilding the graph, "loaded" when the graph was rebuilt and handed to the
backend, "traced" when the frame was evaluated again).
"kiln-whole" is kiln's cold first call with regional reuse off (``KILN_REGIONAL_REUSE=0``:
every layer traced and lowered), in a cache directory of its own.
"kiln-resize" and "torch-resize" (only when asked for with ``--modes``) time, in a cold
process, the call at a second sequence length (the first's + 16) after an untimed first
call: the recompile for a new size, whose sizes then become symbolic (automatic dynamic
shapes, both compilers), what a server meeting its second request length waits for.

Usage: python benchmarks/warm_start.py [--models gpt2,bert,llama] [--layers 6,24]
    [--no-torch] [--threads N] [--repeat N] [--out PATH]
``--repeat N`` runs each cell in N fresh processes and keeps the least first-call time
(each cold try in an empty cache directory of its own). The cold ratio line also gives
the first call's CPU time (the process and the compiler processes it waited for, least
of the tries): on a shared machine the wall time also counts waiting for a CPU.
Prints a table and writes benchmarks/results/warm_start.json (git-ignored).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WIDTH = dict(hidden=128, heads=4, vocab=2048, batch=2, seq=64)
RESIZE = ["kiln-resize", "torch-resize"]  # asked for by --modes only (module docstring)


def build(name: str, layers: int):
    """``(model, input ids)``: a small-width HF model of ``layers`` layers, eval mode."""
    import torch
    import transformers

    w = WIDTH
    common = dict(vocab_size=w["vocab"], use_cache=False)
    if name == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=layers, n_embd=w["hidden"], n_head=w["heads"], **common
        )
        cls = "GPT2LMHeadModel"
    elif name == "bert":
        cfg = transformers.BertConfig(
            num_hidden_layers=layers,
            hidden_size=w["hidden"],
            num_attention_heads=w["heads"],
            intermediate_size=4 * w["hidden"],
            vocab_size=w["vocab"],
        )
        cls = "BertModel"
    elif name == "llama":
        cfg = transformers.LlamaConfig(
            num_hidden_layers=layers,
            hidden_size=w["hidden"],
            num_attention_heads=w["heads"],
            num_key_value_heads=w["heads"] // 2,
            intermediate_size=3 * w["hidden"],
            **common,
        )
        cls = "LlamaForCausalLM"
    else:
        raise ValueError(name)
    torch.manual_seed(0)
    model = getattr(transformers, cls)(cfg).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, w["vocab"], (w["batch"], w["seq"]), generator=g)
    return model, ids


def _first_tensor(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "values"):
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    return next(v for v in out if isinstance(v, torch.Tensor))


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it waited for (the C++ compiler):
    what a loaded machine's waiting does not inflate (on one thread: no spinning)."""
    import resource

    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def worker(name: str, layers: int, mode: str) -> dict:
    """One measurement (this process is fresh; the caller set the cache directories)."""
    import torch

    model, ids = build(name, layers)
    result: dict = {}
    start = time.perf_counter()
    if mode == "eager":
        fn = model
    elif mode.startswith("kiln"):
        import kiln
        import kiln_cpp
        import kiln_inductor

        backend_s = [0.0]

        def timed(inner):
            def call(*args):
                t = time.perf_counter()
                try:
                    return inner(*args)
                finally:
                    backend_s[0] += time.perf_counter() - t

            return call

        # the backend: compiling a graph, or rebuilding a kept capture's compiled graph
        # from its reload recipe (kiln-inductor's runtime/reload.py)
        kiln_cpp.compile_fx = timed(kiln_cpp.compile_fx)
        if hasattr(kiln_inductor, "reload_fx"):  # (older commits compare without it)
            kiln_inductor.reload_fx = timed(kiln_inductor.reload_fx)
        result["import_s"] = time.perf_counter() - start
        fn = kiln.compile(model)
    else:
        import torch._inductor.config

        result["import_s"] = time.perf_counter() - start
        fn = torch.compile(model)
    preimport = os.environ.get("WARM_START_PREIMPORT")
    if preimport:  # the modules the first call imports, imported before it (breakdown)
        t = time.perf_counter()
        for module in preimport.split(","):
            try:
                importlib.import_module(module)
            except Exception:  # modules made at run time (extensions' submodules)
                pass
        result["preimport_s"] = time.perf_counter() - t
    if mode.endswith("-resize"):  # the first size untimed; the second is measured
        with torch.no_grad():
            fn(ids)
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(0, WIDTH["vocab"], (WIDTH["batch"], WIDTH["seq"] + 16), generator=g)
    before = set(sys.modules)
    with torch.no_grad():
        t, cpu = time.perf_counter(), _cpu_s()
        out = fn(ids)
        result["first_s"] = time.perf_counter() - t
        result["first_cpu_s"] = _cpu_s() - cpu
    result["imported"] = sorted(set(sys.modules) - before)
    with torch.no_grad():
        steady = []
        for _ in range(3):  # the least of three: the machine is shared
            t = time.perf_counter()
            fn(ids)
            steady.append(time.perf_counter() - t)
        result["steady_s"] = min(steady)
        ref = _first_tensor(model(ids))
    result["max_abs_err"] = float((_first_tensor(out) - ref).abs().max())
    if mode.startswith("kiln"):
        import kiln
        from kiln_inductor.runtime.artifacts import STATS

        result["backend_s"] = backend_s[0]
        result["artifact"] = {
            "hits": STATS.hits,
            "misses": STATS.misses,
            "key_s": STATS.key_s,
            "load_s": STATS.load_s,
            "save_s": STATS.save_s,
        }
        from kiln_capture.code_cache import STATS as CODE

        # kiln-capture's generated guard/entry code loaded from disk (code_cache.py)
        result["code_cache"] = {"hits": CODE.hits, "misses": CODE.misses}
        from kiln_capture.frame_store import STATS as FRAMES

        # whole captures kept on disk (frame_store.py): loaded ones were not traced
        result["frames"] = {
            k: getattr(FRAMES, k, 0) for k in ("saved", "unsaved", "loaded", "skipped", "reloaded")
        }
        result["capture_s"] = result["first_s"] - backend_s[0] - result["steady_s"]
        result["stats"] = kiln.stats()
    return result


def _least(tries: list[dict]) -> dict:
    timed = [r for r in tries if "first_s" in r]
    if not timed:
        return tries[-1]
    best = dict(min(timed, key=lambda r: r["first_s"]))
    best["tries_first_s"] = [r["first_s"] for r in timed]
    cpu = [r["first_cpu_s"] for r in timed if "first_cpu_s" in r]
    if cpu:  # the least CPU time of the tries (not necessarily the fastest try's)
        best["least_first_cpu_s"] = min(cpu)
    return best


def _brief(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "imported"}


def measure(
    name: str, layers: int, mode: str, cache: Path, threads: int, preimport: list[str] = ()
) -> dict:
    env = dict(
        os.environ,
        KILN_CACHE_DIR=str(cache / "kiln"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        TRITON_CACHE_DIR=str(cache / "triton"),
        OMP_NUM_THREADS=str(threads),
        WARM_START_PREIMPORT=",".join(preimport),
    )
    if mode == "kiln-whole":  # kiln cold with regional reuse off: every layer compiled
        env["KILN_REGIONAL_REUSE"] = "0"
    cmd = [sys.executable, __file__, "--worker", name, str(layers), mode]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:], "process_s": wall}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = wall
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,bert,llama")
    ap.add_argument("--layers", default="6,24")
    ap.add_argument("--no-torch", action="store_true", help="skip torch.compile's rows")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(HERE / "results" / "warm_start.json"))
    ap.add_argument(
        "--modes",
        default="",
        help="comma-separated subset of eager,kiln-cold,kiln-warm,kiln-whole,torch-cold,"
        "torch-warm (default: all; kiln-warm needs kiln-cold), and kiln-resize,torch-resize "
        "(only when asked for)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="fresh processes per cell; the table shows the one of least first-call time "
        "(a shared machine's load only ever adds time)",
    )
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        name, layers, mode = args.worker
        print(json.dumps(worker(name, int(layers), mode)))
        return 0
    modes = ["eager", "kiln-cold", "kiln-warm", "kiln-whole"]
    if not args.no_torch:
        modes += ["torch-cold", "torch-warm"]
    if args.modes:  # a subset, in this order (a warm row needs its cold row)
        modes = [m for m in [*modes, *RESIZE] if m in args.modes.split(",")]
    rows = []
    for name in args.models.split(","):
        for layers in (int(n) for n in args.layers.split(",")):
            row = {"model": name, "layers": layers}
            with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
                for mode in modes:
                    # a warm row reuses the directory its cold row filled
                    own = mode == "kiln-whole" or mode in RESIZE  # a cold directory of its own
                    cache = Path(tmp) / (mode if own else mode.split("-")[0])
                    tries = []
                    for i in range(args.repeat):
                        # each cold try in an empty directory of its own; the warm ones
                        # in the directory the first cold try filled
                        fresh = i and (mode.endswith("cold") or own)
                        where = cache.with_name(f"{cache.name}-{i}") if fresh else cache
                        tries.append(measure(name, layers, mode, where, args.threads))
                        print(f"  {name} x{layers} {mode}: {_brief(tries[-1])}", file=sys.stderr)
                    row[mode] = _least(tries)
                # the warm first call again, with the modules it imports imported before it:
                # how much of it is Python imports (torch's meta kernels, first used by capture)
                if "kiln-warm" in row:
                    mods = row["kiln-warm"].get("imported", [])
                    row["kiln-warm-preimported"] = measure(
                        name, layers, "kiln-warm", Path(tmp) / "kiln", args.threads, mods
                    )
            for r in row.values():
                if isinstance(r, dict):
                    r["imported"] = len(r.get("imported", []))
            rows.append(row)
    print(_table(rows, modes))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"width": WIDTH, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


def _kept(frames: dict) -> str:
    if not frames.get("loaded"):
        return "traced"
    return "reloaded" if frames.get("reloaded") else "loaded"


def _table(rows: list[dict], modes: list[str]) -> str:
    def sec(r: dict) -> str:
        return f"{r['first_s']:.3f}" if "first_s" in r else "error"

    head = ["model", "layers", *(f"{m} first (s)" for m in modes), "warm/eager"]
    head += ["warm: capture", "of it imports", "backend", "load", "hit", "kept capture"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for row in rows:
        cells = [row["model"], str(row["layers"]), *(sec(row[m]) for m in modes)]
        eager, warm = row.get("eager", {}), row.get("kiln-warm", {})
        if "first_s" in eager and "first_s" in warm:
            cells.append(f"{warm['first_s'] / eager['first_s']:.1f}x")
            art = warm["artifact"]
            pre = row.get("kiln-warm-preimported", {})
            imports = warm["first_s"] - pre["first_s"] if "first_s" in pre else float("nan")
            cells += [
                f"{warm['capture_s']:.3f}",
                f"{imports:.3f}",
                f"{warm['backend_s']:.3f}",
                f"{art['load_s']:.3f}",
                f"{art['hits']}/{art['hits'] + art['misses']}",
                _kept(warm.get("frames", {})),
            ]
        lines.append(" | ".join(cells))
    by = {(r["model"], r["layers"]): r for r in rows}
    for (name, layers), r in by.items():
        six = by.get((name, 6))
        cold, cold6 = r.get("kiln-cold", {}), (six or {}).get("kiln-cold", {})
        if layers != 6 and "first_s" in cold and "first_s" in cold6:
            ratio = cold["first_s"] / cold6["first_s"]
            line = f"{name}: kiln cold x{layers} / x6 = {ratio:.2f} (goal <= 1.3)"
            if "least_first_cpu_s" in cold and "least_first_cpu_s" in cold6:
                cpu, cpu6 = cold["least_first_cpu_s"], cold6["least_first_cpu_s"]
                line += f"; CPU time {cpu6:.3f} / {cpu:.3f} s = {cpu / cpu6:.2f}"
            whole, whole6 = r.get("kiln-whole", {}), six.get("kiln-whole", {})
            if "first_s" in whole and "first_s" in whole6:
                line += f"; regional reuse off: {whole['first_s'] / whole6['first_s']:.2f}"
            lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
