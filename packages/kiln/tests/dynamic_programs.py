"""Programs whose input sizes change from call to call, as users run them: the corpus of
kiln's dynamic-shape tests (test_dynamic.py) and benchmark (benchmarks/dynamic_shapes.py).

Each ``Program`` has a callable (function or module), ``inputs(n)`` making random inputs
for size ``n`` (the sizes include odd and prime values), and whether it trains (the check
then compares gradients too)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Program:
    name: str
    make: Callable[[], Callable]  # a fresh callable (module or function)
    inputs: Callable[[int], tuple]
    sizes: tuple[int, ...] = (5, 8, 13, 17, 7, 32)
    train: bool = False
    tol: dict = field(default_factory=lambda: {"rtol": 1e-4, "atol": 1e-4})


def _pointwise(x, y):
    return (x.sin() * y + 1).relu()


def _softmax_varying(x):
    return x.softmax(-1) * 2


def _views_heads(x):
    b, t, _ = x.shape
    return x.view(b, t, 4, 16).transpose(1, 2).reshape(b * 4, t, 16).sum(-1)


def _slice_half(x):
    return x[:, : x.shape[1] // 2] * 2 + 1


def _cat(x, y):
    return torch.cat([x, y * 2], dim=1).sum(1)


def _size_as_number(x):
    return x / x.shape[-1] + x.shape[0]


def _reductions(x):
    return x.sum(-1), x.mean(1), x.var(-1), x.amax(-1)


class _Causal(torch.nn.Module):
    def __init__(self, d: int = 32, h: int = 4):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.h = h

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = (q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        return (att @ v).transpose(1, 2).reshape(b, t, d)


class _Positions(torch.nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.pos = torch.nn.Embedding(512, d)

    def forward(self, x):
        t = x.shape[1]
        return x + self.pos(torch.arange(t, device=x.device))[None]


def _decode_step(q, k_cache, v_cache, k_new, v_new):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    att = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return att.softmax(-1) @ v, k, v


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))


class _GPT2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2Model

        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=1024)
        self.m = GPT2Model(cfg).eval()

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).last_hidden_state


def _ids(n: int) -> tuple:
    return (torch.randint(0, 256, (2, n)),)


PROGRAMS: list[Program] = [
    Program("pointwise", lambda: _pointwise, lambda n: (torch.randn(3, n), torch.randn(3, n))),
    Program("softmax_varying_dim", lambda: _softmax_varying, lambda n: (torch.randn(4, n),)),
    Program("layer_norm", lambda: torch.nn.LayerNorm(32), lambda n: (torch.randn(2, n, 32),)),
    Program("mlp_varying_batch", _mlp, lambda n: (torch.randn(n, 32),)),
    Program("causal_attention", _Causal, lambda n: (torch.randn(2, n, 32),)),
    Program("split_heads", lambda: _views_heads, lambda n: (torch.randn(2, n, 64),)),
    Program("slice_half", lambda: _slice_half, lambda n: (torch.randn(3, n, 8),)),
    Program("cat", lambda: _cat, lambda n: (torch.randn(2, n, 8), torch.randn(2, n, 8))),
    Program("arange_positions", _Positions, lambda n: (torch.randn(2, n, 32),)),
    Program("size_as_number", lambda: _size_as_number, lambda n: (torch.randn(n, 6),)),
    Program("reductions", lambda: _reductions, lambda n: (torch.randn(3, n),)),
    Program(
        "conv_nhw",
        lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()),
        lambda n: (torch.randn(n % 4 + 2, 3, n, n + 3),),
    ),
    Program(
        "kv_decode_step",
        lambda: _decode_step,
        lambda n: (
            torch.randn(2, 4, 1, 16),
            torch.randn(2, 4, n, 16),
            torch.randn(2, 4, n, 16),
            torch.randn(2, 4, 1, 16),
            torch.randn(2, 4, 1, 16),
        ),
    ),
    Program(  # a bfloat16 LM head over a varying length (torch 2.11's linear read its sizes)
        "lm_head_bf16",
        lambda: torch.nn.Linear(32, 64, bias=False).to(torch.bfloat16),
        lambda n: (torch.randn(2, n, 32, dtype=torch.bfloat16),),
        tol={"rtol": 2e-2, "atol": 2e-2},
    ),
    Program("train_mlp", _mlp, lambda n: (torch.randn(n, 32, requires_grad=True),), train=True),
    Program(
        "train_attention",
        _Causal,
        lambda n: (torch.randn(2, n, 32, requires_grad=True),),
        train=True,
    ),
    Program("hf_gpt2", _GPT2, _ids, sizes=(5, 8, 13, 17, 7, 31)),
]


def loss_of(out) -> torch.Tensor:
    """A scalar from any output (for training programs' backward)."""
    leaves = out if isinstance(out, (tuple, list)) else (out,)
    return sum(
        (o.float() * torch.linspace(0.5, 1.5, o.numel()).view(o.shape)).sum()
        for o in leaves
        if isinstance(o, torch.Tensor)
    )
