"""A torch.profiler trace of kiln's compiled training step on the GPU, for finding where the
host holds the GPU up (gaps between kernels):

    python3 tools/gpu_step_trace.py --model resnet50 --out trace.json.gz

timm/HF models as benchmarks/training.py builds them (full size), bf16 autocast unless
--fp32; writes the chrome trace (CPU ops with Python stacks, CUDA kernels) and prints the
longest GPU gaps with the CPU ops that ran during each."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--fp32", action="store_true")
    ap.add_argument("--out", default="trace.json.gz")
    a = ap.parse_args()
    import training

    import kiln

    model, inputs = training.build(a.model, True)
    model = training._no_dropout(model).cuda().train()
    inputs = (
        {k: v.cuda() for k, v in inputs.items()}
        if isinstance(inputs, dict)
        else tuple(v.cuda() for v in inputs)
    )
    step = training.Step("cuda", "fp32" if a.fp32 else "bf16", inputs)
    compiled = kiln.compile(model)
    for _ in range(4):
        step(compiled)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, with_stack=True) as prof:
        for _ in range(2):
            step(compiled)
        torch.cuda.synchronize()
    prof.export_chrome_trace(a.out)
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    gaps = []
    for prev, nxt in zip(events, events[1:]):
        gap = nxt.time_range.start - prev.time_range.end
        if gap > 200:
            gaps.append((gap, prev.time_range.end, nxt.time_range.start, prev.name, nxt.name))
    cpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    for gap, t0, t1, before, after in sorted(gaps, reverse=True)[:8]:
        print(f"gap {gap:.0f} us after {before[:60]} before {after[:60]}")
        inside = [e for e in cpu if e.time_range.start >= t0 and e.time_range.end <= t1]
        inside.sort(key=lambda e: -(e.time_range.end - e.time_range.start))
        for e in inside[:6]:
            print(f"    {e.time_range.end - e.time_range.start:8.0f} us  {e.name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
