"""FSDP2 checks of one rank of test_distributed.py (called by distributed_worker.py, with
the process group set up): ``fully_shard`` per block and at the root, compiled whole
(``kiln.compile(root)``) or per block (``kiln.compile(block)`` for each block, the root
eager), with and without activation checkpointing inside the blocks, on an MLP and a
small GPT-style model. After SGD steps every parameter shard equals eager FSDP2's on this
rank; kiln built graphs, with no break, fallback or eager frame (a call of a sharded
block from its parent is a region boundary, kiln/fsdp.py, counted apart)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class MLPBlock(nn.Module):
    def __init__(self, dim: int, ac: bool) -> None:
        super().__init__()
        self.up, self.down, self.ac = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim), ac

    def body(self, x):
        return x + self.down(F.gelu(self.up(x)))

    def forward(self, x):
        return checkpoint(self.body, x, use_reentrant=False) if self.ac else self.body(x)


class MLP(nn.Module):
    def __init__(self, ac: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 64)
        self.blocks = nn.ModuleList(MLPBlock(64, ac) for _ in range(3))
        self.head = nn.Linear(64, 8)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


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
    def __init__(self, ac: bool) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(128, 64), nn.Embedding(32, 64)
        self.blocks = nn.ModuleList(GPTBlock(64, 4, ac) for _ in range(2))
        self.ln, self.head = nn.LayerNorm(64), nn.Linear(64, 128, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _sharded(model_cls, ac: bool, mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = model_cls(ac)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _loss(name: str, out, target):
    if name == "gpt":
        return F.cross_entropy(out[:, :-1].reshape(-1, 128), target[:, 1:].reshape(-1))
    return ((out - target) ** 2).mean()


def check_fsdp(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    import kiln

    mesh = init_device_mesh("cpu", (world,))
    for name, cls in (("mlp", MLP), ("gpt", GPT)):
        for ac in (False, True):
            for how in ("root", "blocks"):
                kiln.reset()
                eager, mine = _sharded(cls, ac, mesh), _sharded(cls, ac, mesh)
                if how == "root":
                    fn = kiln.compile(mine)
                else:
                    for block in mine.blocks:
                        kiln.compile(block)
                    fn = mine
                opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, mine)]
                g = torch.Generator().manual_seed(100 + rank)
                for _ in range(3):
                    if name == "gpt":
                        x = torch.randint(0, 128, (2, 16), generator=g)
                        target = x
                    else:
                        x, target = torch.randn(8, 32, generator=g), torch.randn(8, 8, generator=g)
                    for model, opt in zip((eager, fn), opts):
                        _loss(name, model(x), target).backward()
                        opt.step()
                        opt.zero_grad()
                what = f"fsdp {name} ac={ac} compiled at the {how} on rank {rank}"
                for (pname, p), q in zip(eager.named_parameters(), mine.parameters()):
                    torch.testing.assert_close(
                        q.to_local(), p.to_local(), rtol=1e-4, atol=1e-5, msg=f"{what}: {pname}"
                    )
                stats = kiln.stats()
                assert stats["graphs"] >= 1, (what, stats)
                assert stats["breaks"] == stats["fallbacks"] == stats["eager_frames"] == 0, (
                    what,
                    stats,
                )
                print(f"[rank {rank}] {what}: {stats}", flush=True)
