"""Small real models for tests and benchmarks: a ResNet-style conv net and an MLP-Mixer
written here, GPT-2 and LLaMA from transformers configs with random weights."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(
            nn.Linear(tokens, tokens * 2), nn.GELU(), nn.Linear(tokens * 2, tokens)
        )
        self.channel_mlp = nn.Sequential(
            nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(
        self, image: int = 32, patch: int = 4, dim: int = 64, depth: int = 4, classes: int = 10
    ):
        super().__init__()
        tokens = (image // patch) ** 2
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(1))


def gpt2(layers: int = 2, dim: int = 64, vocab: int = 512):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=layers,
        n_embd=dim,
        n_head=4,
        vocab_size=vocab,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(cfg).eval()


def llama(layers: int = 2, dim: int = 64, vocab: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=dim,
        intermediate_size=dim * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    return LlamaForCausalLM(cfg).eval()


def logits_fn(model):
    return lambda ids: model(ids).logits


def convnext(hidden=(16, 32), depths=(1, 2)):
    """HF ConvNeXt: depthwise 7x7 conv, (N, H, W, C) LayerNorm and MLP, 2x2 patch
    convolutions between stages."""
    from transformers import ConvNextConfig, ConvNextModel

    cfg = ConvNextConfig(
        num_channels=3,
        num_stages=len(hidden),
        hidden_sizes=list(hidden),
        depths=list(depths),
        layer_scale_init_value=0.5,
    )
    return ConvNextModel(cfg)
