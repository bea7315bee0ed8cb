"""Small models used by kiln-aot's tests and benchmarks."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class GeluMLP(nn.Module):
    def __init__(self, d: int = 32, hidden: int = 128):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ConvBNReLU(nn.Module):
    def __init__(self, c_in: int = 3, c: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(x))).mean(dim=(2, 3))


class Block(nn.Module):
    """A pre-norm transformer block: attention (manual, with causal mask) and a GELU MLP."""

    def __init__(self, d: int = 32, heads: int = 4, p: float = 0.1):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = GeluMLP(d, 4 * d)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        att = F.dropout(scores.softmax(-1), self.p, self.training)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return F.dropout(self.proj(y), self.p, self.training)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + F.dropout(self.mlp(self.ln2(x)), self.p, self.training)


class TinyTransformer(nn.Module):
    def __init__(
        self,
        vocab: int = 64,
        d: int = 32,
        layers: int = 1,
        heads: int = 4,
        p: float = 0.1,
        seq: int = 16,
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, p) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))
