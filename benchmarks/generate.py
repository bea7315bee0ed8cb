"""HF ``model.generate()`` with the KV cache, compiled as users do it
(``model.forward = compiler(model.forward)``): eager, torch.compile and kiln side by side.

    python benchmarks/generate.py                                  # CPU, fp32, small configs
    python benchmarks/generate.py --device cuda --dtype bfloat16
    python benchmarks/generate.py --models gpt2 --prompts 5,9,17 --new-tokens 24

For each model (GPT-2, LLaMA, Qwen2 from small configs, cache on) and compiler: greedy
generation of ``--new-tokens`` tokens from each prompt length (batch 2); the tokens are
compared with eager's (they must be equal); graphs and graph breaks are counted over the
whole run (kiln: ``kiln.stats()``; torch.compile: dynamo's counters); the compile time is
the first round's extra time over eager's. Decode time per token is
``(t(new_tokens) - t(1)) / (new_tokens - 1)`` for the longest prompt, the median over
``--samples`` rounds after warm-up (CUDA events on the GPU), with the spread (min-max).
Results go to benchmarks/results/generate_<device>_<dtype>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from provenance import commit  # noqa: E402
from workers import progress, result, run_worker  # noqa: E402

VARIANTS = ["eager", "torch.compile", "kiln"]


def build(name: str, device: str, dtype):
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0)
    if name == "gpt2":
        cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=2048, n_positions=256)
        return _ready(GPT2LMHeadModel(cfg), device, dtype)
    families = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),  # a sliding-window cache
    }
    if name not in families:
        raise ValueError(name)
    config_cls, model_cls = families[name]
    cfg = config_cls(
        num_hidden_layers=4, hidden_size=256, intermediate_size=688, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=2048, max_position_embeddings=256,
    )  # fmt: skip
    return _ready(model_cls(cfg), device, dtype)


def _ready(model, device: str, dtype):
    model.generation_config.pad_token_id = 0
    return model.to(device=device, dtype=dtype).eval()


def _compile(variant: str, model) -> None:
    import torch

    import kiln

    if variant == "torch.compile":
        model.forward = torch.compile(model.forward)
    elif variant == "kiln":
        model.forward = kiln.compile(model.forward)


def _counts(variant: str) -> dict:
    if variant == "kiln":
        import kiln

        s = kiln.stats()
        return {"graphs": s["graphs"], "breaks": s["breaks"], "fallbacks": s["fallbacks"]}
    if variant == "torch.compile":
        from torch._dynamo.utils import counters

        return {
            "graphs": int(counters["stats"]["unique_graphs"]),
            "breaks": int(sum(counters["graph_break"].values())),
        }
    return {}


def _timer(device: str):
    import torch

    if device == "cuda":

        def run(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3, out

        return run

    def run_cpu(fn):
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out

    return run_cpu


def worker(name: str, variant: str, device: str, dtype_name: str, prompts, new_tokens, samples):
    import torch

    import kiln

    dtype = getattr(torch, dtype_name)
    model = build(name, device, dtype)
    eager_model = build(name, device, dtype)
    kiln.reset()
    if variant == "torch.compile":
        import torch._dynamo

        torch._dynamo.reset()
    _compile(variant, model)
    timer = _timer(device)
    g = torch.Generator().manual_seed(1)
    ids = {p: torch.randint(1, 2048, (2, p), generator=g).to(device) for p in prompts}

    def gen(m, p, n):
        with torch.no_grad():
            return m.generate(
                ids[p], max_new_tokens=n, min_new_tokens=n, do_sample=False,
                attention_mask=torch.ones_like(ids[p]),
            )  # fmt: skip

    out: dict = {"model": name, "variant": variant}
    t_first = 0.0
    equal = True
    for p in prompts:
        t, toks = timer(lambda p=p: gen(model, p, new_tokens))
        t_first += t
        want = gen(eager_model, p, new_tokens)
        equal = equal and torch.equal(toks, want)
        progress(f"{name} {variant}: prompt {p} first round {t:.1f} s {_counts(variant)}")
    out["first_round_s"] = t_first
    out["tokens_equal_eager"] = bool(equal)
    out.update(_counts(variant))
    longest = max(prompts)
    for _ in range(2):  # warm-up
        gen(model, longest, new_tokens)
        gen(model, longest, 1)
    progress(f"{name} {variant}: warm, timing")
    per_token = []
    for _ in range(samples):
        tn, _ = timer(lambda: gen(model, longest, new_tokens))
        t1, _ = timer(lambda: gen(model, longest, 1))
        per_token.append((tn - t1) / (new_tokens - 1) * 1e3)
    out["ms_per_token"] = statistics.median(per_token)
    out["ms_per_token_spread"] = [min(per_token), max(per_token)]
    out.update({f"after_{k}": v for k, v in _counts(variant).items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--models", default="gpt2,llama,qwen2,mistral")
    ap.add_argument("--prompts", default="5,9,17")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", help="where the JSON goes (default: benchmarks/results/)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per row")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "VARIANT"))
    a = ap.parse_args()
    prompts = [int(p) for p in a.prompts.split(",")]
    if a.worker:
        result(worker(*a.worker, a.device, a.dtype, prompts, a.new_tokens, a.samples))
        return
    res_dir = HERE / "results"
    res_dir.mkdir(exist_ok=True)
    path = Path(a.out) if a.out else res_dir / f"generate_{a.device}_{a.dtype}.json"
    meta = {"commit": commit(), "prompts": prompts, "new_tokens": a.new_tokens, "batch": 2}
    rows = []
    for m in a.models.split(","):
        base = None
        for v in a.variants.split(","):
            print(f"[generate] {m} {v} ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, __file__, "--worker", m, v, "--device", a.device,
                   "--dtype", a.dtype, "--prompts", a.prompts, "--new-tokens", str(a.new_tokens),
                   "--samples", str(a.samples)]  # fmt: skip
            r = {"model": m, "variant": v, **run_worker(cmd, a.timeout)}
            if "error" in r:
                rows.append(r)
                path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
                continue
            if v == "eager":
                base = r
            if base is not None:
                r["speedup_vs_eager"] = base["ms_per_token"] / r["ms_per_token"]
                r["compile_s"] = r["first_round_s"] - base["first_round_s"]
            rows.append(r)
            path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\n{'model':8} {'compiler':14} {'graphs':>6} {'breaks':>6} {'fallbacks':>9} "
          f"{'tokens==eager':>13} "
          f"{'ms/token':>9} {'spread':>15} {'vs eager':>8} {'compile s':>9}")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['model']:8} {r['variant']:14} ERROR {r['error']}")
            continue
        spread = "{:.2f}-{:.2f}".format(*r["ms_per_token_spread"])
        print(
            f"{r['model']:8} {r['variant']:14} {r.get('after_graphs', '-')!s:>6} "
            f"{r.get('after_breaks', '-')!s:>6} {r.get('after_fallbacks', '-')!s:>9} "
            f"{r['tokens_equal_eager']!s:>13} "
            f"{r['ms_per_token']:9.2f} {spread:>15} {r.get('speedup_vs_eager', 1):8.2f}x "
            f"{r.get('compile_s', 0):9.1f}"
        )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
