"""One rank of test_distributed.py: ``python distributed_worker.py RANK WORLD INIT DEBUG``
(a script, so that each rank is a fresh process that imports nothing from the tests)."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def _programs():
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    # the names torch 2.13 uses (2.11 has the older ones only)
    all_gather = getattr(fc, "all_gather_single", fc.all_gather_tensor)
    reduce_scatter = getattr(fc, "reduce_scatter_single", fc.reduce_scatter_tensor)

    def reduce_then_compute(x, w, v):
        r = fc.all_reduce((x @ w).relu(), "sum", group)
        z = (v @ w).sin()  # independent of the collective: runs while it is in flight
        return r * 2 + z

    def gather_and_scatter(x):
        g = all_gather(x * 2, 0, group)
        s = reduce_scatter(g.cos(), "sum", 0, group)
        return g.sum(0), s + 1

    def all_to_all(x):
        return fc.all_to_all_single(x.exp(), None, None, group) - 1

    return {
        "reduce_then_compute": (
            reduce_then_compute,
            lambda g: (
                torch.randn(4, 8, generator=g),
                torch.randn(8, 8, generator=g),
                torch.randn(4, 8, generator=g),
            ),
        ),  # fmt: skip
        "gather_and_scatter": (gather_and_scatter, lambda g: (torch.randn(4, 6, generator=g),)),
        "all_to_all": (all_to_all, lambda g: (torch.randn(4, 3, generator=g),)),
    }


def main(rank: int, world: int, init: str, debug: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        import kiln

        for name, (fn, make) in _programs().items():
            kiln.reset()
            folder = os.path.join(debug, f"{name}_{rank}")
            compiled = kiln.compile(fn, options={"debug_dir": folder})
            g = torch.Generator().manual_seed(10 * rank + 1)
            for _ in range(2):
                args = make(g)
                got, want = compiled(*args), fn(*args)
                torch.testing.assert_close(got, want, msg=f"{name} on rank {rank}")
            stats = kiln.stats()
            assert stats["graphs"] == 1, (name, stats)
            assert stats["breaks"] == stats["fallbacks"] == stats["eager_frames"] == 0, stats
            if name == "reduce_then_compute":
                _assert_wait_after_independent_work(folder)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _assert_wait_after_independent_work(folder: str) -> None:
    """In the ATen graph after the ``collectives`` pass (the debug dump), the all_reduce
    comes before the independent ``sin`` and its wait after it."""
    dumps = [
        os.path.join(root, f)
        for root, _, files in os.walk(folder)
        for f in files
        if f.endswith("_collectives.py")
    ]
    assert dumps, f"no dump of the collectives pass under {folder}"
    lines = open(dumps[0]).read().splitlines()

    def line_of(text: str) -> int:
        return next(k for k, line in enumerate(lines) if text in line)

    start, sin, wait = line_of("all_reduce.default"), line_of("sin.default"), line_of("wait_tensor")
    assert start < sin < wait, "\n".join(lines)


if __name__ == "__main__":
    rank, world, init, debug = sys.argv[1:5]
    main(int(rank), int(world), init, debug)
