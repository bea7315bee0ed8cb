"""Training steps: eager, torch.compile and kiln side by side, with spreads and peak memory.

    python benchmarks/training.py                                # CPU, small configs, fp32
    python benchmarks/training.py --device cuda --mode fp32      # H200, full-size, TF32 off
    python benchmarks/training.py --device cuda --mode bf16      # H200, bf16 autocast
    python benchmarks/training.py --models gpt2,bert --rounds 3 --steps 10
    python benchmarks/training.py --device cuda --rounds 0 --jobs 4  # compile and check only,
                                                 # four workers at once: fills the caches

Each row is one model in a fresh worker process. A step is forward, a cross-entropy loss on
the first output (logits, or hidden states treated as logits) against fixed random targets,
and backward, as people train: ``model.train()``, dropout set to 0 so that every compiler
can be checked against eager. The model is compiled as users do it (``torch.compile(model)``,
``kiln.compile(model)``: each compiler with its own capture). Per compiler:

- correctness: the loss and every parameter gradient of the first step against eager
  (relative error to ``|eager| + 1``; fp32 1e-3, bf16 autocast 5e-2);
- step time: ``--rounds`` rounds, each timing ``--steps`` steps of every compiler in turn
  (the order rotates per round, so load on a shared machine hits each alike); the median
  step of each round, then the median over rounds with the spread (min-max of the rounds);
- peak memory: the most bytes allocated at once during one step minus what was allocated
  before it (weights, gradients and what the compiler keeps): on the GPU
  ``max_memory_allocated``, on the CPU the profiler's record of torch's CPU allocator (the
  process's peak RSS, used before, also counted what glibc kept from earlier steps and
  compilers: GPT-2 small, kiln 70 MB by RSS, 42 MB allocated; torch.compile 65 and 49);
- graphs, breaks, fallbacks and eager frames (kiln) of the compiled model: a row whose
  compiler fell back, broke or is wrong is flagged and left out of that compiler's geomean;
  every geomean is taken over the same set of models for every compiler.

Models: HF GPT-2 (decoder), BERT and DistilBERT (encoders), LLaMA (decoder), T5
(encoder-decoder); ResNet-50, ConvNeXt-T and ViT-S/16 from timm on the GPU (timm is not
installed on the CPU machine: there HF's ResNet, ConvNeXt and ViT stand in). ``--size
large`` (the default on cuda) uses the full configs (GPT-2 124M, BERT-base, DistilBERT-base,
T5-small, an 8-layer 1024-wide LLaMA) at batch 8 x 512 tokens (T5: 8 x 512 encoder, 8 x 128
decoder) and the vision models at batch 64 x 224 x 224; ``--size small`` (the default on the
CPU) narrow 4-layer configs at batch 2 x 128 and images of 2 x 64 x 64. JSON goes to
benchmarks/results/training_<device>_<mode>.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from provenance import commit  # noqa: E402
from workers import progress, result, run_worker  # noqa: E402

COMPILERS = ["torch.compile", "kiln"]
MODELS = "gpt2,bert,distilbert,llama,t5,resnet50,convnext_tiny,vit_small"


# -- models --------------------------------------------------------------------------------


def _no_dropout(model):
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        for name in ("attention_dropout", "dropout_rate", "drop_rate"):
            if isinstance(getattr(m, name, None), float):
                setattr(m, name, 0.0)
    return model


def _ids(batch: int, seq: int, vocab: int):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def _image(batch: int, size: int):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, 3, size, size, generator=g)


def build(name: str, big: bool):
    """``(model, inputs dict or tuple)`` on the CPU, in fp32; raises ImportError when the
    library a model needs is missing."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    batch, seq = (8, 512) if big else (2, 128)
    small = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4)
    if name == "gpt2":
        cfg = T.GPT2Config() if big else T.GPT2Config(n_layer=4, n_embd=256, n_head=4)
        cfg.vocab_size = 50257 if big else 8192
        cfg.use_cache = False
        return T.GPT2LMHeadModel(cfg), {"input_ids": _ids(batch, seq, cfg.vocab_size)}
    if name == "bert":
        cfg = T.BertConfig() if big else T.BertConfig(**small, intermediate_size=1024)
        if not big:
            cfg.vocab_size = 8192
        return T.BertForMaskedLM(cfg), {"input_ids": _ids(batch, seq, cfg.vocab_size)}
    if name == "distilbert":
        cfg = T.DistilBertConfig() if big else T.DistilBertConfig(n_layers=4, dim=256, n_heads=4)
        if not big:
            cfg.hidden_dim, cfg.vocab_size = 1024, 8192
        return T.DistilBertForMaskedLM(cfg), {"input_ids": _ids(batch, seq, cfg.vocab_size)}
    if name == "llama":
        cfg = T.LlamaConfig(
            num_hidden_layers=8 if big else 4,
            hidden_size=1024 if big else 256,
            num_attention_heads=16 if big else 4,
            num_key_value_heads=8 if big else 2,
            intermediate_size=2816 if big else 688,
            vocab_size=32000 if big else 8192,
            use_cache=False,
        )
        return T.LlamaForCausalLM(cfg), {"input_ids": _ids(batch, seq, cfg.vocab_size)}
    if name == "t5":
        cfg = (
            T.T5Config()
            if big
            else T.T5Config(num_layers=2, d_model=256, d_ff=1024, num_heads=4, vocab_size=8192)
        )
        cfg.dropout_rate, cfg.use_cache = 0.0, False
        ids = _ids(batch, seq, cfg.vocab_size)
        dec = ids[:, : seq // 4]
        return T.T5ForConditionalGeneration(cfg), {"input_ids": ids, "decoder_input_ids": dec}
    images = (_image(64, 224),) if big else (_image(2, 64),)
    try:
        import timm
    except ImportError:
        timm = None
    if timm is not None:
        timm_name = {"vit_small": "vit_small_patch16_224"}.get(name, name)
        kw = {} if big or name != "vit_small" else {"img_size": 64}
        return timm.create_model(timm_name, pretrained=False, **kw), images
    # the CPU machine: HF's vision models stand in for timm's
    if name == "resnet50":
        cfg = T.ResNetConfig() if big else T.ResNetConfig(depths=[1, 1, 1, 1])
        return T.ResNetForImageClassification(cfg), {"pixel_values": images[0]}
    if name == "convnext_tiny":
        cfg = T.ConvNextConfig() if big else T.ConvNextConfig(depths=[1, 1, 2, 1])
        return T.ConvNextForImageClassification(cfg), {"pixel_values": images[0]}
    if name == "vit_small":
        cfg = T.ViTConfig(
            hidden_size=384,
            num_hidden_layers=12 if big else 4,
            num_attention_heads=6,
            intermediate_size=1536,
            image_size=224 if big else 64,
            num_labels=1000,
        )
        return T.ViTForImageClassification(cfg), {"pixel_values": images[0]}
    raise KeyError(f"unknown model {name!r}; known: {MODELS}")


# -- worker --------------------------------------------------------------------------------


def _first_float(out):
    import torch
    from torch.utils._pytree import tree_leaves

    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return next(
        t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()
    )


class Step:
    """forward + cross entropy + backward, the same for every compiler."""

    def __init__(self, device: str, mode: str, inputs) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.mode = mode
        self.inputs = inputs
        self.target = None

    def __call__(self, model):
        torch = self.torch
        model.zero_grad(set_to_none=True)
        ctx = (
            torch.autocast(self.device, dtype=torch.bfloat16)
            if self.mode == "bf16"
            else torch.autocast(self.device, enabled=False)
        )
        with ctx:
            inp = self.inputs
            out = model(**inp) if isinstance(inp, dict) else model(*inp)
            logits = _first_float(out)
            logits = logits.reshape(-1, logits.shape[-1])
            if self.target is None:
                g = torch.Generator().manual_seed(2)
                self.target = torch.randint(0, logits.shape[-1], (logits.shape[0],), generator=g)
                self.target = self.target.to(logits.device)
            loss = torch.nn.functional.cross_entropy(logits.float(), self.target)
        loss.backward()
        return loss.detach()

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def timed(self, model) -> float:
        torch = self.torch
        if self.device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            self(model)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        self(model)
        return time.perf_counter() - t0

    def peak_mb(self, model) -> float:
        torch = self.torch
        if self.device == "cuda":
            self.sync()
            model.zero_grad(set_to_none=True)
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            self(model)
            self.sync()
            return (torch.cuda.max_memory_allocated() - base) / 2**20
        sys.path.insert(0, str(HERE))
        from models import _allocated_peak_mb

        model.zero_grad(set_to_none=True)
        return _allocated_peak_mb(lambda: self(model))


def _float64_step(model, step: Step) -> tuple:
    """The loss and gradients of one float64 step of a copy of ``model``."""
    exact = copy.deepcopy(model).double()
    inputs = step.inputs
    cast = (
        {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
        if isinstance(inputs, dict)
        else tuple(v.double() if v.is_floating_point() else v for v in inputs)
    )
    s64 = Step(step.device, step.mode, cast)
    s64.target = step.target
    loss = s64(exact)
    return loss, {n: p.grad for n, p in exact.named_parameters()}


def _distance(exact: tuple, loss, model) -> float:
    loss64, grads64 = exact
    errs = [_rel_err(loss, loss64)]
    errs += [_rel_err(p.grad, grads64[n]) for n, p in model.named_parameters()]
    return max(errs)


def _rel_err(got, want) -> float:
    if got is None or want is None:
        return 0.0 if got is None and want is None else float("inf")
    if got.shape != want.shape:
        return float("inf")
    if not got.numel():
        return 0.0
    return ((got.float() - want.float()).abs() / (want.float().abs() + 1.0)).max().item()


def _counts(cname: str) -> dict:
    if cname == "torch.compile":
        from torch._dynamo.utils import counters

        return {
            "graphs": int(counters["stats"]["unique_graphs"]),
            "breaks": int(sum(counters["graph_break"].values())),
        }
    import kiln
    import kiln_capture

    s = kiln.stats()
    out: dict = {k: s.get(k, 0) for k in ("graphs", "breaks", "fallbacks", "eager_frames")}
    out["break_reasons"] = kiln_capture.break_reasons()
    return out


def _compile(cname: str, model):
    import torch

    if cname == "torch.compile":
        return torch.compile(model)
    import kiln

    return kiln.compile(model)


def worker(name: str, device: str, mode: str, big: bool, rounds: int, steps: int) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        model, inputs = build(name, big)
    except ImportError as e:
        return {"model": name, "skipped": str(e)}
    model = _no_dropout(model).to(device).train()
    if isinstance(inputs, dict):
        inputs = {k: v.to(device) for k, v in inputs.items()}
    else:
        inputs = tuple(v.to(device) for v in inputs)
    step = Step(device, mode, inputs)
    params = sum(p.numel() for p in model.parameters())
    res: dict = {"model": name, "params_m": params / 1e6, "type": type(model).__name__}
    reference = model
    want_loss = step(reference)
    want = {n: p.grad for n, p in reference.named_parameters()}
    tol = 1e-3 if mode == "fp32" else 5e-2
    runs = {"eager": reference}
    exact = None  # the float64 step, made when a compiler's result needs it
    for cname in COMPILERS:
        entry: dict = {}
        candidate = copy.deepcopy(model)
        try:
            before = _counts(cname)
            compiled = _compile(cname, candidate)
            t0 = time.perf_counter()
            loss = step(compiled)
            step.sync()
            entry["compile_s"] = time.perf_counter() - t0
            errs = [_rel_err(loss, want_loss)]
            errs += [_rel_err(p.grad, want[n]) for n, p in candidate.named_parameters()]
            entry["max_rel_err"] = max(errs)
            entry["correct"] = entry["max_rel_err"] <= tol
            if not entry["correct"] and mode == "fp32":
                # an ill-conditioned step (batch norm over a few elements) differs from
                # eager by more than tol in any compiler: then it is right when it is as
                # close to a float64 step as eager is (within 2x, plus tol)
                if exact is None:
                    exact = _float64_step(model, step)
                got = _distance(exact, loss, candidate)
                ref = _distance(exact, want_loss, reference)
                entry["float64_err"], entry["eager_float64_err"] = got, ref
                entry["correct"] = got <= 2 * ref + tol
            after = _counts(cname)
            reasons, earlier = after.pop("break_reasons", {}), before.pop("break_reasons", {})
            entry.update({k: v - before.get(k, 0) for k, v in after.items()})
            if entry.get("breaks"):  # why, for the JSON (the top ten by count)
                new = {r: c - earlier.get(r, 0) for r, c in reasons.items()}
                top = sorted(((c, r) for r, c in new.items() if c > 0), reverse=True)[:10]
                entry["break_reasons"] = {r: c for c, r in top}
            runs[cname] = compiled
            progress(f"{name} {cname}: compiled in {entry['compile_s']:.1f} s, err {max(errs):.1e}")
        except Exception as e:  # a failing compiler is a row's result, not the suite's end
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            progress(f"{name} {cname}: {entry['error']}")
        res[cname] = entry
    if rounds == 0:  # compile and check only (``--rounds 0``: filling the caches)
        return res
    for m in runs.values():  # warm-up (the backward compiles on its first call)
        for _ in range(2):
            step(m)
    step.sync()
    per_round: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for r in range(rounds):
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(steps):
            for k in order[r % len(order) :] + order[: r % len(order)]:
                times[k].append(step.timed(runs[k]))
        for k, t in times.items():
            per_round[k].append(statistics.median(t))
        progress(f"{name}: round {r + 1}/{rounds}")
    for k, m in runs.items():
        entry = res.setdefault(k, {})
        entry["step_ms"] = 1e3 * statistics.median(per_round[k])
        entry["rounds_ms"] = [1e3 * t for t in per_round[k]]
        entry["peak_mb"] = step.peak_mb(m)
    return res


# -- driver --------------------------------------------------------------------------------


def _ok(e: dict) -> bool:
    return (
        bool(e.get("correct"))
        and "step_ms" in e
        and e.get("graphs", 1) > 0
        and not e.get("fallbacks")
        and not e.get("eager_frames")
    )


def _table(rows: list[dict]) -> list[str]:
    head = f"{'model':14} {'eager ms':>9} {'peak MB':>8}"
    for c in COMPILERS:
        head += f" | {c:>13} {'x eager':>8} {'spread':>11} {'peak MB':>8} {'gr/brk/fb':>9} {'s':>5}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "eager" not in r and any("compile_s" in r.get(c, {}) for c in COMPILERS):
            done = [  # --rounds 0: compiled and checked, not timed
                f"{c} compiled in {r[c]['compile_s']:.0f} s, "
                + ("correct" if r[c].get("correct") else "WRONG")
                if "compile_s" in r.get(c, {})
                else f"{c}: {r.get(c, {}).get('error', 'no result')}"
                for c in COMPILERS
            ]
            lines.append(f"{r['model']:14} {'; '.join(done)}"[:300])
            continue
        if "eager" not in r:
            lines.append(f"{r['model']:14} {r.get('skipped') or r.get('error', '?')}"[:160])
            continue
        e = r["eager"]
        line = f"{r['model']:14} {e['step_ms']:9.2f} {e['peak_mb']:8.0f}"
        for c in COMPILERS:
            x = r.get(c, {})
            if "step_ms" not in x:
                line += f" | {(x.get('error') or 'no result')[:60]:>60}"
                continue
            spread = [e["rounds_ms"][i] / t for i, t in enumerate(x["rounds_ms"])]
            counts = f"{x.get('graphs', '-')}/{x.get('breaks', '-')}/{x.get('fallbacks', '-')}"
            flag = "" if _ok(x) else " !"
            line += (
                f" | {x['step_ms']:13.2f} {e['step_ms'] / x['step_ms']:7.2f}x"
                f" {min(spread):5.2f}-{max(spread):<5.2f} {x['peak_mb']:8.0f} {counts:>9}"
                f" {x.get('compile_s', float('nan')):5.0f}{flag}"
            )
        lines.append(line)
    common = [r for r in rows if "eager" in r and all(_ok(r.get(c, {})) for c in COMPILERS)]
    lines.append("-" * len(head))
    for c in COMPILERS:
        ratios = [r["eager"]["step_ms"] / r[c]["step_ms"] for r in common]
        g = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
        lines.append(
            f"{c:14} geomean over eager {g:.3f}x over the {len(common)} models every compiler "
            f"ran correctly, compiled, without fallback ({', '.join(r['model'] for r in common)})"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast")
    ap.add_argument("--size", default="", choices=["", "small", "large"])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--compilers", default=",".join(COMPILERS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per compiler per round")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model")
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="workers run side by side (with --rounds 0: fill the kernel and artifact caches "
        "of every model at once; timed runs need 1)",
    )
    ap.add_argument("--worker", default="")
    a = ap.parse_args()
    if a.jobs > 1 and a.rounds:
        ap.error("--jobs > 1 shares the machine between timed workers: use it with --rounds 0")
    COMPILERS[:] = [c for c in a.compilers.split(",") if c]
    big = (a.size or ("large" if a.device == "cuda" else "small")) == "large"
    if a.worker:
        result(worker(a.worker, a.device, a.mode, big, a.rounds, a.steps))
        return 0
    names = [m for m in a.models.split(",") if m]

    def one(i: int, name: str) -> dict:
        print(f"[{i}/{len(names)}] {name} ({a.device}, {a.mode})", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--worker", name, "--device", a.device, "--mode", a.mode]
        cmd += ["--size", "large" if big else "small", "--compilers", ",".join(COMPILERS)]
        cmd += ["--rounds", str(a.rounds), "--steps", str(a.steps)]
        row = run_worker(cmd, timeout=a.timeout)
        row.setdefault("model", name)
        return row

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        rows = list(pool.map(one, range(1, len(names) + 1), names))
    lines = _table(rows)
    print("\n".join(lines))
    out = Path(a.out) if a.out else HERE / "results" / f"training_{a.device}_{a.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "commit": commit(),
        "device": a.device,
        "mode": a.mode,
        "size": "large" if big else "small",
    }
    meta.update(rounds=a.rounds, steps=a.steps, jobs=a.jobs)
    out.write_text(json.dumps({"meta": meta, "rows": rows, "table": lines}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
