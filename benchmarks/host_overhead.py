"""Where kiln's per-call host time goes on CPU, for small real models with tiny inputs.

    python benchmarks/host_overhead.py [--models gpt2,bert,resnet] [--modes infer,train]
        [--calls 200] [--profile] [--out benchmarks/results/host_overhead.json]

Models (random weights, batch 1, tiny inputs so that the kernels take little time and the
host path shows): HF GPT-2 with 2 layers, HF BERT with 2 layers, and the in-repo
``SmallResNet`` of ``zoo.py`` on an 8x8 image. Modes: ``infer`` (under ``torch.no_grad``)
and ``train`` (forward, ``.sum().backward()``, gradients set to None).

Per model and mode it prints the per-call time of eager, ``torch.compile`` and
``kiln.compile`` (interleaved rounds, the best round), and for kiln the time of each layer of the
call, timed by calling the layer's object directly with the arguments it receives:

    hook      the whole call minus the cache entry's ``run`` and ``guard`` timed alone:
              kiln-capture's frame hook (C hook, cache lookup, nn.Module call, context
              push/pop), and what the layers cost more inside a call than alone in a loop
              (their objects are out of the CPU caches after the graph's work)
    guard     the cache entry's generated guard function, alone in a loop; beside the
              guard count, ``in call``: the same function timed inside real calls
    run fn    the entry's generated ``run`` function minus the compiled graph call:
              re-reading inputs (parameters) from their sources, rebuilding the output
    aot       kiln-aot's runtime: the callable the backend returned minus kiln-inductor's
              ``CompiledGraph`` (plan lookup, autograd.Function, output finishing)
    inductor  ``CompiledGraph.__call__`` minus the generated wrapper (input layout checks)
    wrapper   the generated wrapper's own Python (cProfile: its ``tottime`` share)
    kernels   the kernels and ATen calls the wrapper makes (the rest of the wrapper's time)

In ``train`` mode the layers are the forward only (``aot`` includes the autograd.Function
and the backward is in ``backward``: the whole step minus the forward). The guard count of
every model is printed beside the guard time. ``--profile`` prints the top of a cProfile of
kiln's calls. Results go to JSON (default ``benchmarks/results/host_overhead.json``).
Timings are the process's CPU time, the best of interleaved rounds (the 2-core machine is
shared: CPU time leaves out the time other work holds the cores; say in a report when it
was loaded).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


# -- models ------------------------------------------------------------------------------


def _hf(name: str):
    from capture_overhead import _hf_models  # the tiny 2-layer configs of that benchmark

    torch.manual_seed(0)
    model, kwargs = _hf_models()[name]()
    g = torch.Generator().manual_seed(1)
    return model, (torch.randint(0, 128, (1, 8), generator=g),), kwargs


def _resnet():
    from zoo import SmallResNet

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    image = torch.randn(1, 3, 8, 8, generator=g)
    return SmallResNet(widths=(8, 16, 16, 32), classes=10), (image,), {}


MODELS = {"gpt2": lambda: _hf("gpt2"), "bert": lambda: _hf("bert"), "resnet": _resnet}
DEVICE, DTYPE, SIZE = "cpu", torch.float32, "small"  # set by --device/--dtype/--size
TOL = 1e-3  # largest relative difference from eager taken as correct (by --dtype)


def build(name: str):
    """(model, positional args, keyword args): this file's tiny CPU models, or any model of
    ``zoo.py`` (HF and timm, e.g. ``timm_resnet50``) on --device in --dtype at --size."""
    if name in MODELS and DEVICE == "cpu":
        return MODELS[name]()
    from zoo import ZOO

    model, args = ZOO[name][1](DEVICE, DTYPE, SIZE)
    if isinstance(args, dict):
        return model, (), args
    return model, tuple(args), {}


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# -- timing ------------------------------------------------------------------------------


def _first_tensor(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, dict):
        out = list(out.values())
    return next(v for v in out if isinstance(v, torch.Tensor))


def _step(train: bool):
    """A callable running one call ``fn(*args, **kwargs)`` (inference or a training step)."""
    if not train:

        def infer(fn, args, params):
            with torch.no_grad():
                return fn(*args[0], **args[1])

        return infer

    def train_step(fn, args, params):
        out = _first_tensor(fn(*args[0], **args[1]))
        out.sum().backward()
        for p in params:
            p.grad = None
        return out

    return train_step


def interleaved_us(fns: dict, calls: int, rounds: int = 15) -> dict[str, float]:
    """Least over rounds of this process's CPU microseconds per call (time on the CPU, so
    that other work on the shared cores does not count, and the least disturbed round);
    the callables take turns per round so that what load remains hits each alike."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    clock = time.process_time
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = clock()
            for _ in range(calls):
                fn()
            samples[k].append((clock() - t0) / calls * 1e6)
            _sync()
    return {k: min(v) for k, v in samples.items()}


# -- kiln's layers -----------------------------------------------------------------------


class Recording:
    """Wraps a callable and keeps the arguments of its last call."""

    def __init__(self, fn):
        self.fn = fn
        self.args = None

    def __call__(self, *args):
        self.args = _fresh(args)
        return self.fn(*args)


def kiln_layers(compiled, args, train: bool) -> dict:
    """The objects of each layer of kiln's call, with the arguments they receive."""
    from kiln_capture import hook

    entries = [e for es in hook._cache.values() for e in es]
    if len(entries) != 1:
        return {"error": f"{len(entries)} cache entries (graph breaks): layers not split"}
    entry = entries[0]
    ns = entry.run.__globals__
    graph = ns.get("__k_graph")
    if graph is None:
        return {"error": "no compiled graph in the cache entry"}
    # the frame's argument slots, as the hook passes them: record them from a guard call
    guard_rec = Recording(lambda *a: entry_guard(*a))
    entry_guard = entry.guard
    entry.guard = guard_rec
    graph_rec = Recording(graph)
    ns["__k_graph"] = graph_rec
    aot = _aot_compiled(graph)
    inner_rec = guarded = None
    if aot is not None:
        plan = next(iter(aot.plans.values()))
        inner_name = "fw" if hasattr(plan, "fw") else "compiled"
        inner = getattr(plan, inner_name)
        inner_rec = Recording(inner)
        setattr(plan, inner_name, inner_rec)
        # guarded calls (kiln-capture checked the inputs) go through the plan's _guarded
        # (the CompiledGraph's kiln_guarded_call), bound when the plan was made
        guarded = getattr(plan, "_guarded", None)
        if guarded is not None:
            guarded_rec = Recording(guarded)
            plan._guarded = guarded_rec
    try:
        _step(train)(compiled, args, [])
    finally:
        entry.guard = entry_guard
        ns["__k_graph"] = graph
        if inner_rec is not None:
            setattr(plan, inner_name, inner)
            if guarded is not None:
                plan._guarded = guarded
                inner_rec.args = inner_rec.args or guarded_rec.args
    slots = guard_rec.args
    with torch.enable_grad() if train else torch.no_grad():
        passes = entry.guard(*_fresh(slots))
    if not passes:
        return {"error": "the guard fails outside the call: layers not split"}
    layers = {
        "entry": entry,
        "guard": (lambda: entry.guard(*_fresh(slots))),
        "run": (lambda: entry.run(*_fresh(slots))),
        "graph": (lambda: graph(*graph_rec.args)),
        "guard_count": len(entry.guard_set.guards),
        "graph_inputs": len(graph_rec.args),
    }
    if inner_rec is not None and hasattr(inner, "_call"):
        flat = inner_rec.args
        layers["compiled_graph"] = lambda: inner(*flat)
        call_args = tuple(flat[0]) if len(flat) == 1 and isinstance(flat[0], list) else flat
        layers["wrapper"] = lambda: inner._call(call_args)
        layers["wrapper_fn"] = inner._call
        layers["wrapper_args"] = call_args
        layers.update(_wrapper_calls(inner._call, call_args))
    return layers


class _Calls:
    """Stands in for a wrapper global (a kernel launcher, an ATen op, the allocator) and
    keeps the arguments and the result of each call."""

    def __init__(self, fn, log: list):
        self.fn, self.log = fn, log

    def __call__(self, *args, **kwargs):
        result = self.fn(*args, **kwargs)
        # results are kept: kernels get raw pointers, which must stay valid for replays
        self.log.append((self.fn, args, kwargs, result))
        return result

    @property
    def fast(self):
        """What the wrapper calls on a Triton launcher (``kernel_3.fast(...)``)."""
        return _Calls(self.fn.fast, self.log) if hasattr(self.fn, "fast") else self


def _wrapper_kind(name: str) -> str | None:
    if name.startswith("kernel_"):
        return "launches"
    if name.startswith("aten_"):
        return "aten"
    return "alloc" if name == "empty_strided" else None


def _wrapper_calls(wrapper_fn, call_args) -> dict:
    """The wrapper's kernel launches and ATen calls, each replayable alone with the
    arguments of one real call: ``launches`` (``kernel_*`` globals) and ``aten``
    (``aten_*``: library kernels and fallbacks), timed as loops over the recorded calls.
    Every buffer of the recorded call stays alive, so the kernels' pointers stay valid."""
    ns = wrapper_fn.__globals__
    logs: dict[str, list] = {"launches": [], "aten": [], "alloc": []}
    saved = {}
    for key, value in list(ns.items()):
        kind = _wrapper_kind(key)
        if kind is not None and callable(value):
            saved[key] = value
            ns[key] = _Calls(value, logs[kind])
    try:
        wrapper_fn(call_args)
    finally:
        ns.update(saved)
    out = {}
    for kind in ("launches", "aten"):
        if logs[kind]:

            def replay(log=logs[kind], keep=logs):
                for fn, args, kwargs, _ in log:
                    fn(*args, **kwargs)

            out[kind] = replay
            out[f"{kind}_count"] = len(logs[kind])
    return out


def guard_in_call_us(entry, call, calls: int, rounds: int = 5) -> float:
    """The guard function's CPU microseconds inside real calls (least over rounds of the
    mean per call). Timed alone in a loop the guard's objects stay in the CPU caches; in
    a call, the graph's work evicts them in between, and the guard costs several times
    more (it reads every module, hook table and parameter of the model)."""
    guard, clock, spent = entry.guard, time.process_time, [0.0]

    def timed(*a):
        t0 = clock()
        try:
            return guard(*a)
        finally:
            spent[0] += clock() - t0

    entry.guard = timed
    best = float("inf")
    try:
        for _ in range(rounds):
            spent[0] = 0.0
            for _ in range(calls):
                call()
            best = min(best, spent[0] / calls * 1e6)
    finally:
        entry.guard = guard
    return best


def _fresh(slots: tuple) -> tuple:
    """The frame's argument slots with dicts copied: a run function may update the
    ``**kwargs`` dict it receives (a side effect of the frame), which the hook gets anew
    on each call."""
    return tuple(dict(a) if type(a) is dict else a for a in slots)


def _aot_compiled(graph, depth: int = 2):
    """kiln-aot's AotCompiled object behind the backend's callable (in its closure, or in
    the closure of the checked call a ``kiln_guarded_call`` falls back to)."""
    for cell in getattr(graph, "__closure__", None) or ():
        obj = cell.cell_contents
        if hasattr(obj, "plans") and hasattr(obj, "plan_for"):
            return obj
        if depth > 0 and callable(obj) and getattr(obj, "__closure__", None):
            found = _aot_compiled(obj, depth - 1)
            if found is not None:
                return found
    return None


def wrapper_python_share(wrapper_fn, call_args, calls: int) -> float:
    """The fraction of the generated wrapper's time spent in its own Python lines."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        wrapper_fn(call_args)
    prof.disable()
    st = pstats.Stats(prof)
    own = total = 0.0
    for (filename, _, name), (_, _, tt, ct, _) in st.stats.items():
        if filename.startswith("<kiln wrapper") and name == "call":
            own += tt
            total += ct
    return own / total if total else float("nan")


def profile_text(fn, calls: int, top: int = 25) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# -- one model ---------------------------------------------------------------------------


def _rel_diff(got: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest difference relative to the largest expected magnitude (float32 compare)."""
    got, expected = got.float(), expected.float()
    return ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()


def measure(name: str, train: bool, calls: int, show_profile: bool) -> dict:
    import kiln

    model, *args = build(name)  # args: (positional, keyword)
    model.train(False)  # dropout off in both modes: the compared outputs are deterministic
    params = [p for p in model.parameters() if p.requires_grad] if train else []
    step = _step(train)
    expected = _first_tensor(step(model, args, params)).detach()

    torch._dynamo.reset()
    tc = torch.compile(model)
    kiln.reset()
    km = kiln.compile(model)
    got_torch = _first_tensor(step(tc, args, params)).detach()
    got_kiln = _first_tensor(step(km, args, params)).detach()
    row = {
        "model": name,
        "mode": "train" if train else "infer",
        "max_diff_kiln": _rel_diff(got_kiln, expected),
        "max_diff_torch_compile": _rel_diff(got_torch, expected),
    }
    totals = interleaved_us(
        {
            "eager": lambda: step(model, args, params),
            "torch.compile": lambda: step(tc, args, params),
            "kiln": lambda: step(km, args, params),
        },
        calls,
    )
    row.update({f"{k}_us": v for k, v in totals.items()})
    row["guards"] = None
    grad = torch.enable_grad() if train else torch.no_grad()
    if show_profile:
        with grad:
            row["profile"] = profile_text(lambda: step(km, args, params), calls)
    layers = kiln_layers(km, args, train)
    if "error" in layers:
        row["layers_error"] = layers["error"]
        return row
    row["guards"] = layers["guard_count"]
    row["graph_inputs"] = layers["graph_inputs"]
    with grad:
        timed = {
            k: layers[k]
            for k in ("guard", "run", "graph", "compiled_graph", "wrapper", "launches", "aten")
            if k in layers
        }
        if train:
            timed["forward"] = lambda: km(*args[0], **args[1])
        else:
            timed["call"] = lambda: km(*args[0], **args[1])
        t = interleaved_us(timed, calls)
        row["guard_in_call_us"] = guard_in_call_us(
            layers["entry"], timed.get("call") or timed["forward"], calls
        )
        if "wrapper_fn" in layers:
            share = wrapper_python_share(layers["wrapper_fn"], layers["wrapper_args"], calls)
    row["kiln_layer_us"] = t
    whole = t["forward"] if train else t["call"]
    split = {
        "hook": whole - t["run"] - t["guard"],
        "guard": t["guard"],
        "run fn": t["run"] - t["graph"],
    }
    if "compiled_graph" in t:
        wrapper_py = t["wrapper"] * share
        split.update(
            {
                "aot": t["graph"] - t["compiled_graph"],
                "inductor": t["compiled_graph"] - t["wrapper"],
                "wrapper": wrapper_py,
                "kernels": t["wrapper"] - wrapper_py,
            }
        )
        # the kernels' part, split: launches, ATen calls, the rest (allocation, views)
        for k in ("launches", "aten"):
            if k in t:
                split[k] = t[k]
                row[f"{k}_count"] = layers[f"{k}_count"]
    else:
        split["graph"] = t["graph"]
    if train:
        split["backward"] = totals["kiln"] - whole
    row["kiln_split_us"] = split
    row["kiln_host_us"] = sum(
        v for k, v in split.items() if k not in ("kernels", "backward", *KERNEL_SPLIT)
    )
    return row


# -- output ------------------------------------------------------------------------------

SPLIT = ("hook", "guard", "run fn", "aot", "inductor", "wrapper", "kernels", "backward")
KERNEL_SPLIT = ("launches", "aten")  # parts of "kernels", timed alone: replayed calls


def print_table(rows: list[dict]) -> None:
    W = max(8, *(len(r["model"]) + 1 for r in rows))
    print(
        "\nPer call, microseconds (process CPU time, best of interleaved rounds); kiln host = everything"
    )
    print("but kernels (and backward in train mode); 'in call' = the guard function timed inside")
    print("real calls (cold caches); the split's 'guard' = timed alone in a loop (hot caches);")
    print(
        "'launches' and 'aten' = the kernel launches and ATen calls of one wrapper call, replayed"
    )
    print("alone (their share of 'kernels')")
    head = (
        f"{'model':{W}s}{'mode':6s}{'eager':>8s}{'torch.c':>9s}{'kiln':>8s}{'host':>8s}{'guards':>8s}"
        f"{'in call':>9s}"
    )
    head += "".join(f"{k:>9s}" for k in SPLIT + KERNEL_SPLIT)
    print(head)
    for r in rows:
        s = r.get("kiln_split_us", {})
        line = (
            f"{r['model']:{W}s}{r['mode']:6s}{r['eager_us']:8.0f}{r['torch.compile_us']:9.0f}"
            f"{r['kiln_us']:8.0f}{r.get('kiln_host_us', float('nan')):8.0f}"
            f"{r['guards'] if r['guards'] is not None else '-':>8}"
            f"{r.get('guard_in_call_us', float('nan')):9.1f}"
        )
        line += "".join(f"{s[k]:9.1f}" if k in s else f"{'-':>9s}" for k in SPLIT + KERNEL_SPLIT)
        counts = [f"{r[f'{k}_count']} {k}" for k in KERNEL_SPLIT if f"{k}_count" in r]
        if counts:
            line += f"  ({', '.join(counts)})"
        print(line)
        if "layers_error" in r:
            print(f"  ({r['layers_error']})")
    for r in rows:
        bad = [k for k in ("max_diff_kiln", "max_diff_torch_compile") if not r[k] < TOL]
        if bad:
            print(f"MISMATCH {r['model']} {r['mode']}: {[(k, r[k]) for k in bad]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--calls", type=int, default=200, help="calls per timing round")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--device", default="cpu", help="cpu or cuda (zoo.py's models on cuda)")
    p.add_argument("--dtype", default=None, help="default: float32 on cpu, bfloat16 on cuda")
    p.add_argument("--size", default="small", help="zoo.py's model size: small or large")
    p.add_argument("--profile", action="store_true", help="print a cProfile of kiln's calls")
    p.add_argument("--out", default=str(HERE / "results" / "host_overhead.json"))
    a = p.parse_args()
    global DEVICE, DTYPE, SIZE, TOL
    DEVICE, SIZE = a.device, a.size
    DTYPE = getattr(torch, a.dtype or ("bfloat16" if a.device == "cuda" else "float32"))
    TOL = 1e-3 if DTYPE in (torch.float32, torch.float64) else 5e-2
    torch.set_num_threads(a.threads)
    rows = []
    for name in a.models.split(","):
        for mode in a.modes.split(","):
            print(f"measuring {name} {mode} ...", flush=True)
            row = measure(name, mode == "train", a.calls, a.profile)
            if a.profile and "profile" in row:
                print(row["profile"])
            rows.append(row)
    print(
        f"\nPython {platform.python_version()}, torch {torch.__version__}, threads {a.threads}, "
        f"{DEVICE} {DTYPE} {SIZE}"
    )
    print_table(rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(
        json.dumps(
            {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "threads": a.threads,
                "device": DEVICE,
                "dtype": str(DTYPE),
                "size": SIZE,
                "load": os.getloadavg(),
                "rows": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {a.out}")
    return 0 if all(r["max_diff_kiln"] < TOL for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
