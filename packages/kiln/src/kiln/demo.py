"""The main job: compile a real model on the CPU, check it against eager, print the speed-up.

    python -m kiln demo [--layers 4] [--seq 128] [--batch 2] [--runs 20]

Builds a GPT-2-style transformer from a transformers config with random weights (no
download), runs it eagerly, compiles it with `kiln.compile`, checks the compiled logits
against eager and prints compile time, eager and compiled latency and the speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

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


def median_latency(fn, runs: int) -> float:
    """Median seconds of ``runs`` calls after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    import kiln

    parser = argparse.ArgumentParser(prog="python -m kiln demo", description=__doc__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)

    print(
        f"[1/4] building GPT-2 ({args.layers} layers, width {args.width}, vocab {args.vocab}) "
        "with random weights",
        flush=True,
    )
    model = build_gpt2(args.layers, args.width, args.heads, args.vocab, max(args.seq, 128))
    torch.manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))

    def logits(m):
        with torch.no_grad():
            return m(input_ids=ids).logits

    expected = logits(model)
    print(
        f"[2/4] compiling with kiln.compile on {torch.get_num_threads()} CPU thread(s)", flush=True
    )
    compiled = kiln.compile(model)
    start = time.perf_counter()
    got = logits(compiled)
    compile_s = time.perf_counter() - start

    print("[3/4] checking against eager", flush=True)
    max_err = (got - expected).abs().max().item()
    ok = torch.allclose(got, expected, rtol=1e-4, atol=1e-4)
    print(f"      max |compiled - eager| = {max_err:.2e}")
    if not ok:
        print("      MISMATCH: compiled logits differ from eager", flush=True)
        return 1
    print("      matches eager (rtol=1e-4, atol=1e-4)")

    print(f"[4/4] timing, median of {args.runs} runs each", flush=True)
    eager_s = median_latency(lambda: logits(model), args.runs)
    kiln_s = median_latency(lambda: logits(compiled), args.runs)
    print()
    print(f"  compile time     {compile_s:8.2f} s")
    print(f"  eager latency    {eager_s * 1e3:8.2f} ms")
    print(f"  kiln latency     {kiln_s * 1e3:8.2f} ms")
    print(f"  speed-up         {eager_s / kiln_s:8.2f}x")
    stats = kiln.stats()
    print(f"  graphs compiled  {stats['graphs']:8d}   (fell back to eager: {stats['fallbacks']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
