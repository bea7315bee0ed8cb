"""Graphs, graph breaks and eager frames per model: kiln and torch.compile side by side.

    python benchmarks/breaks.py                          # every HF family, CPU, capture only
    python benchmarks/breaks.py --models gpt2,t5 --backend inductor

For each model of the HF suite (transformers' main families built from their *default*
configs, made narrow and shallow so that a 2-core CPU gets through: the cache stays on
where the model has one) and each compiler, in a fresh worker process: one forward call
with ``model.forward`` compiled as users do it, then, for models that generate (decoders,
encoder-decoders), one greedy ``generate()`` call of 4 new tokens. Outputs are compared
with an eager copy of the model. Counted after each stage: graphs, graph breaks, frames the
compiler chose to run eagerly (kiln: ``eager_frames``, torch.compile: none of its own) and
backend fallbacks (kiln: graphs its backend could not compile). The default backend is
``eager`` for both compilers (breaks do not depend on the backend, and compiling kernels
for every row takes hours on 2 cores); ``--backend inductor`` measures the real thing.
kiln's break reasons are collected from its ``breaks`` log (reason id, detail, user line);
torch.compile's from dynamo's counters. timm rows are skipped where timm is missing.

Every row where kiln has more breaks (or graphs) than torch.compile is flagged. Results go
to benchmarks/results/breaks_<backend>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from provenance import commit  # noqa: E402
from workers import progress, result, run_worker  # noqa: E402

COMPILERS = ["torch.compile", "kiln"]
NEW_TOKENS = 4
# small widths for every family; everything else is the family's default config
_SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=1024)
_HEADS = dict(num_attention_heads=4, num_key_value_heads=2)
_GEN = dict(pad_token_id=0)


def _decoder(config_name: str, model_name: str, **extra):
    def build():
        import transformers

        cfg = getattr(transformers, config_name)(**_SMALL, **_HEADS, **extra)
        return getattr(transformers, model_name)(cfg), "ids"

    return build


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1024, bos_token_id=1, eos_token_id=2)
    ), "ids"


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(num_layers=2, d_model=64, d_kv=16, d_ff=128, num_heads=4, vocab_size=1024)
    cfg.decoder_start_token_id = 0
    return T5ForConditionalGeneration(cfg), "seq2seq"


def _bart():
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(
        encoder_layers=2, decoder_layers=2, d_model=64, encoder_ffn_dim=128,
        decoder_ffn_dim=128, encoder_attention_heads=4, decoder_attention_heads=4,
        vocab_size=1024,
    )  # fmt: skip
    return BartForConditionalGeneration(cfg), "seq2seq"


def _whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(
        encoder_layers=2, decoder_layers=2, d_model=64, encoder_ffn_dim=128,
        decoder_ffn_dim=128, encoder_attention_heads=4, decoder_attention_heads=4,
        vocab_size=1024, num_mel_bins=80, max_source_positions=32, max_target_positions=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
        suppress_tokens=[], begin_suppress_tokens=[],
    )  # fmt: skip
    return WhisperForConditionalGeneration(cfg), "audio"


def _bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(**_SMALL, num_attention_heads=4)), "ids-nogen"


def _vit():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(**_SMALL, num_attention_heads=4, image_size=32, patch_size=8)
    return ViTModel(cfg), "image"


def _timm(name: str):
    def build():
        import timm  # not on the CPU machine (its torch has no matching torchvision)

        return timm.create_model(name, pretrained=False), "image224"

    return build


MODELS = {
    "gpt2": _gpt2,
    "llama": _decoder("LlamaConfig", "LlamaForCausalLM"),
    "mistral": _decoder("MistralConfig", "MistralForCausalLM"),
    "qwen2": _decoder("Qwen2Config", "Qwen2ForCausalLM"),
    "gemma": _decoder("GemmaConfig", "GemmaForCausalLM", head_dim=16),
    "phi": _decoder("PhiConfig", "PhiForCausalLM"),
    "t5": _t5,
    "bart": _bart,
    "whisper": _whisper,
    "bert": _bert,
    "vit": _vit,
    "timm_resnet50": _timm("resnet50"),
    "timm_vit_small": _timm("vit_small_patch16_224"),
    "timm_regnety_016": _timm("regnety_016"),
    "timm_convnext_tiny": _timm("convnext_tiny"),
    "timm_efficientnet_b0": _timm("efficientnet_b0"),
    "timm_mobilenetv3": _timm("mobilenetv3_large_100"),
    "timm_swin_tiny": _timm("swin_tiny_patch4_window7_224"),
    "timm_deit_small": _timm("deit_small_patch16_224"),
}


def _inputs(kind: str):
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 1024, (2, 12), generator=g)
    if kind in ("ids", "ids-nogen"):
        return {"input_ids": ids}
    if kind == "seq2seq":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
    if kind == "audio":
        return {
            "input_features": torch.randn(2, 80, 64, generator=g),
            "decoder_input_ids": ids[:, :5],
        }
    if kind == "image":
        return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g)}
    return {"x": torch.randn(2, 3, 224, 224, generator=g)}  # timm's forward(x)


class _BreakLog(logging.Handler):
    """kiln's ``breaks`` log records: one per break and per frame run eagerly."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if getattr(record, "topic", None) == "breaks" or msg.startswith("[breaks]"):
            self.lines.append(msg.removeprefix("[breaks] "))


def _counts(compiler: str) -> dict:
    if compiler == "kiln":
        import kiln

        s = kiln.stats()
        return {
            "graphs": s["graphs"],
            "breaks": s["breaks"],
            "eager_frames": s["eager_frames"],
            "fallbacks": s["fallbacks"],
        }
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "breaks": int(sum(counters["graph_break"].values())),
        "eager_frames": 0,
        "fallbacks": 0,
    }


def _reasons(compiler: str, handler: _BreakLog) -> dict[str, int]:
    out: dict[str, int] = {}
    if compiler == "kiln":
        for line in handler.lines:
            # "[B005] detail\n  at file:line   code\n ..." -> reason and user line
            parts = line.split("\n")
            key = parts[0][:160] + (" @ " + parts[1].strip()[:160] if len(parts) > 1 else "")
            out[key] = out.get(key, 0) + 1
        return out
    from torch._dynamo.utils import counters

    return {k[:200]: int(v) for k, v in counters["graph_break"].items()}


def _equal(a, b) -> bool:
    import torch

    la, lb = _leaves(a), _leaves(b)
    return len(la) == len(lb) and all(
        torch.allclose(x, y, rtol=1e-4, atol=1e-4) if x.is_floating_point() else torch.equal(x, y)
        for x, y in zip(la, lb)
    )


def _leaves(x) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if hasattr(x, "to_tuple"):
        x = x.to_tuple()
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, list | tuple):
        return [t for i in x for t in _leaves(i)]
    layers = getattr(x, "layers", None)  # a transformers Cache
    if layers is not None:
        return [t for layer in layers for t in _leaves([layer.keys, layer.values])]
    return []


def worker(name: str, compiler: str, backend: str) -> dict:
    import copy

    import torch

    import kiln

    try:
        torch.manual_seed(0)
        model, kind = MODELS[name]()
    except ImportError as e:
        return {"skipped": f"{e}"}
    model.eval()
    if hasattr(model, "generation_config") and model.generation_config is not None:
        model.generation_config.pad_token_id = 0
    eager = copy.deepcopy(model)
    handler = _BreakLog()
    logging.getLogger("kiln_capture").addHandler(handler)
    logging.getLogger("kiln_capture").setLevel(logging.DEBUG)
    kiln.reset()
    if compiler == "torch.compile":
        import torch._dynamo

        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend=backend)
    else:
        model.forward = kiln.compile(model.forward, backend=backend)
    inputs = _inputs(kind)
    out: dict = {"use_cache": getattr(getattr(model, "config", None), "use_cache", None)}
    t0 = time.perf_counter()
    with torch.no_grad():
        try:
            got = model(**inputs)
            want = eager(**inputs)
            out["forward_equal"] = _equal(got, want)
        except Exception as e:
            out["forward_error"] = f"{type(e).__name__}: {e}"[:300]
    out["forward"] = _counts(compiler)
    out["forward_s"] = time.perf_counter() - t0
    progress(f"{name} {compiler}: forward {out['forward']} in {out['forward_s']:.1f} s")
    if kind in ("ids", "seq2seq", "audio"):
        t0 = time.perf_counter()
        gen_inputs = {k: v for k, v in inputs.items() if k != "decoder_input_ids"}
        kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        with torch.no_grad():
            try:
                got = model.generate(**gen_inputs, **kw)
                want = eager.generate(**gen_inputs, **kw)
                out["generate_equal"] = bool(torch.equal(got, want))
            except Exception as e:
                out["generate_error"] = f"{type(e).__name__}: {e}"[:300]
        total = _counts(compiler)
        out["generate"] = {k: total[k] - out["forward"][k] for k in total}
        out["generate_s"] = time.perf_counter() - t0
        progress(f"{name} {compiler}: generate {out['generate']} in {out['generate_s']:.1f} s")
    out["reasons"] = _reasons(compiler, handler)
    return out


def _table(rows: list[dict]) -> list[str]:
    lines = [
        f"{'model':14} {'stage':9} {'tc graphs':>9} {'tc breaks':>9} {'kiln graphs':>11} "
        f"{'kiln breaks':>11} {'kiln eager':>10} {'fallbacks':>9} {'==eager':>7}  flag"
    ]
    by_model: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["compiler"]] = r
    for name, pair in by_model.items():
        skipped = next((r["skipped"] for r in pair.values() if "skipped" in r), None)
        if skipped:
            lines.append(f"{name:14} skipped: {skipped}")
            continue
        tc, kl = pair.get("torch.compile", {}), pair.get("kiln", {})
        for stage in ("forward", "generate"):
            a, b = tc.get(stage), kl.get(stage)
            if a is None and b is None:
                continue
            a, b = a or {}, b or {}
            eq = kl.get(f"{stage}_equal")
            err = kl.get(f"{stage}_error") or kl.get("error")
            flag = ""
            if b.get("breaks", 0) > a.get("breaks", 0):
                flag = "MORE BREAKS"
            elif b.get("graphs", 0) > a.get("graphs", 0):
                flag = "more graphs"
            if err:
                flag += f" ERROR {err[:60]}"
            lines.append(
                f"{name:14} {stage:9} {a.get('graphs', '-')!s:>9} {a.get('breaks', '-')!s:>9} "
                f"{b.get('graphs', '-')!s:>11} {b.get('breaks', '-')!s:>11} "
                f"{b.get('eager_frames', '-')!s:>10} {b.get('fallbacks', '-')!s:>9} "
                f"{eq!s:>7}  {flag}"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--compilers", default=",".join(COMPILERS))
    ap.add_argument("--backend", default="eager", help="eager (capture only) or inductor")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per row")
    ap.add_argument("--out", help="where the JSON goes (default: benchmarks/results/)")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "COMPILER"))
    a = ap.parse_args()
    if a.worker:
        result(worker(*a.worker, a.backend))
        return
    res_dir = HERE / "results"
    res_dir.mkdir(exist_ok=True)
    path = Path(a.out) if a.out else res_dir / f"breaks_{a.backend}.json"
    meta = {"commit": commit(), "backend": a.backend, "new_tokens": NEW_TOKENS, "batch": 2}
    rows = []
    for m in a.models.split(","):
        for c in a.compilers.split(","):
            print(f"[breaks] {m} {c} ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, __file__, "--worker", m, c, "--backend", a.backend]
            rows.append({"model": m, "compiler": c, **run_worker(cmd, a.timeout)})
            path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
            if "skipped" in rows[-1]:
                break
    print("\n".join(_table(rows)))
    print("\nkiln break reasons (count, reason @ user line):")
    counts: dict[str, int] = {}
    for r in rows:
        if r["compiler"] == "kiln":
            for k, v in r.get("reasons", {}).items():
                counts[k] = counts.get(k, 0) + v
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:40]:
        print(f"  {v:4d}  {k}")
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
