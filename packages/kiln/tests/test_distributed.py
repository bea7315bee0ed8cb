"""Functional collectives inside compiled graphs, on 2 and 4 CPU processes over gloo.

``torch.distributed._functional_collectives`` calls are captured through (kiln-capture
inlines the library's Python; a ProcessGroup's name and size are constants of the guarded
group), so a function calling them is one graph with no break; the collectives and their
waits are library calls of the compiled graph, each collective issued as soon as its input
exists and its wait just before the first kernel that reads the result
(kiln_inductor.passes.collectives). Results equal eager's on every rank.

``kiln.compile(DDP(model))`` splits the graph at gradient buckets (kiln/distributed.py):
an MLP and HF GPT-2 train to the parameters eager DDP reaches, with several pieces per
graph, ``no_sync()`` and gradient accumulation included.

FSDP2 (``fully_shard`` per block and at the root, fsdp_worker.py): an MLP, a GPT-style
model and HF LLaMA / GPT-2 compiled at the root are one graph holding the all-gather of
every sharded parameter and, in its backward, their reduce-scatters (kiln/fsdp_graph.py;
FSDP's own methods issue no collective); compiled per block, or at the root with
``fsdp_graph`` off or under gradient accumulation without sync, each unit is a region
between FSDP's eager hooks, which issue eager FSDP2's collectives in eager's order
(kiln/fsdp.py). With activation checkpointing inside and around the sharded blocks,
explicit prefetching and reshard_after_forward=False, every rank reaches eager's
parameter shards with no break; kiln.compile leaves the user's modules as they were.

A whole training step compiled (forward, backward, optimizer step) under DDP and FSDP2
trains like eager; its graph breaks are kiln-capture's (distributed_worker.KNOWN_STEP_BREAKS)."""

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


def _run_ranks(tmp_path, world: int, suites: str) -> list[str]:
    """Run distributed_worker.py's ``suites`` on ``world`` gloo processes; every rank
    must finish with exit status 0 (each asserts its own results against eager)."""
    init = "file://" + str(tmp_path / "store")
    debug = str(tmp_path / "debug")
    argv = [sys.executable, str(WORKER)]
    ranks = [
        subprocess.Popen(
            [*argv, str(r), str(world), init, debug, suites],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    outputs = []
    for p in ranks:
        try:
            out, _ = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            for q in ranks:
                q.kill()
            raise
        outputs.append(out)
    failed = [
        f"rank {r} failed:\n{out[-3000:]}"
        for r, (p, out) in enumerate(zip(ranks, outputs))
        if p.returncode
    ]
    assert not failed, "\n".join(failed)  # every rank's: the first may only see another's end
    return outputs


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_compile_on_every_rank(tmp_path, world):
    """all_reduce with independent work beside it, all_gather then reduce_scatter (new and
    old names, waited on implicitly and with explicit wait_tensor), all_to_all_single (even
    and given splits), avg and max reductions, groups given as a DeviceMesh, (mesh, dim)
    or ranks; and the autograd variants inside training graphs (gradients through
    all-gather, reduce-scatter, all-to-all): one graph, no break, fallback or eager frame,
    eager's values and gradients on every rank."""
    _run_ranks(tmp_path, world, "collectives")


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_trains_like_eager(tmp_path, world):
    """kiln.compile(DDP(model)) on an MLP, the MLP with checkpoint() around layer pairs and
    with checkpoint_wrapper around them, and HF GPT-2 without and with HF's gradient
    checkpointing: several pieces per graph, no_sync steps included, parameters equal
    eager DDP's on every rank; under DDP's default bucket sizes, DDP's rebuilt buckets
    match eager's in number."""
    _run_ranks(tmp_path, world, "ddp")


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ddp_gradient_accumulation(tmp_path, world):
    """Gradient accumulation under kiln.compile(DDP(model)), MLP and HF GPT-2: 3 steps of
    3 micro-batches, the first two under no_sync() or all synchronized, gradients as bucket
    views: every gradient after every micro-batch and every parameter after the steps
    equal eager DDP's on every rank; the graph split into pieces, 0 breaks."""
    _run_ranks(tmp_path, world, "ddp_accumulate")


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp_trains_like_eager(tmp_path, world):
    """FSDP2 MLP and GPT-style model compiled at the root (one graph gathering every
    sharded parameter, no region boundary, FSDP's methods issue no collective), at the
    root with fsdp_graph off and per block (regions: each step issues eager FSDP2's
    all-gathers, reshards and reduce-scatters in eager's order; per-block compiled units
    included: FSDP's root finds them), activation checkpointing none, inside, around the
    sharded blocks and as checkpoint_wrapper (fsdp_worker.CASES): parameter shards equal
    eager's, 0 breaks. Compiled whole, the MLP's forward issues each unit's all-gathers
    one unit ahead of its use (not all before its first matmul: at most two units' in
    flight, the next one's under the current one's matmuls), its backward gathers the
    blocks' weights again (reshard_after_forward=True: only shards are saved) one unit
    ahead too, each unit's reduce-scatters run under later matmuls with one unit's in
    flight; with reshard_after_forward=False the gathered weights are saved and the
    backward gathers nothing (fsdp_worker.check_fsdp_overlap)."""
    _run_ranks(tmp_path, world, "fsdp")


def test_fsdp_whole_graph_peak_memory(tmp_path):
    """kiln.compile(fsdp_root) holds no more than eager FSDP2 does: per-rank peak memory
    of a training step (torch's CPU allocator, profiler memory events) of
    benchmarks/distributed.py's MLP and a GPT-style model with 3 MB blocks is at most
    eager FSDP2's plus one unit's unsharded parameters (the unit gathered ahead) and 0.5
    MB; parameters equal eager's (fsdp_worker.check_fsdp_memory)."""
    _run_ranks(tmp_path, 2, "fsdp_memory")


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_fsdp_options_train_like_eager(tmp_path, world):
    """FSDP2 with explicit forward/backward prefetching (set_modules_to_forward_prefetch /
    set_modules_to_backward_prefetch), with reshard_after_forward=False and with gradient
    accumulation (set_requires_gradient_sync / set_reshard_after_backward), MLP and
    GPT-style model, compiled at the root and per block (fsdp_worker.FSDP_OPTION_CASES):
    eager's sequence of all-gathers, reshards and reduce-scatters every step, parameter
    shards equal eager's, 0 breaks."""
    _run_ranks(tmp_path, world, "fsdp_options")


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_compiled_training_step(tmp_path, world):
    """kiln.compile of a whole training step (zero_grad, forward, backward, SGD with
    momentum) of an MLP under DDP and under FSDP2, calling the wrapped model or the model
    compiled on its own (its graphs split at buckets / its units' regions run inside the
    step): losses and parameters equal eager's on
    every rank, graphs built, no fallback or eager frame; the graph breaks it takes are
    kiln-capture's, each listed with why in distributed_worker.KNOWN_STEP_BREAKS."""
    _run_ranks(tmp_path, world, "train_step")


def test_fsdp_leaves_modules_unchanged(tmp_path):
    """kiln.compile of an FSDP2 model (and of one block) changes nothing a user sees on
    the modules, before or after compiled steps; the original model runs eagerly."""
    _run_ranks(tmp_path, 2, "fsdp_unchanged")


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_fsdp_hf_trains_like_eager(tmp_path, world):
    """HF LLaMA and GPT-2 (2 layers, hidden 64), fully_shard per decoder layer and at the
    root, kiln.compile of the model or of each decoder layer, AdamW/SGD steps, with and
    without HF gradient checkpointing: eager's collectives in eager's order, parameter
    shards equal eager FSDP2's on every rank, 0 breaks and eager frames, graphs built."""
    _run_ranks(tmp_path, world, "fsdp_hf")
