"""FSDP2 checks of one rank of test_distributed.py (called by distributed_worker.py, with
the process group set up): ``fully_shard`` per block and at the root, compiled whole
(``kiln.compile(root)``) or per block (each block replaced by ``kiln.compile(block)``, the
root eager), on an MLP and a small GPT-style model, with activation checkpointing none,
inside the blocks (``checkpoint`` of the block's body), around them (``checkpoint(block,
x)`` in the parent) or as ``checkpoint_wrapper`` applied after ``fully_shard``, with
FSDP's defaults, explicit forward/backward prefetching or ``reshard_after_forward=False``
(``check_fsdp_options``); and an HF
LLaMA and GPT-2 (``fully_shard`` per decoder layer and at the root, SGD and AdamW, with
and without HF's gradient checkpointing). After the steps every parameter shard equals
eager FSDP2's on this rank and every step issued eager's collectives in eager's order;
kiln built graphs, with no break, fallback or eager frame (a call of a
sharded block from its parent is a region boundary, kiln/fsdp.py, counted apart).
``check_unchanged``: kiln.compile leaves the user's modules as they were."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# activation checkpointing: none, inside each block, around each block, checkpoint_wrapper
AC_MODES = ("none", "inside", "around", "wrapper")


class MLPBlock(nn.Module):
    def __init__(self, dim: int, ac: bool) -> None:
        super().__init__()
        self.up, self.down, self.ac = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim), ac

    def body(self, x):
        return x + self.down(F.gelu(self.up(x)))

    def forward(self, x):
        return checkpoint(self.body, x, use_reentrant=False) if self.ac else self.body(x)


class MLP(nn.Module):
    dim = 64

    def __init__(self, ac: str) -> None:
        super().__init__()
        self.inp = nn.Linear(32, self.dim)
        self.blocks = nn.ModuleList(MLPBlock(self.dim, ac == "inside") for _ in range(3))
        self.head = nn.Linear(self.dim, 8)
        self.around = ac == "around"

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.around else block(x)
        return self.head(x)


class OddMLP(MLP):
    """Rows no world size divides (45, 90): FSDP pads the last ranks' shards, and the
    graph pads each shard before its all-gather and narrows the result."""

    dim = 45


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, ac: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.heads, self.ac = heads, ac

    def body(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))

    def forward(self, x):
        return checkpoint(self.body, x, use_reentrant=False) if self.ac else self.body(x)


class GPT(nn.Module):
    dim, layers = 64, 2

    def __init__(self, ac: str) -> None:
        super().__init__()
        d = self.dim
        self.tok, self.pos = nn.Embedding(128, d), nn.Embedding(32, d)
        self.blocks = nn.ModuleList(GPTBlock(d, 4, ac == "inside") for _ in range(self.layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 128, bias=False)
        self.around = ac == "around"

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.around else block(x)
        return self.head(self.ln(x))


class WideGPT(GPT):
    """Parameters outweigh activations (check_fsdp_memory): 4 blocks of 3 MB."""

    dim, layers = 256, 4


def _sharded(model_cls, ac: str, mesh, shard_root: bool = True, fsdp: str = "default"):
    """``fsdp``: ``"default"``, ``"prefetch"`` (each block all-gathers the next one in
    forward and the previous one in backward, set explicitly), ``"no reshard"``
    (``reshard_after_forward=False``: the blocks stay unsharded from forward to backward),
    ``"mixed"`` (MixedPrecisionPolicy: bf16 parameters, float32 reduction, on every unit)
    or ``"accumulate"`` (defaults; the training loop accumulates micro-batches)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = model_cls(ac)
    from torch.distributed.fsdp import MixedPrecisionPolicy

    options = {"reshard_after_forward": False} if fsdp == "no reshard" else {}
    if fsdp == "mixed":  # bf16 parameters and compute, float32 gradient reduction
        options["mp_policy"] = MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    if shard_root:
        fully_shard(model, mesh=mesh, **{k: v for k, v in options.items() if k == "mp_policy"})
    if fsdp == "prefetch":
        blocks = list(model.blocks)
        for before, after in zip(blocks, blocks[1:]):
            before.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([before])
    if ac == "wrapper":  # each sharded block under a CheckpointWrapper, outside the unit
        block_cls = type(model.blocks[0])
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, block_cls))
    return model


def _loss(name: str, out, target):
    if name == "gpt":
        return F.cross_entropy(out[:, :-1].reshape(-1, 128), target[:, 1:].reshape(-1))
    return ((out - target) ** 2).mean()


# (model, activation checkpointing, where kiln.compile is applied): every mode on the MLP,
# the GPT-style model in each mode at least once. "root": kiln.compile(root), one graph with
# FSDP's collectives in it (kiln/fsdp_graph.py); "root regions": the same with
# options={"fsdp_graph": False}, each unit a region between FSDP's eager hooks (kiln/fsdp.py);
# "blocks": each block replaced by kiln.compile(block) (regions: FSDP's root is eager)
CASES = [
    *(("mlp", ac, how) for ac in AC_MODES for how in ("root", "blocks")),
    *(("gpt", ac, how) for ac in ("none", "inside") for how in ("root", "blocks")),
    ("gpt", "around", "root"),
    ("gpt", "wrapper", "root"),
    ("gpt", "wrapper", "blocks"),
    ("odd", "none", "root"),
    ("odd", "inside", "root"),
    *(("mlp", ac, "root regions") for ac in ("none", "around")),
    ("gpt", "inside", "root regions"),
    # only the blocks sharded: the root is plain, each block an FSDP root of its own
    *(("mlp", ac, "unsharded root") for ac in ("none", "around")),
    ("mlp", "none", "unsharded root regions"),
]


def _batch(name: str, g: torch.Generator):
    if name == "gpt":
        x = torch.randint(0, 128, (2, 16), generator=g)
        return x, x
    return torch.randn(8, 32, generator=g), torch.randn(8, 8, generator=g)


def _compile_blocks(model: nn.Module):
    """torch.compile's idiom for per-block compilation: each block replaced by its
    compiled self (state_dict keys unchanged: the compiled block shares its __dict__)."""
    import kiln

    for k, block in enumerate(model.blocks):
        model.blocks[k] = kiln.compile(block)
    return model


def _assert_shard_close(got, want, atol: float, label: str) -> None:
    """This rank's shards of two (DTensor) parameters, with the mismatch report."""
    local = getattr(got, "to_local", None)
    got, want = (got.to_local(), want.to_local()) if local is not None else (got, want)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=atol, msg=lambda m: f"{label}: {m}")


def _assert_counts(what: str) -> dict:
    import kiln

    stats = kiln.stats()
    assert stats["graphs"] >= 1, (what, stats)
    assert stats["breaks"] == stats["fallbacks"] == stats["eager_frames"] == 0, (what, stats)
    return stats


def _compile(model: nn.Module, how: str):
    """``model`` compiled as ``how`` says (CASES)."""
    import kiln

    if how == "blocks":
        return _compile_blocks(model)
    return kiln.compile(model, options={"fsdp_graph": not how.endswith("regions")})


def _whole(how: str, options: str = "default") -> bool:
    """Does kiln run FSDP's collectives in one graph (kiln/fsdp_graph.py)? Per-block
    compilation and the regions option do not; gradient accumulation without sync runs
    the regions for its micro-batches and for the step FSDP owes their reduce-scatter."""
    return how in ("root", "unsharded root") and options != "accumulate"


def _check_comms(what: str, how: str, options: str, eager_events: list, kiln_events: list):
    """Regions: kiln's step issues eager FSDP's all-gathers, reshards and reduce-scatters in
    eager's order (FSDP runs them around kiln's regions). One graph: FSDP's own methods
    issue none (the graph's all-gathers and reduce-scatters do; gathered parameters are
    counted by _assert_whole)."""
    if _whole(how, options):
        assert eager_events and kiln_events == [], f"{what}: FSDP's collectives {kiln_events}"
    else:
        assert eager_events == kiln_events, f"{what}:\neager {eager_events}\nkiln  {kiln_events}"


def _assert_whole(what: str, model: nn.Module, how: str, options: str, stats: dict) -> None:
    """One graph holding the gather of every sharded parameter, no region boundary; or,
    on the regions path, no parameter gathered by a graph."""
    import kiln.fsdp_graph

    gathered = kiln.fsdp_graph.GATHERED
    if not _whole(how, options):
        assert gathered == [], (what, gathered)
        return
    sharded = sum(1 for p in model.parameters() if hasattr(p, "to_local"))
    assert stats["graphs"] == 1 and stats["region_boundaries"] == 0, (what, stats)
    assert gathered == [sharded], f"{what}: gathered {gathered} of {sharded} sharded parameters"


def check_fsdp(rank: int, world: int) -> None:
    """CASES with FSDP's default options (see _train_like_eager)."""
    for name, ac, how in CASES:
        _train_like_eager(rank, world, name, ac, how, "default")


def _collectives_dumps(folder: str) -> dict[str, list[str]]:
    """The forward and backward ATen graphs after kiln-inductor's collectives pass (the
    debug dumps under ``folder``), as stripped lines; the backward is the one taking
    tangents."""
    import glob
    import os

    dumps = {}
    for path in glob.glob(os.path.join(folder, "**", "*_collectives.py"), recursive=True):
        lines = [line.strip() for line in open(path).read().splitlines()]
        header = next(line for line in lines if line.startswith("def forward("))
        dumps["bw" if "tangents" in header else "fw"] = lines
    return dumps


def _in_flight(lines: list[str], op: str) -> list[tuple[int, set[str]]]:
    """At each matmul line: the ``op`` collectives issued before it and not yet waited on."""
    issued: set[str] = set()
    out = []
    for k, line in enumerate(lines):
        if f"= torch.ops._c10d_functional.{op}." in line:
            issued.add(line.split(" = ")[0])
        elif "= torch.ops._c10d_functional.wait_tensor." in line:
            issued.discard(line.split("wait_tensor.default(")[1].split(")")[0])
        elif any(mm in line for mm in ("aten.mm.", "aten.addmm.", "aten.bmm.")):
            out.append((k, set(issued)))
    return out


def _most_in_flight(lines: list[str]) -> int:
    """The most collectives of any kind issued and not yet waited on at once."""
    issued: set[str] = set()
    most = 0
    for line in lines:
        if "= torch.ops._c10d_functional.wait_tensor." in line:
            issued.discard(line.split("wait_tensor.default(")[1].split(")")[0])
        elif "= torch.ops._c10d_functional." in line:
            issued.add(line.split(" = ")[0])
            most = max(most, len(issued))
    return most


def check_fsdp_overlap(rank: int, world: int, debug: str) -> None:
    """The MLP (a root unit holding ``inp`` and ``head``, 3 block units; 4 parameters
    each) compiled whole, in the ATen graphs after kiln-inductor's collectives pass (the
    debug dumps). One all-gather a unit (FSDP2's coalesced gather). FSDP's defaults (the
    blocks reshard after forward): the forward issues each unit's all-gather about one
    unit ahead of its use (KILN_PREFETCH_GROUPS=1): not all before its first matmul, and
    some gather in flight while a matmul runs (prefetching); the backward gathers each
    block again (3 all-gathers, the forward saves the blocks' shards, not their gathered
    weights), one unit ahead as well, and some reduce-scatter runs under a later matmul. On gloo never more than one collective is in
    flight (kiln-inductor's collectives pass: torch's gloo corrupts its heap with several
    at once). With
    ``reshard_after_forward=False`` the forward saves the gathered weights and the
    backward gathers nothing; so it does after ``set_reshard_after_forward(False)`` on a
    model compiled and run with the defaults (the graph is built again for the new
    setting). Gradients equal eager FSDP2's."""
    import os

    from torch.distributed.device_mesh import init_device_mesh

    import kiln

    mesh = init_device_mesh("cpu", (world,))
    shards_saved: dict[str, int] = {}
    for fsdp in ("default", "no reshard", "switched"):
        kiln.reset()
        built = "default" if fsdp == "switched" else fsdp
        eager, mine = (_sharded(MLP, "none", mesh, fsdp=built) for _ in range(2))
        folder = os.path.join(debug, f"fsdp_overlap_{rank}_{fsdp.replace(' ', '_')}")
        # one forward and one backward graph, compiled here (not pieces of regional reuse,
        # nor loaded from the artifact cache, which writes no dumps); KILN_DEBUG_DIR, as the
        # debug_dir option holds only while the forward compiles, not the backward's
        options = {"regional_reuse": False, "artifact_cache": False}
        compiled = kiln.compile(mine, options=options)
        x, target = _batch("mlp", torch.Generator().manual_seed(7 + rank))
        if fsdp == "switched":  # a step with FSDP's defaults, then resharding turned off
            for model in (eager, compiled):
                _loss("mlp", model(x), target).backward()
            for model in (eager, mine):
                model.zero_grad(set_to_none=True)
                model.set_reshard_after_forward(False)
        os.environ["KILN_DEBUG_DIR"] = folder
        try:
            for model in (eager, compiled):
                _loss("mlp", model(x), target).backward()
        finally:
            del os.environ["KILN_DEBUG_DIR"]
        for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
            _assert_shard_close(q.grad, p.grad, 1e-6, f"overlap check, grad of {pname}")
        dumps = _collectives_dumps(folder)
        assert set(dumps) == {"fw", "bw"}, f"collectives dumps under {folder}: {sorted(dumps)}"
        fw, bw = dumps["fw"], dumps["bw"]
        gathers = [line for line in fw if "= torch.ops._c10d_functional.all_gather_into" in line]
        assert len(gathers) == 4, "\n".join(fw)  # one a unit: the root's, 3 blocks'
        flight = _in_flight(fw, "all_gather_into_tensor")
        assert len(flight[0][1]) < len(gathers) - 1, "\n".join(fw)  # not all at the start
        assert any(f for _, f in flight), "\n".join(fw)  # the next unit's in flight
        assert _most_in_flight(fw) == 1 and _most_in_flight(bw) <= 1, "\n".join(fw + bw)
        header = next(line for line in bw if line.startswith("def forward("))
        shards_saved[fsdp] = header.count("saved_primals")  # the input x and shards
        regathers = [line for line in bw if "= torch.ops._c10d_functional.all_gather_in" in line]
        print(f"[rank {rank}] fsdp overlap ({fsdp}): {len(gathers)} all-gathers, at most "
              f"{max(len(f) for _, f in flight)} in flight at a forward matmul; the backward "
              f"gathers {len(regathers)} units again, {shards_saved[fsdp]} inputs saved", flush=True)  # fmt: skip
        if fsdp != "default":  # the gathered weights saved: fewer shards, no gather
            assert not regathers, "\n".join(bw)
            assert shards_saved[fsdp] < shards_saved["default"], (shards_saved, header)
            continue
        assert len(regathers) == 3, "\n".join(bw)  # the blocks'; the root's kept
        flight = _in_flight(bw, "all_gather_into_tensor")
        assert any(f for _, f in flight), "\n".join(bw)
        scatters = _in_flight(bw, "reduce_scatter_tensor")
        assert any(f for _, f in scatters), "\n".join(bw)  # under a later matmul


def _peak_mb(step: Callable[[], None]) -> float:
    """The most bytes torch's CPU allocator had out during ``step()`` above its start, in
    MB: the profiler's memory events, as benchmarks/distributed.py measures peak MB."""
    import json
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    mem = sorted(
        (e for e in events if e.get("name") == "[memory]" and "args" in e), key=lambda e: e["ts"]
    )
    if not mem:
        return 0.0
    start = mem[0]["args"]["Total Allocated"] - mem[0]["args"]["Bytes"]
    return max(0, max(e["args"]["Total Allocated"] for e in mem) - start) / 2**20


def _memory_model(name: str, mesh) -> tuple[nn.Module, float]:
    """benchmarks/distributed.py's MLP (8 x Linear(512, 512) + GELU, Linear(512, 16), each
    Linear a unit) or WideGPT (each block a unit), sharded at the root too; and the
    largest unit's unsharded parameters in MB."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    if name == "mlp":
        layers = [m for _ in range(8) for m in (nn.Linear(512, 512), nn.GELU())]
        model = nn.Sequential(*layers, nn.Linear(512, 16))
        units = [m for m in model if isinstance(m, nn.Linear)]
    else:
        model = WideGPT("none")
        units = list(model.blocks)
    unit_mb = max(sum(p.numel() * p.element_size() for p in u.parameters()) for u in units)
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, unit_mb / 2**20


def check_fsdp_memory(rank: int, world: int) -> None:
    """Per-rank peak memory of a training step (forward, backward, SGD step; the least of
    4 profiled steps after 2 warm-up ones: gloo's threads allocate at times that vary),
    eager FSDP2 vs kiln.compile(root) (one graph): on the MLP and WideGPT kiln's is at
    most eager's plus one unit's unsharded parameters (the unit its forward gathers
    ahead) and 0.5 MB. Before the blocks were gathered again in the backward, kiln's graph held the
    whole unsharded model (MLP: 12 MB vs eager's 8.5). Parameters equal eager's."""
    from torch.distributed.device_mesh import init_device_mesh

    import kiln

    mesh = init_device_mesh("cpu", (world,))
    for name in ("mlp", "gpt"):
        peaks, final = {}, {}
        for how in ("eager", "kiln"):
            kiln.reset()
            model, unit_mb = _memory_model(name, mesh)
            fn = kiln.compile(model) if how == "kiln" else model
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            g = torch.Generator().manual_seed(300 + rank)

            def step(fn=fn, opt=opt, g=g, name=name) -> None:
                if name == "mlp":
                    x, target = torch.randn(64, 512, generator=g), torch.randn(64, 16, generator=g)
                else:
                    x, target = _batch("gpt", g)
                _loss(name, fn(x), target).backward()
                opt.step()
                opt.zero_grad()

            for _ in range(2):
                step()
            peaks[how] = min(_peak_mb(step) for _ in range(4))
            final[how] = [p.to_local().detach().clone() for p in model.parameters()]
            if how == "kiln":
                _assert_counts(f"fsdp memory {name}")
        for k, (a, b) in enumerate(zip(final["kiln"], final["eager"])):
            _assert_shard_close(a, b, 1e-5, f"fsdp memory {name}, parameter {k}")
        what = (f"fsdp {name} peak on rank {rank}: kiln {peaks['kiln']:.2f} MB, eager "
                f"{peaks['eager']:.2f} MB, one unit {unit_mb:.2f} MB")  # fmt: skip
        # one unit: the forward gathers the next unit while the current one computes (eager
        # FSDP2 on CPU does not prefetch in the forward); 0.5 MB: what the least of 4 steps
        # still varies by between runs (gloo's buffers)
        assert peaks["kiln"] <= peaks["eager"] + unit_mb + 0.5, what
        print(f"[rank {rank}] {what}", flush=True)


# (model, activation checkpointing, where kiln.compile is applied, FSDP options of _sharded)
FSDP_OPTION_CASES = [
    *(("mlp", "none", how, fsdp) for how in ("root", "blocks") for fsdp in ("prefetch", "no reshard")),
    ("mlp", "none", "root regions", "prefetch"),
    ("gpt", "none", "root", "prefetch"),
    ("gpt", "inside", "blocks", "prefetch"),
    ("gpt", "inside", "root", "no reshard"),
    ("gpt", "none", "blocks", "no reshard"),
    # mixed precision: bf16 parameters and compute, float32 reduce-scatter
    *(("mlp", "none", how, "mixed") for how in ("root", "blocks")),
    ("gpt", "inside", "root", "mixed"),
    # gradient accumulation: set_requires_gradient_sync / set_reshard_after_backward
    *(("mlp", "none", how, "accumulate") for how in ("root", "blocks")),
    ("gpt", "inside", "root", "accumulate"),
]  # fmt: skip


class _CommLog:
    """FSDP's all-gathers (each unit's, with the state it ran in: forward, pre-backward,
    or a prefetch of another unit), reshards and post-backward reduce-scatters, in order,
    recorded from FSDPParamGroup's methods: eager and kiln must issue the same sequence
    (prefetching and resharding stay FSDP's own around kiln's regions). A unit is named
    by its path in ``models`` (a block compiled alone is found by its original module)."""

    def __init__(self, *models: nn.Module) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        self.cls, self.events = FSDPParamGroup, []
        self.saved = {
            k: getattr(FSDPParamGroup, k) for k in ("unshard", "reshard", "post_backward")
        }
        log, saved = self.events, self.saved
        names = {
            getattr(m, "_orig_mod", m): name
            for model in models
            for name, m in model.named_modules()
        }

        def unit(group) -> str:
            return names[group.modules[0]]

        def unshard(group, *args, **kwargs):
            before = group._all_gather_result
            saved["unshard"](group, *args, **kwargs)
            if before is None and group._all_gather_result is not None:
                log.append(("all_gather", unit(group), group._training_state.name))

        def reshard(group, *args, **kwargs):
            was = group.is_sharded
            saved["reshard"](group, *args, **kwargs)
            if not was and group.is_sharded:
                log.append(("reshard", unit(group), group._training_state.name))

        def post_backward(group, *args, **kwargs):
            log.append(("post_backward", unit(group)))
            return saved["post_backward"](group, *args, **kwargs)

        self.patched = {"unshard": unshard, "reshard": reshard, "post_backward": post_backward}

    def __enter__(self):
        for k, f in self.patched.items():
            setattr(self.cls, k, f)
        return self

    def __exit__(self, *exc) -> None:
        for k, f in self.saved.items():
            setattr(self.cls, k, f)

    def take(self) -> list:
        taken = list(self.events)
        self.events.clear()
        return taken


def check_fsdp_options(rank: int, world: int) -> None:
    """FSDP2 with explicit forward/backward prefetching, with ``reshard_after_forward=False``
    and with gradient accumulation (``set_requires_gradient_sync`` and
    ``set_reshard_after_backward`` called on kiln's compiled object) (FSDP_OPTION_CASES,
    see _train_like_eager)."""
    for name, ac, how, options in FSDP_OPTION_CASES:
        _train_like_eager(rank, world, name, ac, how, options)


def _train_like_eager(rank: int, world: int, name: str, ac: str, how: str, options: str) -> None:
    """3 SGD steps of an eager and a kiln-compiled copy of one sharded model: each step
    issues eager's sequence of all-gathers (prefetches included), reshards and
    reduce-scatters (_CommLog), and after the steps every parameter shard equals eager's;
    0 breaks, fallbacks or eager frames, graphs built."""
    from torch.distributed.device_mesh import init_device_mesh

    import kiln

    mesh = init_device_mesh("cpu", (world,))
    cls = {"gpt": GPT, "odd": OddMLP}.get(name, MLP)
    kiln.reset()
    shard_root = not how.startswith("unsharded root")
    eager, mine = (_sharded(cls, ac, mesh, shard_root, options) for _ in range(2))
    fn = _compile(mine, how)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, mine)]
    g = torch.Generator().manual_seed(100 + rank)
    what = f"fsdp {name} ac={ac} {options} options, compiled at the {how} on rank {rank}"
    # "accumulate": 3 micro-batches a step, the first two without reduce-scatter nor
    # reshard after backward, set through the object the user calls (kiln's compiled root)
    micro = 3 if options == "accumulate" else 1
    with _CommLog(eager, mine) as comms:
        for step in range(3):
            batches = [_batch(name, g) for _ in range(micro)]
            seen = []
            for model, opt in zip((eager, fn), opts):
                for k, (x, target) in enumerate(batches):
                    if micro > 1:
                        model.set_requires_gradient_sync(k == micro - 1)
                        model.set_reshard_after_backward(k == micro - 1)
                    (_loss(name, model(x), target) / micro).backward()
                opt.step()
                opt.zero_grad()
                seen.append(comms.take())
            _check_comms(f"{what}, step {step}", how, options, *seen)
    prefetched = sum(e[0] == "all_gather" and e[2] == "PRE_BACKWARD" for e in seen[0])
    # bf16 compute: kiln keeps float32 between fused ops where eager rounds each to bf16
    atol = 5e-4 if options == "mixed" else 1e-5
    for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
        _assert_shard_close(q, p, atol, f"{what}: {pname}")
    stats = _assert_counts(what)
    _assert_whole(what, mine, how, options, stats)
    print(f"[rank {rank}] {what}: {stats}, {len(seen[1])} FSDP comm events, "
          f"{prefetched} all-gathers before backward in eager", flush=True)  # fmt: skip


def _snapshot(model: nn.Module) -> list:
    """What a user can see of each module: its class, instance attributes, forward, the
    hook tables (the hook objects themselves), state_dict keys and repr."""
    seen = [repr(model), list(model.state_dict())]
    for m in model.modules():
        hooks = [
            (table, [(k, id(h)) for k, h in getattr(m, table).items()])
            for table in ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks")
        ]
        seen.append((type(m), sorted(m.__dict__), m.forward.__func__, hooks))
    return seen


def check_unchanged(rank: int, world: int) -> None:
    """After kiln.compile (of the root, and of a block alone), a compiled training step
    and its backward, the user's modules are as they were: no ``forward`` instance
    attribute, ``m.forward`` is the class's, the same hook objects, state_dict keys and
    repr; the original model still runs eagerly (no graph is built by calling it)."""
    from torch.distributed.device_mesh import init_device_mesh

    import kiln

    mesh = init_device_mesh("cpu", (world,))
    for ac in ("none", "around"):
        kiln.reset()
        eager, mine = _sharded(MLP, ac, mesh), _sharded(MLP, ac, mesh)
        before = _snapshot(mine)
        compiled = kiln.compile(mine)
        alone = kiln.compile(mine.blocks[0])  # not put in the model: changes nothing
        assert _snapshot(mine) == before, f"kiln.compile changed the modules (ac={ac})"
        assert all(type(m).forward is m.forward.__func__ for m in mine.modules())
        g = torch.Generator().manual_seed(100 + rank)
        opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, mine)]
        x, target = _batch("mlp", g)
        for model, opt in zip((eager, compiled), opts):
            _loss("mlp", model(x), target).backward()
            opt.step()
            opt.zero_grad()
        assert _snapshot(mine) == before, f"a compiled step changed the modules (ac={ac})"
        graphs = kiln.stats()["graphs"]
        assert graphs >= 1, kiln.stats()
        x, target = _batch("mlp", g)
        for model, opt in zip((eager, mine), opts):  # the original module: eager
            _loss("mlp", model(x), target).backward()
            opt.step()
            opt.zero_grad()
        assert kiln.stats()["graphs"] == graphs, "calling the original model compiled"
        assert _snapshot(mine) == before
        for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
            _assert_shard_close(q, p, 1e-5, f"unchanged ac={ac}: {pname}")
        del alone
        # a second kiln.compile with other options compiles with those: one graph holding
        # FSDP's gathers, run as it is by the backend (gradients equal eager FSDP's), or
        # with fsdp_graph off a graph per unit's region
        for whole in (True, False):
            seen: list = []

            def recording(gm, example_inputs, seen=seen):
                seen.append(gm)
                return gm.forward

            x, target = _batch("mlp", g)
            options = {"fsdp_graph": whole}
            for model in (eager, kiln.compile(mine, backend=recording, options=options)):
                _loss("mlp", model(x), target).backward()
            for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
                _assert_shard_close(q.grad, p.grad, 1e-6, f"grad, fsdp_graph={whole}: {pname}")
                p.grad = q.grad = None
            if whole:
                units = [n for n in seen[0].graph.nodes if "all_gather_unit" in str(n.target)]
                gathered = sum(len(n.args) - 5 for n in units)  # (n, group, dtypes, unit, *shards)
                assert len(seen) == 1 and gathered == len(list(mine.parameters())), seen
            else:
                assert len(seen) >= len(mine.blocks), f"the regions' backend saw {len(seen)}"
            assert _snapshot(mine) == before
        print(f"[rank {rank}] fsdp modules unchanged (ac={ac})", flush=True)
    _check_two_compiles(rank, world)


def _check_two_compiles(rank: int, world: int) -> None:
    """Two kiln.compile objects of one FSDP model called in turn: each keeps its own
    stand-ins, so each graph is built once (no recompile), and both train like eager."""
    from torch.distributed.device_mesh import init_device_mesh

    import kiln

    kiln.reset()
    mesh = init_device_mesh("cpu", (world,))
    eager, mine = _sharded(MLP, "none", mesh), _sharded(MLP, "none", mesh)
    first, second = kiln.compile(mine), kiln.compile(mine, options={"regional_reuse": False})
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, mine)]
    g = torch.Generator().manual_seed(200 + rank)
    for fn in (first, second, first, second):
        x, target = _batch("mlp", g)
        for model, opt in zip((eager, fn), opts):
            _loss("mlp", model(x), target).backward()
            opt.step()
            opt.zero_grad()
    for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
        _assert_shard_close(q, p, 1e-5, f"two compiles: {pname}")
    stats = _assert_counts("two compiles")
    assert stats["graphs"] == 2 and stats["recompiles"] == 0, stats


def _hf_model(kind: str, mesh, checkpointing: bool):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            max_position_embeddings=64, use_cache=False,
        )  # fmt: skip
        model = LlamaForCausalLM(cfg)
        layers = model.model.layers
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
        )  # fmt: skip
        model = GPT2LMHeadModel(cfg)
        layers = model.transformer.h
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if checkpointing:  # HF's own: each decoder layer's call under checkpoint, outside its unit
        model.gradient_checkpointing_enable({"use_reentrant": False})
    return model


# (model, optimizer, HF gradient checkpointing, where kiln.compile is applied)
HF_CASES = [
    ("llama", "adamw", False, "root"),
    ("llama", "sgd", True, "root"),
    ("gpt2", "adamw", False, "root"),
    ("llama", "sgd", True, "root regions"),
    ("llama", "sgd", True, "layers"),
    ("gpt2", "adamw", False, "layers"),
]


def _hf_layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers if hasattr(model, "model") else model.transformer.h


def check_hf(rank: int, world: int) -> None:
    """An HF LLaMA and GPT-2 (2 layers, hidden 64) under FSDP2 compiled at the root or
    per decoder layer (HF_CASES): each step issues eager's collectives in eager's order,
    after 3 steps every parameter shard equals eager FSDP2's on this rank; no break,
    fallback or eager frame (transformers' ``capture_outputs`` wrapper, whose closure
    cells a region boundary resumes, is captured too), at least one graph."""
    from torch.distributed.device_mesh import init_device_mesh

    import kiln

    mesh = init_device_mesh("cpu", (world,))
    for kind, optimizer, checkpointing, how in HF_CASES:
        kiln.reset()
        eager, mine = (_hf_model(kind, mesh, checkpointing) for _ in range(2))
        if how == "layers":  # each decoder layer compiled alone, the root eager
            layers = _hf_layers(mine)
            for k, layer in enumerate(layers):
                layers[k] = kiln.compile(layer)
            compiled = mine
        else:
            compiled = _compile(mine, how)
        # AdamW's step divides by the gradient's running size (+ eps), so an element whose
        # gradient is near 0 turns last-bit differences into up to lr per step (with
        # transformers 5.24 one embedding element of 4096 moved 2.4 steps apart): eps 1e-6
        # bounds that to lr * difference / eps; the gradients themselves are compared
        # before every step. Parameters: a tenth of one step (SGD's 1e-5)
        make, kw, atol = (
            (torch.optim.AdamW, {"lr": 1e-3, "eps": 1e-6}, 1e-4)
            if optimizer == "adamw"
            else (torch.optim.SGD, {"lr": 0.05}, 1e-5)
        )
        opts = [make(m.parameters(), **kw) for m in (eager, mine)]
        g = torch.Generator().manual_seed(100 + rank)
        what = f"fsdp hf {kind} {optimizer} checkpointing={checkpointing} at the {how}"
        what += f" on rank {rank}"
        with _CommLog(eager, mine) as comms:
            for step in range(3):
                ids = torch.randint(0, 128, (2, 16), generator=g)
                seen, grads = [], []
                for model, opt in zip((eager, compiled), opts):
                    model(ids, labels=ids).loss.backward()
                    grads.append([p.grad.to_local().clone() for p in opt.param_groups[0]["params"]])
                    opt.step()
                    opt.zero_grad()
                    seen.append(comms.take())
                _check_comms(f"{what}, step {step}", how, "default", *seen)
                for (pname, _), got, want in zip(eager.named_parameters(), *grads[::-1]):
                    _assert_shard_close(got, want, 1e-5, f"{what}, step {step}: grad of {pname}")
        for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
            _assert_shard_close(q, p, atol, f"{what}: {pname}")
        stats = _assert_counts(what)
        _assert_whole(what, mine, how, "default", stats)
        print(f"[rank {rank}] {what}: {stats}", flush=True)
