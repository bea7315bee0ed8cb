"""bf16 autocast training under kiln, small configs, one process per model: graphs, breaks
with their reasons, and the first step's loss and gradients against eager (or the error
with its traceback). For the device tool:

    run(command="cd _devsnap && source benchmarks/gpu/setup.sh && python3 benchmarks/gpu/bf16_diag.py")

Prints one block per model; ``--size large`` for the full configs.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))


def one(name: str, device: str, big: bool) -> None:
    import torch
    import training

    import kiln

    torch.manual_seed(0)
    model, inputs = training.build(name, big)
    model = training._no_dropout(model).to(device).train()
    if isinstance(inputs, dict):
        inputs = {k: v.to(device) for k, v in inputs.items()}
    else:
        inputs = tuple(v.to(device) for v in inputs)
    step = training.Step(device, "bf16", inputs)
    want_loss = step(model)
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    candidate = copy.deepcopy(model)
    try:
        with torch.autocast(device, dtype=torch.bfloat16):
            report = (
                kiln.explain(candidate)(**inputs)
                if isinstance(inputs, dict)
                else kiln.explain(candidate)(*inputs)
            )
        print(f"{name}: explain graphs {report.graph_count} breaks {report.break_count}")
        for b in report.break_reasons[:12]:
            print(f"   break {b.kind.id} {b.detail[:300]} @ {b.filename}:{b.lineno}")
        kiln.reset() if hasattr(kiln, "reset") else None
        compiled = kiln.compile(copy.deepcopy(model))
        loss = step(compiled)
        got = {n: p.grad for n, p in compiled.named_parameters() if p.grad is not None}
        err = max(training._rel_err(g, want[n]) for n, g in got.items())
        s = kiln.stats()
        print(
            f"{name}: step loss {loss.item():.5f} eager {want_loss.item():.5f} grad err "
            f"{err:.2e} ({len(got)}/{len(want)} grads) stats "
            f"{ {k: s.get(k) for k in ('graphs', 'breaks', 'fallbacks', 'eager_frames')} }"
        )
        for r in (s.get("fallback_reasons") or [])[:8]:
            print("   fallback", str(r)[:300])
    except Exception as e:  # the error and where, for the log
        print(f"{name}: ERROR {type(e).__name__}: {str(e)[:3000]}")
        print("".join(traceback.format_exc().splitlines(True)[-40:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=training_models())
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="small", choices=["small", "large"])
    ap.add_argument("--one", default=None)
    a = ap.parse_args()
    if a.one:
        one(a.one, a.device, a.size == "large")
        return
    for name in a.models.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--device", a.device, "--size", a.size]
        try:
            subprocess.run(cmd, timeout=240, check=False)
        except subprocess.TimeoutExpired:
            print(f"{name}: timed out")


def training_models() -> str:
    import training

    return training.MODELS


if __name__ == "__main__":
    main()
