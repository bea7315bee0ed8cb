"""Functional collectives inside compiled graphs, on 2 and 4 CPU processes over gloo.

``torch.distributed._functional_collectives`` calls are captured through (kiln-capture
inlines the library's Python; a ProcessGroup's name and size are constants of the guarded
group), so a function calling them is one graph with no break; the collectives and their
waits are library calls of the compiled graph, each collective issued as soon as its input
exists and its wait just before the first kernel that reads the result
(kiln_inductor.passes.collectives). Results equal eager's on every rank.

``kiln.compile(DDP(model))`` splits the graph at gradient buckets (kiln/distributed.py):
an MLP and HF GPT-2 train to the parameters eager DDP reaches, with several pieces per
graph, ``no_sync()`` included.

FSDP2 (``fully_shard`` per block and at the root, fsdp_worker.py): an MLP and a GPT-style
model compiled at the root and per block, with and without activation checkpointing, reach
eager FSDP2's parameter shards on every rank with no break (kiln/fsdp.py)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(
    not dist.is_available() or sys.platform == "win32", reason="needs torch.distributed (gloo)"
)

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_and_ddp_compile_on_every_rank(tmp_path, world):
    """Each rank (distributed_worker.py) compiles an all_reduce with independent work
    beside it, an all_gather then reduce_scatter, and an all_to_all_single, and checks
    them against eager with one graph and no break, fallback or eager frame; then trains
    DDP-wrapped and FSDP2-sharded models against eager DDP and FSDP2."""
    init = "file://" + str(tmp_path / "store")
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(world), init, str(tmp_path / "debug")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    outputs = []
    for p in ranks:
        try:
            out, _ = p.communicate(timeout=420)
        except subprocess.TimeoutExpired:
            for q in ranks:
                q.kill()
            raise
        outputs.append(out)
    for r, (p, out) in enumerate(zip(ranks, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{out[-4000:]}"
