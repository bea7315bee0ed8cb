"""One rank of test_distributed.py: ``python distributed_worker.py RANK WORLD INIT DEBUG SUITES``
(a script, so that each rank is a fresh process that imports nothing from the tests).
SUITES is a comma-separated list of ``collectives``, ``ddp``, ``ddp_accumulate``, ``fsdp``,
``fsdp_overlap`` (also part of ``fsdp``),
``fsdp_options``, ``fsdp_memory``, ``fsdp_unchanged``, ``fsdp_hf``, ``train_step`` (fsdp_worker.py holds the FSDP2 ones)."""

from __future__ import annotations

import logging
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

    def explicit_waits(x, w):
        # the older names, each result waited on explicitly (wait_tensor is a graph node)
        r = fc.wait_tensor(fc.all_reduce(x @ w, "sum", group))
        g = fc.wait_tensor(fc.all_gather_tensor(r.tanh(), 0, group))
        s = fc.reduce_scatter_tensor(g * 3, "sum", 0, group)
        return fc.wait_tensor(s) + 1, g.mean()

    def all_to_all_splits(x):
        sizes = [1] * dist.get_world_size(group)
        return fc.all_to_all_single(x.sin(), sizes, sizes, group) * 2

    def avg_and_max(x):
        return fc.all_reduce(x, "avg", group) + fc.all_reduce(x.cos(), "max", group)

    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    ranks = list(range(dist.get_world_size()))

    def other_groups(x):
        # the group as a 1-D DeviceMesh, a (mesh, dim) pair and a list of ranks
        a = fc.all_reduce(x * 2, "sum", mesh)
        b = fc.all_gather_tensor(x.sin(), 0, (mesh, 0))
        return a - 1, b * 3, fc.all_reduce(x.exp(), "max", ranks)

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
        "explicit_waits": (
            explicit_waits,
            lambda g: (torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)),
        ),
        "all_to_all_splits": (
            all_to_all_splits,
            lambda g: (torch.randn(dist.get_world_size(), 3, generator=g),),
        ),
        "avg_and_max": (avg_and_max, lambda g: (torch.randn(5, generator=g),)),
        "other_groups": (other_groups, lambda g: (torch.randn(5, 2, generator=g),)),
    }


def main(rank: int, world: int, init: str, debug: str, suites: list[str]) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        if "collectives" in suites:
            _check_collectives(rank, debug)
            _check_collective_grads(rank)
        if "ddp" in suites:
            for name, make_model in _models().items():
                _check_ddp(name, make_model, rank)
            _check_ddp_default_buckets(rank)
        if "ddp_accumulate" in suites:
            for name in ("mlp", "hf_gpt2"):
                for sync in ("no_sync", "every"):
                    _check_ddp_accumulation(name, _models()[name], rank, sync)
        if "train_step" in suites:
            for kind in ("ddp", "fsdp"):
                for nested in (False, True):
                    _check_train_step(kind, rank, world, nested)
        import fsdp_worker

        if "fsdp" in suites:
            fsdp_worker.check_fsdp(rank, world)
        if "fsdp" in suites or "fsdp_overlap" in suites:
            fsdp_worker.check_fsdp_overlap(rank, world, debug)
        if "fsdp_memory" in suites:
            fsdp_worker.check_fsdp_memory(rank, world)
        if "fsdp_options" in suites:
            fsdp_worker.check_fsdp_options(rank, world)
        if "fsdp_unchanged" in suites:
            fsdp_worker.check_unchanged(rank, world)
        if "fsdp_hf" in suites:
            fsdp_worker.check_hf(rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _training_programs():
    """Collectives with autograd inside a training graph: the loss's gradient flows back
    through them (an all-gather's backward is a reduce-scatter, and so on)."""
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    gather = getattr(fc, "all_gather_single_autograd", fc.all_gather_tensor_autograd)
    scatter = getattr(fc, "reduce_scatter_single_autograd", fc.reduce_scatter_tensor_autograd)

    def gathered(x, w):
        g = gather((x @ w).tanh(), 0, group)
        return (g * g).sum()

    def scattered(x, w):
        return scatter((x @ w).sin(), "sum", 0, group).square().sum()

    def exchanged(x, w):
        return (fc.all_to_all_single_autograd((x @ w).cos(), None, None, group) * 3).sum()

    return {"gathered": gathered, "scattered": scattered, "exchanged": exchanged}


def _check_collective_grads(rank: int) -> None:
    """Each training program: one graph, no break, fallback or eager frame, and the
    weight's gradient equal to eager's on this rank, two steps."""
    import kiln

    for name, fn in _training_programs().items():
        kiln.reset()
        compiled = kiln.compile(fn)
        g = torch.Generator().manual_seed(20 * rank + 3)
        for _ in range(2):
            x, w = torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)
            w_eager, w_kiln = (w.clone().requires_grad_() for _ in range(2))
            fn(x, w_eager).backward()
            compiled(x, w_kiln).backward()
            torch.testing.assert_close(w_kiln.grad, w_eager.grad, msg=f"{name} on rank {rank}")
        stats = kiln.stats()
        assert stats["graphs"] == 1, (name, stats)
        assert stats["breaks"] == stats["fallbacks"] == stats["eager_frames"] == 0, stats


def _check_collectives(rank: int, debug: str) -> None:
    """Each program compiles to one graph with no break, fallback or eager frame, and
    returns eager's values on this rank."""
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


def _models():
    def mlp():
        layers = [m for _ in range(4) for m in (torch.nn.Linear(64, 64), torch.nn.GELU())]
        return torch.nn.Sequential(*layers, torch.nn.Linear(64, 8))

    def gpt2():
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
        )  # fmt: skip
        return GPT2LMHeadModel(cfg)

    class Checkpointed(torch.nn.Module):
        """The MLP's layers in pairs, each pair under activation checkpointing."""

        def __init__(self) -> None:
            super().__init__()
            layers = list(mlp())
            pairs = [torch.nn.Sequential(*layers[k : k + 2]) for k in range(0, 8, 2)]
            self.pairs, self.head = torch.nn.ModuleList(pairs), layers[-1]

        def forward(self, x):
            from torch.utils.checkpoint import checkpoint

            for pair in self.pairs:
                x = checkpoint(pair, x, use_reentrant=False)
            return self.head(x)

    class WrappedPairs(Checkpointed):
        """The same pairs under checkpoint_wrapper (torch.distributed's module wrapper)."""

        def __init__(self) -> None:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                checkpoint_wrapper,
            )

            super().__init__()
            self.pairs = torch.nn.ModuleList(checkpoint_wrapper(p) for p in self.pairs)

        def forward(self, x):
            for pair in self.pairs:
                x = pair(x)
            return self.head(x)

    def gpt2_checkpointed():
        model = gpt2()  # HF's own activation checkpointing around each block
        model.gradient_checkpointing_enable({"use_reentrant": False})
        return model

    return {
        "mlp": mlp,
        "mlp_checkpointed": Checkpointed,
        "mlp_checkpoint_wrapper": WrappedPairs,
        "hf_gpt2": gpt2,
        "hf_gpt2_checkpointed": gpt2_checkpointed,
    }


def _ddp_pair(make_model, **ddp_options):
    """Two DDP models from one seed (small buckets: several pieces per graph), the second
    compiled by kiln: (eager, wrapped model, compiled)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import kiln

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(DDP(make_model(), bucket_cap_mb=0.02, **ddp_options))
    eager, mine = models
    return eager, mine, kiln.compile(mine)


def _ddp_batch(name: str, g: torch.Generator):
    if name.startswith("hf_gpt2"):
        ids = torch.randint(0, 128, (2, 16), generator=g)
        return (ids,), ids
    return (torch.randn(16, 64, generator=g),), torch.randn(16, 8, generator=g)


def _ddp_loss(name: str, model, args, target):
    out = model(*args)
    if name.startswith("hf_gpt2"):
        logits = out.logits[:, :-1].reshape(-1, 128)
        return torch.nn.functional.cross_entropy(logits, target[:, 1:].reshape(-1))
    return ((out - target) ** 2).mean()


def _assert_ddp_counts(what: str) -> dict:
    import kiln
    import kiln.distributed

    stats = kiln.stats()
    assert stats["graphs"] >= 1, (what, stats)
    assert stats["breaks"] == stats["fallbacks"] == stats["eager_frames"] == 0, (what, stats)
    splits = kiln.distributed.SPLITS
    assert splits and min(splits) >= 2, (what, splits)
    return stats


def _check_ddp_accumulation(name: str, make_model, rank: int, sync: str) -> None:
    """Gradient accumulation: 3 optimizer steps of 3 micro-batches each (loss / 3), the
    first two micro-batches under ``no_sync()`` (``sync="no_sync"``: local gradients,
    one all-reduce of the sum on the last) or all synchronized (``"every"``). After each
    micro-batch's backward every gradient equals eager DDP's on this rank (under
    ``no_sync`` they are this rank's own, unreduced), and after the steps every
    parameter does; with gradient_as_bucket_view (gradients living in DDP's buckets)."""
    import contextlib

    import kiln

    kiln.reset()
    eager, mine, compiled = _ddp_pair(make_model, gradient_as_bucket_view=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, mine)]
    g = torch.Generator().manual_seed(300 + rank)
    what = f"ddp accumulation {name} sync={sync} on rank {rank}"
    for step in range(3):
        for micro in range(3):
            args, target = _ddp_batch(name, g)
            for model, fn in ((eager, eager), (mine, compiled)):
                local = sync == "no_sync" and micro < 2
                with model.no_sync() if local else contextlib.nullcontext():
                    (_ddp_loss(name, fn, args, target) / 3).backward()
            for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
                where = f"{what}: grad of {pname}, step {step} micro {micro}"
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=where)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=f"{what}: {pname}")
    print(f"[rank {rank}] {what}: {_assert_ddp_counts(what)}", flush=True)


def _check_ddp(name: str, make_model, rank: int) -> None:
    """``kiln.compile(DDP(model))`` with small buckets: the graph is split into several
    pieces (one per bucket), and after SGD steps (the last two accumulated under
    ``no_sync()`` then synchronized) every parameter equals eager DDP's on this rank."""
    import kiln

    kiln.reset()
    eager, mine, compiled = _ddp_pair(make_model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, mine)]
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(4):
        args, target = _ddp_batch(name, g)
        for model, fn, opt in zip((eager, mine), (eager, compiled), opts):
            if step == 2:  # accumulate locally, then synchronize on the next step
                with model.no_sync():
                    _ddp_loss(name, fn, args, target).backward()
                continue
            _ddp_loss(name, fn, args, target).backward()
            opt.step()
            opt.zero_grad()
    for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=f"{name}: {pname}")
    _assert_ddp_counts(f"ddp {name} on rank {rank}")


def _check_ddp_default_buckets(rank: int) -> None:
    """DDP with its default bucket sizes (``bucket_cap_mb`` left out: a first bucket of
    1 MiB, then 25 MiB) on a 1.6 MB MLP: kiln splits the graph as DDP's buckets are sized
    (kiln.distributed.bucket_caps), so DDP's Reducer, rebuilding its buckets from the order
    the compiled pieces produce gradients, makes as many buckets as eager DDP (the first
    starting its all-reduce before the backward's last piece) with sizes within one
    parameter of eager's; parameters equal eager DDP's."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import kiln
    import kiln.distributed

    def mlp():
        layers = [m for _ in range(6) for m in (torch.nn.Linear(256, 256), torch.nn.GELU())]
        return torch.nn.Sequential(*layers, torch.nn.Linear(256, 8))

    kiln.reset()
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(DDP(mlp()))
    eager, mine = models
    compiled = kiln.compile(mine)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    g = torch.Generator().manual_seed(300 + rank)
    for _ in range(3):
        x, target = torch.randn(16, 256, generator=g), torch.randn(16, 8, generator=g)
        for fn, opt in zip((eager, compiled), opts):
            ((fn(x) - target) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=f"default buckets: {pname}")
    sizes = [
        [int(b) for b in m._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(",")]
        for m in models
    ]
    largest = max(p.numel() * p.element_size() for p in mine.parameters())
    what = f"ddp default buckets on rank {rank}: eager {sizes[0]}, kiln {sizes[1]}"
    assert len(sizes[0]) == len(sizes[1]) >= 2, what
    assert all(abs(a - b) <= largest for a, b in zip(*sizes)), what
    assert kiln.distributed.SPLITS == [len(sizes[0])], (what, kiln.distributed.SPLITS)
    _assert_ddp_counts(what)
    print(f"[rank {rank}] {what}, pieces {kiln.distributed.SPLITS}", flush=True)


# Graph breaks a compiled training step under DDP / FSDP2 takes, by (id, what), with why.
# Each is kiln-capture's; the step stays right (eager's parameters), the parts run eagerly.
KNOWN_STEP_BREAKS = {
    ("B003", "Tensor.backward()"): "loss.backward() in a compiled function is a break by "
    "design, as under torch.compile without compiled autograd",
    ("B009", "Module(DistributedDataParallel) as an argument"): "DDP.forward is torch code "
    "kiln-capture records as a call, not inlined (torch.compile skips it too): DDP's own "
    "Python runs as it is, and the wrapped module's forward inside it is a captured frame "
    "of its own, split at DDP's buckets (kiln.distributed.split_inside_ddp)",
    ("B009", "Object(FSDPState) as an argument"): "FSDP2's forward hooks are traced as "
    "calls taking FSDP's state (a compiled function calling the FSDP model, plain or "
    "kiln-compiled, whose original module is traced inline); the call then runs as it "
    "is: FSDP's hooks eagerly, or kiln.compile(fsdp_model)'s one graph with FSDP's "
    "collectives in it (kiln/fsdp_graph.py)",
    ("B009", "operator eq on Object(DeviceMesh)"): "a DeviceMesh comparison in FSDP's code",
    ("B009", "tensor subclass DTensor"): "the optimizer over FSDP2's DTensor parameters "
    "(zero_grad, step): kiln-capture does not model DTensor",
    ("B005", "torch function __post_init__"): "a dataclass of torch.distributed (DTensor's "
    "specs, made by the eager DTensor ops of SGD's momentum): its generated __init__ (file "
    "<string>, not known as torch's) is captured as a frame of its own and breaks at the "
    "class's __post_init__",
}


class _Breaks(logging.Handler):
    """The graph breaks kiln-capture reports (its ``breaks`` log topic, debug level when
    the topic is off), region boundaries left out."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        topic = getattr(record, "topic", None) or (record.args or ("",))[0]
        if topic == "breaks" and "region boundary" not in message.split("\n")[0]:
            self.seen.append(message.removeprefix("[breaks] "))

    def __enter__(self) -> _Breaks:
        self.logger = logging.getLogger("kiln_capture")
        self.level = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)


def _check_train_step(kind: str, rank: int, world: int, nested: bool) -> None:
    """``kiln.compile`` of a whole training step (``zero_grad``, forward, ``backward``,
    ``opt.step``) of an MLP under DDP (``kind="ddp"``) or FSDP2 (``fully_shard`` per block
    and at the root), the step calling the wrapped model or (``nested``) the model
    compiled on its own (``kiln.compile(ddp_model)``: its call runs its graphs, split at
    buckets, or its units' regions): each step's loss and, after 4 steps, every parameter
    (shard) equal eager's on this rank; graphs built, no fallback or eager frame, every
    graph break one of KNOWN_STEP_BREAKS (the backward's among them)."""
    import fsdp_worker

    import kiln
    import kiln.distributed
    import kiln.fsdp_graph

    kiln.reset()
    if kind == "ddp":
        eager, mine, _ = _ddp_pair(_models()["mlp"])

        def loss(model, x, target):
            return _ddp_loss("mlp", model, (x,), target)
    else:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
        eager, mine = (fsdp_worker._sharded(fsdp_worker.MLP, "none", mesh) for _ in range(2))

        def loss(model, x, target):
            return fsdp_worker._loss("mlp", model(x), target)

    def training_step(model, opt):
        def step(x, target):
            opt.zero_grad()
            value = loss(model, x, target)
            value.backward()
            opt.step()
            return value.detach()

        return step

    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, mine)]
    called = kiln.compile(mine) if nested else mine
    steps = [training_step(eager, opts[0]), kiln.compile(training_step(called, opts[1]))]
    g = torch.Generator().manual_seed(400 + rank)
    what = f"compiled training step under {kind} (model compiled too: {nested}) on rank {rank}"
    with _Breaks() as breaks:
        for k in range(4):
            if kind == "ddp":
                x, target = torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)
            else:
                x, target = fsdp_worker._batch("mlp", g)
            want, got = (step(x, target) for step in steps)
            torch.testing.assert_close(got, want, msg=f"{what}: loss of step {k}")
    for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
        fsdp_worker._assert_shard_close(q, p, 1e-5, f"{what}: {pname}")
    stats = kiln.stats()
    assert stats["graphs"] >= 1, (what, stats)
    assert stats["fallbacks"] == stats["eager_frames"] == 0, (what, stats)
    heads = [b.split("\n")[0] for b in breaks.seen]
    unknown = [
        b
        for b, h in zip(breaks.seen, heads)
        if not any(i in h and t in h for i, t in KNOWN_STEP_BREAKS)
    ]
    assert not unknown, f"{what}: breaks not in KNOWN_STEP_BREAKS:\n" + "\n".join(unknown)
    assert any("Tensor.backward()" in h for h in heads), (what, heads)
    if kind == "ddp":  # the model's graph, split at buckets, ran in the step (the model
        # called plain: its graph captured inside DDP's forward, kiln.split_inside_ddp)
        assert kiln.distributed.SPLITS and min(kiln.distributed.SPLITS) >= 2, what
    if nested and kind == "fsdp":  # the model's one graph, FSDP's gathers in it, ran
        assert kiln.fsdp_graph.GATHERED == [len(list(mine.parameters()))], what
    print(f"[rank {rank}] {what}: {stats}, breaks {sorted(set(heads))}", flush=True)


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
    rank, world, init, debug, suites = sys.argv[1:6]
    main(int(rank), int(world), init, debug, suites.split(","))
