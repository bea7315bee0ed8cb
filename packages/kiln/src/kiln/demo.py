"""The main job: compile a real model on the CPU, check it against eager, print the speed-up.

    python -m kiln demo [--layers 4] [--width 256] [--seq 64] [--batch 1] [--runs 30]

Builds a GPT-2-style transformer from a transformers config with random weights (no
download), runs it eagerly, compiles it with `kiln.compile`, checks the compiled logits
against eager and prints compile time, eager and compiled latency and the speed-up.

# Why this configuration

GPT-2 spends its time in two kinds of work: the matrix multiplies (the same ATen/oneDNN
GEMMs for eager and for kiln, which calls them as extern kernels) and everything between
them (layer norms, GELU, attention masking and softmax, residual adds, reshapes), which
eager runs as one ATen kernel per op and kiln fuses into a few generated loops. At width
256 a batch of 2 x 128 tokens is about three quarters GEMM (the LM head over the vocabulary
alone is a third), so any compiler's gain there is small. The default, one request of 64
tokens, is a single-request inference shape where eager's per-op costs weigh more and the
compiler's work shows (on 2 quiet cores: kiln ~1.2x at 1 x 64, ~1.1x at 2 x 128). Longer
sequences do not help: eager runs attention as one flash-attention kernel, kiln as two
batched GEMMs around a fused softmax. Every flag changes the shape, and the printed header
states the one used.

# Timing

Eager and compiled calls are timed in alternating rounds, so that load from other
processes on a shared machine slows both alike. The speed-up is that of the best round of
each (``timeit``'s estimator: on a shared machine the fastest round is the one least
disturbed by others, and the most repeatable); the medians are printed beside it. kiln's
per-call overhead (the capture guards, the AOT runtime and the facade: everything outside
the generated host function) is measured by timing the compiled graph's own callable
inside the compiled call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch


def build_gpt2(layers: int, width: int, heads: int, vocab: int, positions: int) -> torch.nn.Module:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        sys.exit("the demo builds GPT-2 from transformers: pip install 'kiln[demo]'")
    config = GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        vocab_size=vocab,
        n_positions=positions,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def interleaved_times(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, list[float]]:
    """Seconds of each call of each function, after two warm-up calls each, timed in
    alternating rounds."""
    for fn in fns.values():
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


class TimedBackend:
    """kiln's default backend, with the compiled graphs' own run time accumulated."""

    def __init__(self) -> None:
        from kiln import backends
        from kiln.config import resolve_options

        self.inner = backends.lookup("inductor", resolve_options(None, None))[1]
        self.seconds = 0.0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        compiled = self.inner(gm, example_inputs)
        timed = self._timed(compiled)
        fast = getattr(compiled, "kiln_guarded_call", None)
        if fast is not None:  # the call capture makes when its guards cover the inputs
            timed.kiln_guarded_call = self._timed(fast)
        return timed

    def _timed(self, fn: Callable) -> Callable:
        def timed(*args):
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def per_call_overhead(model: torch.nn.Module, call: Callable, runs: int) -> tuple[float, float]:
    """(seconds per compiled call, of which outside the compiled graphs), median of rounds."""
    import kiln

    backend = TimedBackend()
    compiled = kiln.compile(model, backend=backend)
    call(compiled)  # compiles (kernels come from the disk cache by now)
    total, outside = [], []
    for _ in range(runs):
        backend.seconds = 0.0
        start = time.perf_counter()
        call(compiled)
        elapsed = time.perf_counter() - start
        total.append(elapsed)
        outside.append(elapsed - backend.seconds)
    return statistics.median(total), statistics.median(outside)


def main(argv: list[str] | None = None) -> int:
    import kiln

    parser = argparse.ArgumentParser(prog="python -m kiln demo", description=__doc__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)

    shape = (
        f"GPT-2 ({args.layers} layers, width {args.width}, {args.heads} heads, "
        f"vocab {args.vocab}), batch {args.batch} x {args.seq} tokens, float32 inference"
    )
    print(f"[1/5] building {shape}, random weights", flush=True)
    model = build_gpt2(args.layers, args.width, args.heads, args.vocab, max(args.seq, 128))
    torch.manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))

    def logits(m):
        with torch.no_grad():
            return m(input_ids=ids).logits

    expected = logits(model)
    print(
        f"[2/5] compiling with kiln.compile on {torch.get_num_threads()} CPU thread(s)", flush=True
    )
    compiled = kiln.compile(model)
    start = time.perf_counter()
    got = logits(compiled)
    compile_s = time.perf_counter() - start

    print("[3/5] checking against eager", flush=True)
    max_err = (got - expected).abs().max().item()
    ok = torch.allclose(got, expected, rtol=1e-4, atol=1e-4)
    print(f"      max |compiled - eager| = {max_err:.2e}")
    if not ok:
        print("      MISMATCH: compiled logits differ from eager", flush=True)
        return 1
    print("      matches eager (rtol=1e-4, atol=1e-4)")

    print(f"[4/5] timing eager and kiln, {args.runs} alternating rounds", flush=True)
    times = interleaved_times(
        {"eager": lambda: logits(model), "kiln": lambda: logits(compiled)}, args.runs
    )
    best = {name: min(t) for name, t in times.items()}
    median = {name: statistics.median(t) for name, t in times.items()}
    stats = kiln.stats()
    print("[5/5] measuring kiln's per-call overhead (guards, AOT runtime, facade)", flush=True)
    call_s, outside_s = per_call_overhead(model, logits, max(5, args.runs // 3))
    print()
    print(f"  model            {shape}")
    print(f"  compile time     {compile_s:8.2f} s")
    print("                   best of rounds   (median)")
    for name in ("eager", "kiln"):
        print(
            f"  {name + ' latency':<16} {best[name] * 1e3:8.2f} ms   ({median[name] * 1e3:8.2f} ms)"
        )
    print(
        f"  speed-up         {best['eager'] / best['kiln']:8.2f}x      "
        f"({median['eager'] / median['kiln']:8.2f}x)"
    )
    print(
        f"  kiln overhead    {outside_s * 1e3:8.3f} ms per call outside the compiled graph "
        f"({100 * outside_s / call_s:.1f}% of the call)"
    )
    print(f"  graphs compiled  {stats['graphs']:8d}   (fell back to eager: {stats['fallbacks']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
