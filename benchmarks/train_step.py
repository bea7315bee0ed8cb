"""A whole training step (zero_grad, forward, backward, optimizer step) on the CPU, side by
side in one run: eager, torch.compile of the whole step, kiln with only the model compiled,
kiln with the whole step compiled (the optimizer captured as a graph: kiln-capture's
variables/optimizers.py). Median and spread (min-max) of the per-step time over >= 3 runs;
per row the parameters of every variant after the same four steps against eager's (max
absolute difference) and kiln's graphs, breaks, fallbacks and eager frames; a table is
printed and JSON written to benchmarks/results/train_step.json.

    python benchmarks/train_step.py [--runs 3] [--steps 20] [--models mlp,gpt2,bert]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import kiln

OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
}


def _mlp():
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
        torch.nn.GELU(), torch.nn.Linear(1024, 10),
    )  # fmt: skip
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    return m, (x, y), lambda model, x, y: torch.nn.functional.cross_entropy(model(x), y)


def _hf(name: str):
    import transformers as T

    if name == "gpt2":
        cfg = T.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=128,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
        model = T.GPT2LMHeadModel(cfg)
    else:
        cfg = T.BertConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                           num_attention_heads=4, vocab_size=512, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)  # fmt: skip
        model = T.BertForMaskedLM(cfg)
    ids = torch.randint(1, 512, (4, 64))
    return model, (ids,), lambda model, ids: model(ids, labels=ids).loss


def _step(model, opt, loss_fn):
    def step(*batch):
        opt.zero_grad()
        loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
        return loss

    return step


def _variant(kind: str, make, opt_name: str):
    torch.manual_seed(0)
    model, batch, loss_fn = make()
    opt = OPTIMIZERS[opt_name](model.parameters())
    if kind == "eager":
        return _step(model, opt, loss_fn), batch, model
    if kind == "torch.compile (step)":
        return torch.compile(_step(model, opt, loss_fn)), batch, model
    if kind == "kiln (model)":
        return _step(kiln.compile(model), opt, loss_fn), batch, model
    return kiln.compile(_step(model, opt, loss_fn)), batch, model


KINDS = ["eager", "torch.compile (step)", "kiln (model)", "kiln (step)"]


def _time(fn, batch, steps: int) -> float:
    for _ in range(3):  # compile, then the steady state (state made at step 1)
        fn(*batch)
    start = time.perf_counter()
    for _ in range(steps):
        fn(*batch)
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--models", default="mlp,gpt2,bert")
    ap.add_argument("--optimizers", default="adamw,sgd")
    args = ap.parse_args()
    makers = {"mlp": _mlp, "gpt2": lambda: _hf("gpt2"), "bert": lambda: _hf("bert")}
    rows = []
    for name in args.models.split(","):
        for opt_name in args.optimizers.split(","):
            times: dict[str, list[float]] = {k: [] for k in KINDS}
            fns = {}
            row = {"model": name, "optimizer": opt_name}
            params = {}
            for kind in KINDS:
                kiln.reset() if kind.startswith("kiln") else None
                fn, batch, model = _variant(kind, makers[name], opt_name)
                fns[kind] = (fn, batch)
                _time(fn, batch, 1)  # four steps from the same seed and batch for every kind
                params[kind] = [p.detach().clone() for p in model.parameters()]
                if kind.startswith("kiln"):
                    st = kiln.stats()
                    row[f"{kind} counts"] = {
                        k: st.get(k, 0) for k in ("graphs", "breaks", "fallbacks", "eager_frames")
                    }
            for kind in KINDS[1:]:  # parameters after four steps against eager's
                row[f"{kind} max_param_diff"] = max(
                    (a - b).abs().max().item() for a, b in zip(params[kind], params["eager"])
                )
            for _ in range(args.runs):  # interleaved runs
                for kind in KINDS:
                    times[kind].append(_time(*fns[kind], args.steps))
            for kind in KINDS:
                row[kind] = {
                    "median_ms": statistics.median(times[kind]),
                    "min_ms": min(times[kind]),
                    "max_ms": max(times[kind]),
                }
            rows.append(row)
            cells = [
                f"{row[k]['median_ms']:.2f} ({row[k]['min_ms']:.2f}-{row[k]['max_ms']:.2f})"
                for k in KINDS
            ]
            print(f"| {name} | {opt_name} | " + " | ".join(cells) + " |", flush=True)
            for kind in KINDS[1:]:
                counts = row.get(f"{kind} counts", "")
                print(f"    {kind}: params after 4 steps differ from eager's by at most "
                      f"{row[f'{kind} max_param_diff']:.1e} {counts}", flush=True)  # fmt: skip
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    out = os.path.join(os.path.dirname(__file__), "results", "train_step.json")
    meta = {"threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}
    with open(out, "w") as f:
        json.dump(meta, f, indent=1)
    print("| model | optimizer | " + " | ".join(KINDS) + " |  (ms per step, median (min-max))")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
