"""Where a kiln training step's time goes, side by side with eager and torch.compile.

For each model (HF GPT-2, BERT, LLaMA from zoo.py), forward + backward of
``cross_entropy(model(**inputs)[0], target)``: eager, torch.compile and kiln.compile; every
gradient checked against eager. Then one torch.profiler run of kiln's steps attributes its
step time to

- kernels: kiln's generated kernels (each ``kernel_*`` call of a wrapper is wrapped in a
  ``kiln::<graph>.<kernel> <kind>: <ops>`` range), per op family;
- library: ATen calls (mm, attention, embedding, ...), per op;
- copies: ``aten::copy_`` / ``contiguous`` / ``clone`` / ``_to_copy`` not inside a library call;
- allocations: ``empty`` / ``empty_strided`` / ``zeros`` the wrappers make;
- host: the rest of the step (Python wrappers, guards, autograd engine, profiler overhead);

and, with ``--device cuda``, device time per kernel family. It also counts, per step, the
layout copies kiln makes (``kiln_inductor.layout_copies()``: which graph input or op result,
strides given vs expected, bytes; ``kiln_aot.tangent_copies()``: tangents copied before the
backward). Timings are the median and the spread (min-max) over ``--runs`` interleaved runs;
the counts are exact. A table per model is printed and JSON written to
``benchmarks/results/train_profile_<device>.json``.

    python benchmarks/train_profile.py [--device cpu|cuda] [--models gpt2,bert,llama]
        [--size small|large] [--runs 3] [--steps 5] [--threads 2] [--loss ce|sum]
        [--no-variants] [--autocast]

``--loss sum`` backpropagates ``out.sum()`` (autograd sends the compiled backward an
expanded ``ones``); ``--no-variants`` restores the old per-step tangent copy, to measure
copies before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("KILN_ARTIFACT_CACHE", "0")  # compile afresh: kernel names are known

import torch
import torch.nn.functional as F

import kiln
import kiln_aot
import kiln_aot.backward_variants
import kiln_inductor
from kiln_inductor import compile as kiln_compile_mod

sys.path.insert(0, str(Path(__file__).parent))
import training
from zoo import build_model

COPY_OPS = {"aten::copy_", "aten::contiguous", "aten::clone", "aten::_to_copy", "aten::to"}
ALLOC_OPS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::zeros",
             "aten::zeros_like", "aten::new_empty_strided", "aten::new_zeros"}  # fmt: skip
VIEW_OPS = {"aten::as_strided", "aten::view", "aten::_reshape_alias", "aten::t",
            "aten::transpose", "aten::permute", "aten::expand", "aten::detach", "aten::alias",
            "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::reshape"}  # fmt: skip


# -- kernel names: each generated kernel's call wrapped in a profiler range ----------------

_groups: list = []  # the fused groups of the graph being compiled (fuse_nodes' result)


def _instrument() -> None:
    """Name every kiln kernel in profiles: ``fuse_nodes`` tells each group's ops, the new
    ``CompiledGraph``'s wrapper globals get each ``kernel_*`` wrapped in a range."""
    fuse = kiln_compile_mod.fuse_nodes

    def fuse_nodes(ir):
        steps = fuse(ir)
        _groups[:] = [s for s in steps if hasattr(s, "blocks")]
        return steps

    kiln_compile_mod.fuse_nodes = fuse_nodes
    init = kiln_compile_mod.CompiledGraph.__init__

    def __init__(self, call, source, stats, layouts=()):
        init(self, call, source, stats, layouts)
        labels = {g.name: _label(g) for g in _groups}
        namespace = call.__globals__
        for m in re.finditer(r"^\s*(kernel_\d+)(\.fast)?\(.*# (\w+)$", source, re.M):
            glob, fast, group = m.groups()
            fn = namespace.get(glob)
            if fn is not None and not getattr(fn, "_profiled", False):
                name = f"kiln::{group} {labels.get(group, '?')}"
                namespace[glob] = _Launch(fn, name) if fast else _ranged(fn, name)

    kiln_compile_mod.CompiledGraph.__init__ = __init__


class _Launch:
    """A GPU kernel's launcher (called as ``kernel_N.fast(...)``) with its calls ranged."""

    _profiled = True

    def __init__(self, launcher, name: str):
        self.fast = _ranged(launcher.fast, name)


def _label(group) -> str:
    kind = "pointwise"
    for b in group.blocks:
        if b.kind != "pointwise":
            kind = f"{b.kind}[{'x'.join(map(str, b.rranges))}]"
    kind += f" x{'x'.join(map(str, group.outer))}"
    ops = Counter()
    for n in group.nodes:
        for o in str(getattr(n, "origin", "") or "?").split(","):
            ops[o.strip().removeprefix("aten.").split(".")[0]] += 1
    return f"{kind}: {','.join(o for o, _ in ops.most_common(3))}"


def _ranged(fn, name: str):
    rf = torch.autograd.profiler.record_function

    def call(*args):
        with rf(name):
            return fn(*args)

    call._profiled = True
    return call


# -- the step ----------------------------------------------------------------------------


def _setup(name: str, device: str, size: str, dtype: str):
    if name in training.MODELS.split(","):  # the rows of benchmarks/training.py
        try:
            model, args = training.build(name, size == "large")
        except ImportError:
            return None
        model = training._no_dropout(model).to(device=device, dtype=getattr(torch, dtype))
        if isinstance(args, dict):
            args = {k: v.to(device) for k, v in args.items()}
        else:
            args = tuple(v.to(device=device, dtype=getattr(torch, dtype)) for v in args)
    else:
        _, model, args = build_model(name, device, dtype, size)
    if model is None:
        return None
    model.train()
    with torch.no_grad():
        out = _call(model, args)
    g = torch.Generator().manual_seed(2)
    target = torch.randint(0, out.shape[-1], (out.shape[:-1].numel(),), generator=g).to(device)
    return model, args, target


def _call(model, args):
    return training._first_float(model(**args) if isinstance(args, dict) else model(*args))


def _stepper(fn, model, args, target, loss_kind: str = "ce", autocast: bool = False):
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device.type

    def step():
        for p in params:
            p.grad = None
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            out = _call(fn, args)
        if loss_kind == "sum":  # the expanded ones tangent
            loss = out.float().sum()
        else:
            loss = F.cross_entropy(out.flatten(0, -2).float(), target)
        loss.backward()
        return loss

    return step, params


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(step, steps: int, device: str) -> float:
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / steps * 1e3


def _memory(step, params, device: str) -> dict:
    """One step's peak memory above what was allocated before it (GPU: the caching
    allocator's count; CPU: not measured) and the bytes of the activations the forward
    saved for the backward (distinct storages, parameters not counted), taken with
    ``saved_tensors_hooks``, which see eager's saves and every compiler's
    ``save_for_backward`` alike."""
    owned = {p.untyped_storage().data_ptr() for p in params}
    saved: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            if st.data_ptr() not in owned:
                saved[st.data_ptr()] = st.nbytes()
        return t

    _sync(device)
    if device == "cuda":
        for p in params:
            p.grad = None
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    _sync(device)
    out = {"saved_mb": sum(saved.values()) / 2**20, "saved_tensors": len(saved)}
    if device == "cuda":
        out["peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return out


def _max_rel_err(grads, ref) -> float:
    worst = 0.0
    for g, r in zip(grads, ref):
        if g is None or r is None:
            if (g is None) != (r is None):
                return float("inf")
            continue  # a parameter the loss does not reach (BERT's pooler)
        worst = max(worst, ((g - r).abs().max() / r.abs().max().clamp_min(1e-6)).item())
    return worst


# -- the profile -------------------------------------------------------------------------


def _category(e) -> tuple[str, str] | None:
    name = e.name
    if name.startswith("kiln::"):
        return "kernels", name.split(" ", 1)[1].split(":")[0] + ": " + name.split(": ", 1)[-1]
    if name in COPY_OPS:
        return "copies", name
    if name in ALLOC_OPS:
        return "allocations", name
    if name in VIEW_OPS:
        return "host", "views"
    if name.startswith("aten::"):
        return "library", name
    return None


def _attribute(prof, steps: int) -> dict:
    """Self CPU time (ms per step) per category and op, each event counted under its
    outermost categorized ancestor; the step's time not in any is host time."""
    by = defaultdict(float)
    per_op: dict[str, Counter] = defaultdict(Counter)
    calls: dict[str, Counter] = defaultdict(Counter)
    step_total = 0.0
    device = Counter()
    kernels = Counter()
    spans: list[tuple[float, float, str]] = []  # device work on the timeline (us)
    # device time of each kiln kernel (its range's kernels), forward and backward
    labelled = Counter()
    for e in prof.events():
        if e.name.startswith("kiln::") and e.device_time_total:
            labelled[e.name.split(" ", 1)[1]] += e.device_time_total
        if e.name == "train_step":
            step_total += e.cpu_time_total
            continue
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            if e.name.startswith("kiln::") or e.name == "train_step":
                continue  # a range's span on the GPU timeline, not a kernel
            t = e.device_time_total if hasattr(e, "device_time_total") else 0
            device[_device_family(e.name)] += t
            kernels[e.name[:90]] += t
            spans.append((e.time_range.start, e.time_range.end, e.name[:60]))
            continue
        chain, p = [], e
        while p is not None:
            chain.append(p)
            p = p.cpu_parent
        if not any(c.name == "train_step" for c in chain):
            continue
        cat = None
        for c in reversed(chain):  # outermost first
            cat = _category(c)
            if cat is not None:
                if c is e:
                    calls[cat[0]][cat[1]] += 1
                break
        if cat is None:
            continue
        by[cat[0]] += e.self_cpu_time_total
        per_op[cat[0]][cat[1]] += e.self_cpu_time_total
    out = {k: v / steps / 1e3 for k, v in by.items()}
    out["host"] = (
        step_total / steps / 1e3
        - sum(v for k, v in out.items() if k != "host")
        + out.get("host", 0)
    )
    detail = {
        k: {op: (t / steps / 1e3, calls[k][op] / steps) for op, t in c.most_common(8)}
        for k, c in per_op.items()
    }
    idle = _idle(spans, steps)
    return {"ms_per_step": out, "device_idle": idle, "step_ms": step_total / steps / 1e3, "top": detail,
            "device_ms_per_step": {k: v / steps / 1e3 for k, v in device.items()},
            "device_top": {k: v / steps / 1e3 for k, v in kernels.most_common(15)},
            "kiln_kernels_device": {k: v / steps / 1e3 for k, v in labelled.most_common(25)}}  # fmt: skip


def _idle(spans: list[tuple[float, float, str]], steps: int) -> dict:
    """The GPU's idle time between its first and last kernel (per step), and the longest
    gaps with the kernels on either side: where the host, not the device, set the pace."""
    spans.sort()
    gaps = []
    end = None
    for start, stop, name in spans:
        if end is not None and start > end[0]:
            gaps.append((start - end[0], end[1], name))
        if end is None or stop > end[0]:
            end = (stop, name)
    total = sum(g for g, _, _ in gaps)
    top = sorted(gaps, reverse=True)[:8]
    return {"ms_per_step": total / steps / 1e3,
            "gaps_over_50us_per_step": sum(1 for g, _, _ in gaps if g > 50) / steps,
            "longest": [{"us": round(g, 1), "after": a, "before": b} for g, a, b in top]}  # fmt: skip


def _device_family(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("gemm", "cublas", "matmul")):
        return "library: mm"
    if any(k in n for k in ("conv", "cudnn", "dgrad", "wgrad", "implicit")):
        return "library: convolution"
    if any(k in n for k in ("cutlass", "sm90", "sm80", "ampere", "xmma")):
        return "library: mm"
    if any(k in n for k in ("flash", "fmha", "attention", "efficient")):
        return "library: attention"
    if "memcpy" in n or "copy" in n:
        return "copies"
    if "memset" in n:
        return "allocations (memset)"
    if "at::native" in n or "elementwise" in n or "reduce_kernel" in n:
        return "library: other aten"
    return "kernels (kiln)"


def _profile(step, steps: int, device: str) -> dict:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    kiln_inductor.reset_layout_copies()
    kiln_aot.reset_tangent_copies()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):  # no synchronization between steps, as timed
            with torch.autograd.profiler.record_function("train_step"):
                step()
        _sync(device)
    copies = [
        {
            "site": c.site,
            "shape": c.shape,
            "given": c.given,
            "expected": c.expected,
            "bytes": c.nbytes,
            "per_step": n / steps,
        }  # fmt: skip
        for c, n in kiln_inductor.layout_copies().items()
    ] + [
        {
            "site": site,
            "shape": shape,
            "given": given,
            "expected": want,
            "bytes": None,
            "per_step": n / steps,
        }  # fmt: skip
        for (site, shape, given, want), n in kiln_aot.tangent_copies().items()
    ]
    return {**_attribute(prof, steps), "layout_copies": copies}


def _kiln_stats() -> dict:
    return {k: v for k, v in kiln.stats().items() if isinstance(v, int)}


def run_model(name: str, a) -> dict | None:
    made = _setup(name, a.device, a.size, a.dtype)
    if made is None:
        return None
    model, args, target = made
    eager, params = _stepper(model, model, args, target, a.loss, a.autocast)
    eager()
    ref = [None if p.grad is None else p.grad.clone() for p in params]
    kiln.reset()
    t0 = time.perf_counter()
    kiln_step, _ = _stepper(kiln.compile(model), model, args, target, a.loss, a.autocast)
    kiln_step()
    kiln_compile_s = time.perf_counter() - t0
    kiln_err = _max_rel_err([p.grad for p in params], ref)
    stats = _kiln_stats()
    t0 = time.perf_counter()
    torch_step, _ = _stepper(torch.compile(model), model, args, target, a.loss, a.autocast)
    torch_step()
    torch_compile_s = time.perf_counter() - t0
    torch_err = _max_rel_err([p.grad for p in params], ref)
    kinds = {"eager": eager, "torch.compile": torch_step, "kiln": kiln_step}
    for fn in kinds.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(a.runs):  # interleaved
        for k, fn in kinds.items():
            times[k].append(_time(fn, a.steps, a.device))
    memory = {k: _memory(fn, params, a.device) for k, fn in kinds.items()}
    profile = _profile(kiln_step, a.steps, a.device)
    others = {}
    if a.device == "cuda":  # where eager's and torch.compile's device time goes, to compare
        for k in ("eager", "torch.compile"):
            p = _profile(kinds[k], a.steps, a.device)
            others[k] = {
                "device_ms_per_step": p["device_ms_per_step"],
                "device_top": p["device_top"],
            }
    return {
        "model": name,
        "device": a.device,
        "size": a.size,
        "loss": a.loss,
        "autocast": a.autocast,
        "backward_variants": not a.no_variants,
        "times_ms": {
            k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for k, v in times.items()
        },
        "compile_s": {"kiln": kiln_compile_s, "torch.compile": torch_compile_s},
        "grad_max_rel_err": {"kiln": kiln_err, "torch.compile": torch_err},
        "kiln_stats": stats,
        "memory": memory,
        "kiln_profile": profile,
        "other_profiles": others,
    }


def _print(row: dict) -> None:
    t = row["times_ms"]
    print(f"\n== {row['model']} ({row['device']}, {row['size']}) ==")
    for k, v in t.items():
        speed = t["eager"]["median"] / v["median"]
        print(
            f"  {k:14s} {v['median']:8.2f} ms ({v['min']:.2f}-{v['max']:.2f})  {speed:.2f}x eager"
        )
    print(f"  compile s: kiln {row['compile_s']['kiln']:.1f}, torch {row['compile_s']['torch.compile']:.1f}"
          f"; grad max rel err: kiln {row['grad_max_rel_err']['kiln']:.1e}, "
          f"torch {row['grad_max_rel_err']['torch.compile']:.1e}; {row['kiln_stats']}")  # fmt: skip
    for k, m in row["memory"].items():
        peak = f"peak {m['peak_mb']:8.1f} MB, " if "peak_mb" in m else ""
        print(
            f"  memory {k:14s} {peak}saved {m['saved_mb']:8.1f} MB in {m['saved_tensors']} tensors"
        )
    p = row["kiln_profile"]
    print(f"  kiln profiled step {p['step_ms']:.2f} ms (profiler overhead included):")
    for cat, ms in sorted(p["ms_per_step"].items(), key=lambda kv: -kv[1]):
        print(f"    {cat:12s} {ms:8.2f} ms  {100 * ms / max(p['step_ms'], 1e-9):5.1f}%")
        for op, (ms_op, n) in list(p["top"].get(cat, {}).items())[:5]:
            print(f"        {ms_op:8.2f} ms  {n:6.1f} calls/step  {op}")
    profiles = {"kiln": p, **row.get("other_profiles", {})}
    families = sorted({f for q in profiles.values() for f in q["device_ms_per_step"]})
    if families:
        print("    device ms/step " + "".join(f"{k:>15s}" for k in profiles))
        for fam in families:
            cells = "".join(
                f"{q['device_ms_per_step'].get(fam, 0):15.2f}" for q in profiles.values()
            )
            print(f"    {fam:26s}{cells}")
        for k, q in profiles.items():
            if "device_idle" in q:
                i = q["device_idle"]
                print(
                    f"    GPU idle between kernels, {k}: {i['ms_per_step']:.2f} ms/step, "
                    f"{i['gaps_over_50us_per_step']:.0f} gaps > 50 us/step; longest:"
                )
                for g in i["longest"][:4]:
                    print(f"      {g['us']:9.1f} us after {g['after']} before {g['before']}")
        if p.get("kiln_kernels_device"):
            print("    kiln's kernels by fused group (device ms/step):")
            for name, ms in p["kiln_kernels_device"].items():
                print(f"      {ms:8.2f} ms  {name}")
        for k, q in profiles.items():
            print(f"    top device kernels, {k}:")
            for name, ms in q["device_top"].items():
                print(f"      {ms:8.2f} ms  {name}")
    copies = p["layout_copies"]
    print(f"  layout copies per step: {sum(c['per_step'] for c in copies):g}")
    for c in copies:
        print(
            f"    {c['per_step']:g}x {c['site']}: shape {c['shape']} strides {c['given']} -> {c['expected']}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default="gpt2,bert,llama")
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--loss", default="ce", help="ce: cross_entropy(out, target); sum: out.sum()")
    ap.add_argument("--autocast", action="store_true", help="the forward under bf16 autocast")
    ap.add_argument(
        "--no-variants",
        action="store_true",
        help="copy tangents to the traced strides (kiln-aot before backward_variants.py)",
    )
    a = ap.parse_args()
    if a.no_variants:
        kiln_aot.backward_variants.BackwardVariants.for_graph = staticmethod(lambda *_: None)
    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    else:  # fp32 strict, as benchmarks/training.py measures it
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    _instrument()
    rows = []
    for name in a.models.split(","):
        row = run_model(name, a)
        if row is None:
            print(f"{name}: skipped (not installed)")
            continue
        _print(row)
        rows.append(row)
    tag = f"{a.device}_{a.loss}" + ("_no_variants" if a.no_variants else "")
    tag += "_bf16" if a.autocast else ""
    out = Path(__file__).parent / "results" / f"train_profile_{tag}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=1, default=str))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
