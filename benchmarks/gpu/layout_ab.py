"""Channels-last layout on/off for kiln on convolution nets, with eager and torch.compile,
in one process per run (timm models, pretrained=False, bf16 inference):

    python benchmarks/gpu/layout_ab.py [--models resnet50,efficientnet_b0] [--batch 2,32]

Each compiled variant is checked against eager; times are medians of CUDA-event batches of
10 back-to-back calls, the variants taking turns in five slices."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from triton_kernels import cuda_times_ms  # the kernel benchmark's timing


def kiln_variant(model, x, channels_last: bool):
    import kiln

    old = os.environ.get("KILN_CHANNELS_LAST")
    # "none", not "": an empty value means the default, which may be on
    os.environ["KILN_CHANNELS_LAST"] = "cuda" if channels_last else "none"
    try:
        compiled = kiln.compile(model)
        compiled(x)  # compiles with this setting
    finally:
        if old is None:
            os.environ.pop("KILN_CHANNELS_LAST", None)
        else:
            os.environ["KILN_CHANNELS_LAST"] = old
    return compiled


def main() -> None:
    import timm

    p = argparse.ArgumentParser()
    p.add_argument("--models", default="resnet50,efficientnet_b0,convnext_tiny")
    p.add_argument("--batch", default="2,32")
    a = p.parse_args()
    print(
        f"{'model':<18}{'batch':>6}{'eager ms':>10}{'tc':>8}{'kiln':>8}{'kiln CL':>9}  (speed-up over eager)"
    )
    for name in a.models.split(","):
        for batch in (int(b) for b in a.batch.split(",")):
            torch.manual_seed(0)
            model = timm.create_model(name, pretrained=False).cuda().to(torch.bfloat16).eval()
            x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                ref = model(x)
                torch._dynamo.reset()
                variants = {
                    "eager": model,
                    "tc": torch.compile(model),
                    "kiln": kiln_variant(model, x, False),
                    "kiln CL": kiln_variant(model, x, True),
                }
                for vname, f in variants.items():
                    err = (
                        f(x).float() - ref.float()
                    ).abs().max().item() / ref.float().abs().max().item()
                    assert err < 5e-2, f"{name} {vname}: relative error {err}"
                    for _ in range(3):
                        f(x)
                samples = {k: [] for k in variants}
                for _ in range(5):
                    for k, f in variants.items():
                        samples[k] += cuda_times_ms(lambda f=f, x=x: f(x), iters=4)
                med = {k: statistics.median(v) for k, v in samples.items()}
            e = med["eager"]
            print(
                f"{name:<18}{batch:>6}{e:>10.3f}{e / med['tc']:>7.2f}x{e / med['kiln']:>7.2f}x"
                f"{e / med['kiln CL']:>8.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
