"""Helpers for testing kiln-triton without a GPU, and the small models its tests and
benchmarks share.

``use_triton_for_cpu()`` routes CPU tensors to the Triton backend for the duration of a
``with`` block, so graphs of CPU tensors compile to Triton kernels that Triton's
interpreter runs (``TRITON_INTERPRET=1`` must be set before triton is imported). The
previous "cpu" backend (kiln-cpp, if imported) is restored afterwards.

``Block`` (a pre-norm transformer block) and ``SmallGPT`` (token and position embeddings,
blocks, a head) are GPT-style models written with plain torch ops, for tests and
benchmarks of whole models.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from kiln_inductor import register_backend, unregister_backend

from .backend import TritonBackend


@contextmanager
def use_triton_for_cpu() -> Iterator[TritonBackend]:
    backend = TritonBackend()
    previous = register_backend("cpu", backend)
    try:
        yield backend
    finally:
        if previous is None:
            unregister_backend("cpu")
        else:
            register_backend("cpu", previous)


class Block(nn.Module):
    """A pre-norm transformer block: matmuls go to ATen, the rest is fused."""

    def __init__(self, d: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (C // self.heads) ** -0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class SmallGPT(nn.Module):
    def __init__(self, vocab: int = 1024, d: int = 256, layers: int = 2, ctx: int = 64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, 4) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))
