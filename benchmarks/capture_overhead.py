"""kiln-capture vs torch.compile(backend="eager"): per-call overhead at a cache hit for a
function of 10 tensor inputs, the cost of kiln's generated guard function alone, and
capture time (first call) for real models. Both engines use a backend that runs the
captured graph as given, so the figures measure capture machinery only.

Usage: python benchmarks/capture_overhead.py [--calls N] [--no-models]
Prints a table and writes benchmarks/results/capture_overhead.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time

import torch

import kiln_capture
from kiln_capture import hook


def ten_inputs(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9):
    return a0 + a1 * a2 - a3 + a4 * a5 + a6 - a7 * a8 + a9


def _eager_backend(gm, example_inputs):
    return gm.forward


def one_expression_guard(entry):
    """The entry's guards as one ``and`` expression with a Python check per tensor (how
    kiln-capture compiled guards before hoisting reads and the native tensor check), for
    a before/after figure measured in the same run."""
    from kiln_capture import guards

    body = " and\n        ".join(g.code for g in entry.guard_set.guards) or "True"
    src = f"def __guard(__k_fn, {', '.join(entry.params)}):\n    return (\n        {body}\n    )\n"
    ns = {
        "__k_C": entry.guard_set.consts,
        "__k_G": entry.globals,
        "__k_tensor_check": guards.tensor_check,
    }
    exec(compile(src, "<one-expression guard>", "exec"), ns)
    return ns["__guard"]


def per_call_us(fn, args, calls: int, repeats: int = 5) -> float:
    for _ in range(20):
        fn(*args)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return min(samples)  # the least disturbed sample: other work shares the cores


def overhead(calls: int) -> dict:
    args = [torch.randn(8) for _ in range(10)]
    kiln_capture.reset()
    kiln_fn = kiln_capture.optimize(_eager_backend)(ten_inputs)
    torch._dynamo.reset()
    torch_fn = torch.compile(ten_inputs, backend="eager")
    eager = per_call_us(ten_inputs, args, calls)
    kiln = per_call_us(kiln_fn, args, calls)
    ref = per_call_us(torch_fn, args, calls)
    entry = hook.cache_entries(ten_inputs.__code__)[0]
    guard = per_call_us(lambda *a: entry.guard(ten_inputs, *a), args, calls)
    old = one_expression_guard(entry)
    guard_old = per_call_us(lambda *a: old(ten_inputs, *a), args, calls)
    return {
        "eager_us": eager,
        "kiln_us": kiln,
        "torch_compile_eager_us": ref,
        "kiln_overhead_us": kiln - eager,
        "torch_compile_overhead_us": ref - eager,
        "kiln_guard_us": guard,
        "kiln_guard_one_expression_us": guard_old,
        "kiln_guard_count": len(entry.guard_set.guards),
    }


def _models():
    import transformers as tf

    def gpt2():
        cfg = tf.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=128,
            n_positions=32,
            bos_token_id=0,
            eos_token_id=0,
        )
        return tf.GPT2Model(cfg), {"use_cache": False}

    def bert():
        cfg = tf.BertConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=128,
            max_position_embeddings=32,
        )
        return tf.BertModel(cfg), {}

    def llama():
        cfg = tf.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=128,
            max_position_embeddings=32,
        )
        return tf.LlamaModel(cfg), {"use_cache": False}

    models = {"gpt2": gpt2, "bert": bert, "llama": llama}
    try:
        import timm

        for name in ("resnet18", "mobilenetv3_small_100", "vit_tiny_patch16_224"):
            models[name] = lambda name=name: (timm.create_model(name, pretrained=False), None)
    except ImportError:
        pass
    return models


def capture_times() -> dict:
    try:
        models = _models()
    except ImportError:
        return {}
    out = {}
    for name, make in models.items():
        torch.manual_seed(0)
        model, kwargs = make()
        model.eval()
        if kwargs is None:  # an image model
            ids = torch.randn(1, 3, 224, 224)

            def run(ids, model=model):
                return model(ids)
        else:
            ids = torch.randint(0, 128, (2, 12))

            def run(ids, model=model, kwargs=kwargs):
                return model(input_ids=ids, **kwargs)

        with torch.no_grad():
            run(ids)  # warm caches of transformers itself
            kiln_capture.reset()
            explain = kiln_capture.explain(run)(ids)
            kiln_capture.reset()
            fn = kiln_capture.optimize(_eager_backend)(run)
            t0 = time.perf_counter()
            fn(ids)
            kiln_s = time.perf_counter() - t0
            torch._dynamo.reset()
            cfn = torch.compile(run, backend="eager")
            t0 = time.perf_counter()
            cfn(ids)
            torch_s = time.perf_counter() - t0
            entry = hook.cache_entries(run.__code__)[0]
            full = (ids, *run.__defaults__)  # the frame's argument slots, as the hook passes them
            assert entry.guard(run, *full), "the guard must pass to be timed whole"
            guard_us = per_call_us(functools.partial(entry.guard, run), full, 200, 3)
            old = one_expression_guard(entry)
            assert old(run, *full)
            guard_old_us = per_call_us(functools.partial(old, run), full, 200, 3)
            hit_kiln = per_call_us(fn, (ids,), 50, 3)
            hit_torch = per_call_us(cfn, (ids,), 50, 3)
            hit_eager = per_call_us(run, (ids,), 50, 3)
        out[name] = {
            "kiln_capture_s": kiln_s,
            "torch_compile_eager_capture_s": torch_s,
            "kiln_graphs": explain.graph_count,
            "kiln_breaks": explain.break_count,
            "kiln_guard_us": guard_us,
            "kiln_guard_one_expression_us": guard_old_us,
            "kiln_guard_count": len(entry.guard_set.guards),
            "eager_call_us": hit_eager,
            "kiln_call_us": hit_kiln,
            "torch_compile_call_us": hit_torch,
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--no-models", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: least noise)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    result = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": a.threads,
        "overhead_10_inputs": overhead(a.calls),
        "models": {} if a.no_models else capture_times(),
    }
    o = result["overhead_10_inputs"]
    print(f"Python {result['python']}, torch {result['torch']}")
    print(
        "\nPer-call time, 10 tensor inputs (8 floats each), cache hit, best of 5 x",
        a.calls,
        "calls",
    )
    print(f"{'':28s}{'kiln-capture':>14s}{'torch.compile(eager)':>22s}")
    print(f"{'eager function':28s}{o['eager_us']:>12.1f}us{o['eager_us']:>20.1f}us")
    print(f"{'captured function':28s}{o['kiln_us']:>12.1f}us{o['torch_compile_eager_us']:>20.1f}us")
    print(
        f"{'overhead vs eager':28s}{o['kiln_overhead_us']:>12.1f}us{o['torch_compile_overhead_us']:>20.1f}us"
    )
    print(
        f"{'guard function alone':28s}{o['kiln_guard_us']:>12.1f}us{'':>22s}  ({o['kiln_guard_count']} guards)"
    )
    print(
        f"{'  as one expression':28s}{o['kiln_guard_one_expression_us']:>12.1f}us"
        "  (Python tensor checks, no hoisting: the previous form)"
    )
    if result["models"]:
        print("\nReal models (tiny configs, random weights, inference): capture = first call;")
        print("kiln guards = the root entry's guard function (guard count), one expr. = the")
        print("same guards as one expression with Python tensor checks (the previous form)")
        print(
            f"{'model':22s}{'kiln capture':>14s}{'torch.compile':>15s}{'graphs/breaks':>15s}{'eager call':>12s}{'kiln call':>11s}{'torch call':>12s}{'kiln guards':>19s}{'one expr.':>11s}"
        )
        for name, m in result["models"].items():
            print(
                f"{name:22s}{m['kiln_capture_s']:>13.3f}s{m['torch_compile_eager_capture_s']:>14.3f}s"
                f"{str(m['kiln_graphs']) + '/' + str(m['kiln_breaks']):>15s}{m['eager_call_us']:>10.0f}us"
                f"{m['kiln_call_us']:>9.0f}us{m['torch_compile_call_us']:>10.0f}us"
                f"{m['kiln_guard_us']:>8.1f}us ({m['kiln_guard_count']:>3d})"
                f"{m['kiln_guard_one_expression_us']:>9.1f}us"
            )
    path = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "capture_overhead.json"
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
