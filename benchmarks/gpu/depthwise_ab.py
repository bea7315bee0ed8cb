"""Depthwise 7x7 convolutions on CUDA, NCHW against channels-last operands, fp32 and bf16:
the forward, the input gradient and the weight gradient (aten.convolution_backward) at
timm ConvNeXt-T's four stages, batch 64. Device ms (CUDA events, median of 20 after 5
warm-up calls). The numbers behind kiln-inductor's depthwise_layout rule on CUDA.

    python3 benchmarks/gpu/depthwise_ab.py [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

aten = torch.ops.aten


def _ms(fn, reps: int = 20) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    rows = []
    print(
        f"{'dtype':8} {'C':>4} {'HxW':>6} | {'fwd NCHW':>9} {'NHWC':>7} | {'bwd NCHW':>9} {'NHWC':>7}"
    )
    for dtype in (torch.float32, torch.bfloat16):
        for c, h in ((96, 56), (192, 28), (384, 14), (768, 7)):
            x = torch.randn(a.batch, c, h, h, device="cuda", dtype=dtype)
            w = torch.randn(c, 1, 7, 7, device="cuda", dtype=dtype)
            g = torch.randn(a.batch, c, h, h, device="cuda", dtype=dtype)
            row = {"dtype": str(dtype), "C": c, "H": h}
            for name, fmt in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
                xi, gi = x.contiguous(memory_format=fmt), g.contiguous(memory_format=fmt)
                args = ([1, 1], [3, 3], [1, 1], False, [0, 0], c)
                fwd = (aten.convolution, (xi, w, None, *args))
                bwd = (aten.convolution_backward, (gi, xi, w, [c], *args, [True, True, False]))
                for kind, (op, op_args) in (("fwd", fwd), ("bwd", bwd)):
                    row[f"{kind}_{name}"] = _ms(lambda op=op, op_args=op_args: op(*op_args))
            rows.append(row)
            print(f"{str(dtype)[6:]:8} {c:4} {h:3}x{h:<2} | {row['fwd_nchw']:9.3f} "
                  f"{row['fwd_nhwc']:7.3f} | {row['bwd_nchw']:9.3f} {row['bwd_nhwc']:7.3f}")  # fmt: skip
    print(json.dumps(rows), flush=True)


if __name__ == "__main__":
    main()
