"""Does this torch's gloo survive several collectives in flight at once?

kiln-inductor's collectives pass runs one CPU (gloo) collective at a time, because torch
2.13's ProcessGroupGloo corrupts its heap when several of different sizes are in flight on
4 ranks (``malloc(): unaligned tcache chunk detected``, or a segfault inside gloo's ring
allreduce). This script reproduces that with torch alone, so that the rule can be lifted
once a torch release no longer fails it:

    python tools/gloo_inflight_repro.py                 # 4 ranks, 4 of each size in flight
    python tools/gloo_inflight_repro.py --serial        # each waited on before the next

Each of ``--world`` processes issues ``--iters`` rounds of ``_c10d_functional``
reduce-scatters of 8 to 1024 elements and all-gathers of their quarters, ``--copies`` of each before their
waits, and checks the reduce-scatters' sums. It runs ``--runs`` times and prints each
run's exit codes. The crash is a race and its rate moves with the machine's load: with
torch 2.13.0+cpu on a 2-core machine, the same program crashed in 3 of 9 runs one hour
(two runs with the heap message, one segfault; the core showed both of gloo's worker
threads in ``ring()`` allreduces, the crashing one destroying an ``UnboundBuffer``) and in
0 of 15 an hour later; waited one at a time it never crashed. Run it several times before
concluding a torch release is fixed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile


def rank_main(rank: int, world: int, init: str, iters: int, copies: int, serial: bool) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    c10d = torch.ops._c10d_functional
    name = dist.group.WORLD.group_name
    want = world * (world + 1) / 2
    for _ in range(iters):
        pending = []
        for size in (8, 32, 256, 1024) * copies:
            x = torch.full((size,), float(rank + 1))
            rs = c10d.reduce_scatter_tensor(x, "sum", world, name)
            pending.append((c10d.wait_tensor(rs) if serial else rs, True))
            ag = c10d.all_gather_into_tensor(x[: size // world].contiguous(), world, name)
            pending.append((c10d.wait_tensor(ag) if serial else ag, False))
        for out, summed in pending:
            out = out if serial else c10d.wait_tensor(out)
            if summed and not bool((out == want).all()):
                raise SystemExit(f"rank {rank}: wrong reduce-scatter sum")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--serial", action="store_true", help="wait on each before the next")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.world, args.init, args.iters, args.copies, args.serial)
        return
    failed = 0
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as tmp:
            init = "file://" + os.path.join(tmp, "store")
            argv = [sys.executable, __file__, "--world", str(args.world), "--init", init]
            argv += ["--iters", str(args.iters), "--copies", str(args.copies)]
            argv += ["--serial"] if args.serial else []
            logs = [open(os.path.join(tmp, f"rank{r}.log"), "w+") for r in range(args.world)]
            procs = [  # stderr to files: a pipe nobody reads while waiting can fill and block
                subprocess.Popen([*argv, "--rank", str(r)], stderr=log, text=True)
                for r, log in enumerate(logs)
            ]
            codes = [p.wait() for p in procs]
            errors = set()
            for log in logs:
                log.seek(0)
                errors.update(log.read().splitlines())
                log.close()
        crashed = any(c < 0 or c in (134, 139) for c in codes)
        failed += crashed
        heap = sorted(e for e in errors if "malloc" in e or "free" in e or "corrupt" in e)
        print(f"run {run}: exit codes {codes}{'  CRASHED' if crashed else ''} {heap}", flush=True)
    print(f"{failed} of {args.runs} runs crashed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
