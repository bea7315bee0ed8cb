"""DDP training step on CPU processes over gloo: eager, torch.compile and kiln side by side.

    python benchmarks/distributed.py [--world 2] [--model mlp|gpt2] [--steps 12] [--wrap ddp|fsdp]

Each rank trains the same model wrapped in ``DistributedDataParallel`` (buckets of
``--bucket-mb``) with SGD, once per compiler, in one process per rank:

- ``eager``: DDP as it is;
- ``torch.compile``: ``torch.compile(ddp_model)`` (torch's DDPOptimizer splits its graph);
- ``kiln``: ``kiln.compile(ddp_model)`` (one graph piece per gradient bucket,
  kiln/distributed.py);
- ``kiln one graph``: the same with the split turned off (``bucket_bytes_cap`` raised for
  the compile only), the reference for the overlap column.

Per compiler: the median step time (forward, backward, optimizer) over ``--steps`` steps
after warm-up, with the spread (min-max), and a trace of each bucket's all-reduce (a
communication hook that records when DDP launched it and when it completed, then
all-reduces as DDP's default hook does). From the trace, median over the steps:

- ``first bucket at``: how far into ``loss.backward()`` (0 = its start, 1 = its end) the
  first all-reduce started;
- ``comm under bwd``, from ``--trace-steps`` more steps run under ``torch.profiler``
  (after the timed ones, so the profiler costs them nothing): the share of the time some
  all-reduce was in flight (the union of each bucket's [launch, completion]) during which
  autograd was evaluating a backward node that computes gradients (the profiler's
  ``autograd::engine::evaluate_function`` events, ``AccumulateGrad`` excluded: DDP's hooks
  and bucket copies run inside those); median over the traced steps;
- ``overlaps bwd``: ``yes`` where ``comm under bwd`` is at least 10%, else ``no``.

Graphs, breaks and fallbacks are recorded per row (kiln's from ``kiln.stats()``,
torch.compile's graphs and breaks from its counters, eager's are 0); parameters after
the steps are compared with eager's on every rank. Rank 0 prints the table and writes
benchmarks/results/distributed_cpu_<model>.json.

``--wrap fsdp``: FSDP2 instead, ``fully_shard`` on every ``Linear`` (every GPT-2 block for
``gpt2``) and at the root, rows ``eager``, ``torch.compile`` (of the root), ``kiln``
(``kiln.compile`` of the root: one graph with FSDP's all-gathers and reduce-scatters in
it, kiln/fsdp_graph.py) and ``kiln regions`` (``options={"fsdp_graph": False}``: each
unit's forward a region between FSDP's eager hooks, kiln/fsdp.py); the table has
``peak MB`` (what torch's CPU allocator had out at most during one more step, above its
start, rank 0; the second of two profiled steps, as a compiler may compile again for the
profiler) and ``region boundaries`` instead of the bucket columns, and writes
benchmarks/results/distributed_cpu_fsdp_<model>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMPILERS = ("eager", "torch.compile", "kiln", "kiln one graph")
FSDP_COMPILERS = ("eager", "torch.compile", "kiln", "kiln regions")


def _model(name: str):
    import torch

    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            n_layer=4, n_embd=256, n_head=4, vocab_size=2048, n_positions=128,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
        )  # fmt: skip
        return GPT2LMHeadModel(cfg)
    layers = [m for _ in range(8) for m in (torch.nn.Linear(512, 512), torch.nn.GELU())]
    return torch.nn.Sequential(*layers, torch.nn.Linear(512, 16))


def _batch(name: str, g):
    import torch

    if name == "gpt2":
        ids = torch.randint(0, 2048, (4, 64), generator=g)
        return (ids,), ids
    return (torch.randn(64, 512, generator=g),), torch.randn(64, 16, generator=g)


def _loss(name: str, out, target):
    import torch.nn.functional as F

    if name == "gpt2":
        return F.cross_entropy(out.logits[:, :-1].reshape(-1, 2048), target[:, 1:].reshape(-1))
    return ((out - target) ** 2).mean()


def _recording_hook(launches: list, done: list):
    """DDP's default all-reduce (the bucket averaged over ranks), recording when each
    bucket's all-reduce was launched and when it completed (``perf_counter``)."""
    import torch.distributed as dist

    def hook(state, bucket):
        launches.append(time.perf_counter())
        work = dist.all_reduce(bucket.buffer() / dist.get_world_size(), async_op=True)

        def finished(fut):
            done.append(time.perf_counter())
            return fut.value()[0]

        return work.get_future().then(finished)

    return hook


def _merged(spans: list) -> list:
    out: list = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _under_share(comm: list, compute: list) -> float | None:
    """Share of the union of ``comm`` spans that lies inside the union of ``compute``."""
    comm, compute = _merged(comm), _merged(compute)
    whole = sum(b - a for a, b in comm)
    if whole <= 0:
        return None
    inside = 0.0
    for a, b in comm:
        for c, d in compute:
            inside += max(0.0, min(b, d) - max(a, c))
    return inside / whole


def _traced_step(args, fn, opt, batch, launches: list, done: list) -> float | None:
    """One step under torch.profiler: ``comm under bwd`` (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    inputs, target = batch
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = _loss(args.model, fn(*inputs), target)
        del launches[:], done[:]
        mark = time.perf_counter()
        with record_function("distributed_bench_mark"):  # ties the profiler's clock to ours
            pass
        loss.backward()
    opt.step()
    opt.zero_grad()
    events = prof.events()
    start = next(e for e in events if e.name == "distributed_bench_mark").time_range.start
    offset = mark - start / 1e6
    compute = [
        (offset + e.time_range.start / 1e6, offset + e.time_range.end / 1e6)
        for e in events
        if e.name.startswith("autograd::engine::evaluate_function:")
        and "AccumulateGrad" not in e.name
    ]
    if len(done) != len(launches):
        return None
    return _under_share(list(zip(launches, done)), compute)


def _torch_compile_counts() -> dict:
    """Graphs and breaks of torch.compile since its last reset (its own counters)."""
    from torch._dynamo.utils import counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
        "fallbacks": None,  # torch.compile raises on a compiler error instead
    }


def _counts(compiler: str) -> dict:
    import kiln

    if compiler.startswith("kiln"):
        stats = kiln.stats()
        return {k: stats[k] for k in ("graphs", "breaks", "fallbacks", "region_boundaries")}
    if compiler == "torch.compile":
        return _torch_compile_counts()
    return {"graphs": 0, "breaks": 0, "fallbacks": 0}


def _fsdp_model(name: str, world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = _model(name)
    units = model.transformer.h if name == "gpt2" else model
    for m in units:
        if name == "gpt2" or isinstance(m, __import__("torch").nn.Linear):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def fsdp_rows(rank: int, world: int, args) -> list:
    """One row per compiler of FSDP_COMPILERS: step times, counts, parameters vs eager."""
    import torch

    import kiln

    rows, final = [], {}
    for compiler in FSDP_COMPILERS:
        kiln.reset()
        model = _fsdp_model(args.model, world)
        if compiler == "torch.compile":
            import torch._dynamo
            from torch._dynamo.utils import counters

            torch._dynamo.reset()
            counters.clear()
            fn = torch.compile(model)
        elif compiler.startswith("kiln"):
            fn = kiln.compile(model, options={"fsdp_graph": compiler == "kiln"})
        else:
            fn = model
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1000 + rank)
        times = []
        for step in range(args.warmup + args.steps):
            inputs, target = _batch(args.model, g)
            torch.distributed.barrier()
            t0 = time.perf_counter()
            _loss(args.model, fn(*inputs), target).backward()
            opt.step()
            opt.zero_grad()
            if step >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        inputs, target = _batch(args.model, g)

        def one_step(fn=fn, opt=opt, inputs=inputs, target=target):
            _loss(args.model, fn(*inputs), target).backward()
            opt.step()
            opt.zero_grad()

        sys.path.insert(0, str(HERE))
        from models import _allocated_peak_mb

        counts = _counts(compiler)  # before the profiled steps, which may compile again
        _allocated_peak_mb(one_step)  # (capture guards on the profiler's state)
        rows.append(
            {
                "compiler": compiler,
                "step_ms": statistics.median(times),
                "spread_ms": [min(times), max(times)],
                "peak_mb": _allocated_peak_mb(one_step),
                "region_boundaries": None,
                **counts,
            }
        )
        final[compiler] = [p.to_local().detach().clone() for p in model.parameters()]
        print(f"  [rank {rank}] fsdp {compiler}: {rows[-1]['step_ms']:.2f} ms/step", flush=True)
    for row in rows[1:]:
        row["params_equal_eager"] = all(
            torch.allclose(a, b, rtol=1e-3, atol=1e-4)
            for a, b in zip(final[row["compiler"]], final["eager"])
        )
    return rows


def _report_fsdp(per_rank: list, args) -> None:
    sys.path.insert(0, str(HERE))
    from provenance import commit

    print(f"\nFSDP2 {args.model}, {args.world} CPU processes (gloo)")
    print(f"{'compiler':<16}{'ms/step':>9}{'spread':>17}{'vs eager':>10}{'peak MB':>9}"
          f"{'graphs/brk/fb':>15}{'region bounds':>15}{'params ok':>11}")  # fmt: skip
    eager = per_rank[0][0]["step_ms"]
    for k, row in enumerate(per_rank[0]):
        ok = all(r[k].get("params_equal_eager", True) for r in per_rank)
        counts = _counts_text(row)
        bounds = "-" if row["region_boundaries"] is None else str(row["region_boundaries"])
        lo, hi = row["spread_ms"]
        print(f"{row['compiler']:<16}{row['step_ms']:>9.2f}{f'{lo:.2f}-{hi:.2f}':>17}"
              f"{eager / row['step_ms']:>9.2f}x{row['peak_mb']:>9.2f}{counts:>15}{bounds:>15}"
              f"{'yes' if ok else 'NO':>11}")  # fmt: skip
    out = HERE / "results" / f"distributed_cpu_fsdp_{args.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"commit": commit(), "world": args.world, "model": args.model, "wrap": "fsdp"}
    out.write_text(json.dumps({"meta": meta, "ranks": per_rank}, indent=1))
    print(f"wrote {out}")


def rank_main(rank: int, world: int, init: str, args) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    import kiln
    import kiln.distributed

    if args.wrap == "fsdp":
        gathered = [None] * world
        dist.all_gather_object(gathered, fsdp_rows(rank, world, args))
        if rank == 0:
            _report_fsdp(gathered, args)
        dist.destroy_process_group()
        return

    rows, final = [], {}
    for compiler in COMPILERS:
        kiln.reset()
        ddp = DDP(_model(args.model), bucket_cap_mb=args.bucket_mb)
        launches: list[float] = []
        done: list[float] = []
        ddp.register_comm_hook(None, _recording_hook(launches, done))
        if compiler == "eager":
            fn = ddp
        elif compiler == "torch.compile":
            import torch._dynamo
            from torch._dynamo.utils import counters

            torch._dynamo.reset()
            counters.clear()
            fn = torch.compile(ddp)
        else:
            # "one graph": kiln.compile reads DDP's bucket limits to split at
            # (kiln.distributed.bucket_caps); DDP's own buckets stay as they are
            import kiln.distributed

            saved = kiln.distributed.bucket_caps
            if compiler == "kiln one graph":
                kiln.distributed.bucket_caps = lambda ddp: [1 << 40]
            fn = kiln.compile(ddp)
            kiln.distributed.bucket_caps = saved
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1000 + rank)
        times, fractions, hidden = [], [], []
        for step in range(args.warmup + args.steps):
            inputs, target = _batch(args.model, g)
            dist.barrier()
            t0 = time.perf_counter()
            loss = _loss(args.model, fn(*inputs), target)
            del launches[:], done[:]
            tb = time.perf_counter()
            loss.backward()
            te = time.perf_counter()
            opt.step()
            opt.zero_grad()
            t1 = time.perf_counter()
            if step >= args.warmup:
                times.append((t1 - t0) * 1e3)
                if launches:
                    fractions.append((min(launches) - tb) / max(te - tb, 1e-9))
        for _ in range(args.trace_steps):
            dist.barrier()
            share = _traced_step(args, fn, opt, _batch(args.model, g), launches, done)
            if share is not None:
                hidden.append(share)
        under = statistics.median(hidden) if hidden else None
        row = {
            "compiler": compiler,
            "step_ms": statistics.median(times),
            "spread_ms": [min(times), max(times)],
            "first_bucket_at": statistics.median(fractions) if fractions else None,
            "comm_under_backward": under,
            "overlaps_backward": under is not None and under >= 0.10,
            "pieces": list(kiln.distributed.SPLITS) if compiler.startswith("kiln") else None,
            **_counts(compiler),
        }
        final[compiler] = [p.detach().clone() for p in ddp.parameters()]
        rows.append(row)
        print(f"  [rank {rank}] {compiler}: {row['step_ms']:.2f} ms/step", flush=True)
    for compiler in COMPILERS[1:]:
        same = all(
            torch.allclose(a, b, rtol=1e-3, atol=1e-4)
            for a, b in zip(final[compiler], final["eager"])
        )
        next(r for r in rows if r["compiler"] == compiler)["params_equal_eager"] = same
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        _report(gathered, args)
    dist.destroy_process_group()


def _report(per_rank: list, args) -> None:
    sys.path.insert(0, str(HERE))
    from provenance import commit

    print(f"\nDDP {args.model}, {args.world} CPU processes (gloo), buckets {args.bucket_mb} MB")
    print(
        f"{'compiler':<16}{'ms/step':>9}{'spread':>17}{'vs eager':>10}{'first bucket at':>17}"
        f"{'comm under bwd':>16}{'overlaps bwd':>14}{'pieces':>8}{'graphs/brk/fb':>15}"
        f"{'params ok':>11}"
    )
    eager = per_rank[0][0]["step_ms"]
    for k, row in enumerate(per_rank[0]):
        ok = all(r[k].get("params_equal_eager", True) for r in per_rank)
        frac, hidden = row["first_bucket_at"], row["comm_under_backward"]
        overlaps = "-" if hidden is None else ("yes" if row["overlaps_backward"] else "no")
        pieces = ",".join(map(str, row["pieces"])) if row["pieces"] else "-"
        lo, hi = row["spread_ms"]
        spread = f"{lo:.2f}-{hi:.2f}"
        print(
            f"{row['compiler']:<16}{row['step_ms']:>9.2f}{spread:>17}"
            f"{eager / row['step_ms']:>9.2f}x{(f'{frac:.2f}' if frac is not None else '-'):>17}"
            f"{(f'{hidden:.0%}' if hidden is not None else '-'):>16}{overlaps:>14}"
            f"{pieces:>8}{_counts_text(row):>15}{'yes' if ok else 'NO':>11}"
        )
    out = HERE / "results" / f"distributed_cpu_{args.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "commit": commit(),
        "world": args.world,
        "model": args.model,
        "bucket_mb": args.bucket_mb,
    }
    out.write_text(json.dumps({"meta": meta, "ranks": per_rank}, indent=1))
    print(f"wrote {out}")


def _counts_text(row: dict) -> str:
    return "/".join(
        "-" if row[k] is None else str(row[k]) for k in ("graphs", "breaks", "fallbacks")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--model", default="mlp", choices=["mlp", "gpt2"])
    ap.add_argument("--wrap", default="ddp", choices=["ddp", "fsdp"])
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--trace-steps", type=int, default=3, help="profiled steps after timing")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--init", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.world, args.init, args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "store")
        base = [sys.executable, __file__, "--world", str(args.world), "--model", args.model]
        base += ["--bucket-mb", str(args.bucket_mb), "--steps", str(args.steps)]
        base += ["--warmup", str(args.warmup), "--init", init, "--wrap", args.wrap]
        base += ["--trace-steps", str(args.trace_steps)]
        procs = [subprocess.Popen([*base, "--rank", str(r)]) for r in range(args.world)]
        codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"a rank failed: exit codes {codes}")


if __name__ == "__main__":
    main()
