"""The model suite: name -> builder of (model, example inputs), random weights, no downloads.

Sources: HF transformers models built from configs, timm models with
``pretrained=False`` (where timm is installed: the H200, not the CPU machine, whose
torch has no matching torchvision), and in-repo models. Each builder takes the device,
dtype and size and returns ``(module, args)`` (a tuple, or a dict of keyword arguments); sizes are small enough for a 2-core CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Builder = Callable[[str, torch.dtype, str], tuple[nn.Module, tuple]]
ZOO: dict[str, tuple[str, Builder]] = {}  # name -> (source, builder)


def build_model(name: str, device: str, dtype_name: str, size: str):
    """``(source, model, args)`` of a zoo model, or ``(source, None, reason)`` when what it
    needs is not installed (timm on the CPU machine)."""
    source, build = ZOO[name]
    try:
        model_, args = build(device, getattr(torch, dtype_name), size)
    except ImportError as e:
        return source, None, str(e)
    return source, model_, args


def model(name: str, source: str):
    def register(builder: Builder) -> Builder:
        ZOO[name] = (source, builder)
        return builder

    return register


def _hf(config, cls_name: str, device: str, dtype: torch.dtype) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    m = getattr(transformers, cls_name)(config)
    return m.to(device=device, dtype=dtype)


def _ids(batch: int, seq: int, vocab: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def _image(batch: int, size: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, 3, size, size, generator=g).to(device=device, dtype=dtype)


# -- HF transformers ---------------------------------------------------------------------

_NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


@model("gpt2", "transformers")
def gpt2(device, dtype, size):
    from transformers import GPT2Config

    big = size == "large"
    cfg = GPT2Config(
        n_layer=12 if big else 4,
        n_embd=768 if big else 256,
        n_head=12 if big else 4,
        vocab_size=50257 if big else 8192,
        use_cache=False,
        **_NO_DROPOUT,
    )
    return _hf(cfg, "GPT2LMHeadModel", device, dtype), (_ids(2, 128, cfg.vocab_size, device),)


@model("bert", "transformers")
def bert(device, dtype, size):
    from transformers import BertConfig

    big = size == "large"
    cfg = BertConfig(
        num_hidden_layers=12 if big else 4,
        hidden_size=768 if big else 256,
        num_attention_heads=12 if big else 4,
        intermediate_size=3072 if big else 1024,
        vocab_size=30522 if big else 8192,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return _hf(cfg, "BertModel", device, dtype), (_ids(2, 128, cfg.vocab_size, device),)


@model("llama", "transformers")
def llama(device, dtype, size):
    from transformers import LlamaConfig

    big = size == "large"
    cfg = LlamaConfig(
        num_hidden_layers=8 if big else 4,
        hidden_size=1024 if big else 256,
        num_attention_heads=16 if big else 4,
        num_key_value_heads=8 if big else 2,
        intermediate_size=2816 if big else 688,
        vocab_size=32000 if big else 8192,
        use_cache=False,
    )
    return _hf(cfg, "LlamaForCausalLM", device, dtype), (_ids(2, 128, cfg.vocab_size, device),)


@model("t5", "transformers")
def t5(device, dtype, size):
    from transformers import T5Config

    big = size == "large"
    cfg = T5Config(
        num_layers=6 if big else 2,
        num_decoder_layers=6 if big else 2,
        d_model=512 if big else 256,
        d_ff=2048 if big else 1024,
        num_heads=8 if big else 4,
        vocab_size=32128 if big else 8192,
        dropout_rate=0.0,
        use_cache=False,
    )
    ids = _ids(2, 64, cfg.vocab_size, device)
    return _hf(cfg, "T5Model", device, dtype), {"input_ids": ids, "decoder_input_ids": ids}


@model("hf_resnet", "transformers")
def hf_resnet(device, dtype, size):
    from transformers import ResNetConfig

    cfg = ResNetConfig() if size == "large" else ResNetConfig(depths=[1, 1, 1, 1])
    return _hf(cfg, "ResNetModel", device, dtype), (_image(2, 128, device, dtype),)


@model("hf_convnext", "transformers")
def hf_convnext(device, dtype, size):
    from transformers import ConvNextConfig

    cfg = ConvNextConfig() if size == "large" else ConvNextConfig(depths=[1, 1, 2, 1])
    return _hf(cfg, "ConvNextModel", device, dtype), (_image(2, 128, device, dtype),)


@model("hf_vit", "transformers")
def hf_vit(device, dtype, size):
    from transformers import ViTConfig

    big = size == "large"
    cfg = ViTConfig(
        num_hidden_layers=12 if big else 4,
        hidden_size=768 if big else 256,
        num_attention_heads=12 if big else 4,
        intermediate_size=3072 if big else 1024,
        image_size=224 if big else 128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return _hf(cfg, "ViTModel", device, dtype), (_image(2, cfg.image_size, device, dtype),)


# -- timm (pretrained=False) -------------------------------------------------------------


def _timm(name: str, device, dtype, image: int):
    import timm

    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False).to(device=device, dtype=dtype)
    return m, (_image(2, image, device, dtype),)


for _name in (
    "resnet50",
    "convnext_tiny",
    "vit_small_patch16_224",
    "efficientnet_b0",
    "mixer_b16_224",
    "regnety_016",
    "mobilenetv3_large_100",
    "swin_tiny_patch4_window7_224",
):
    model(f"timm_{_name}", "timm")(
        lambda device, dtype, size, _n=_name: _timm(_n, device, dtype, 224)
    )


# -- in-repo models ------------------------------------------------------------------------


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(
            nn.Linear(tokens, tokens * 2), nn.GELU(), nn.Linear(tokens * 2, tokens)
        )
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(
            nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim)
        )

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, image=64, patch=8, dim=256, depth=4, classes=100):
        super().__init__()
        tokens = (image // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


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

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class SmallResNet(nn.Module):
    def __init__(self, widths=(32, 64, 128, 256), classes=100):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(
            torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1)
        )


@model("mlp_mixer", "in-repo")
def mlp_mixer(device, dtype, size):
    torch.manual_seed(0)
    m = MLPMixer(image=224 if size == "large" else 64).to(device=device, dtype=dtype)
    return m, (_image(4, 224 if size == "large" else 64, device, dtype),)


@model("resnet_small", "in-repo")
def resnet_small(device, dtype, size):
    torch.manual_seed(0)
    return SmallResNet().to(device=device, dtype=dtype), (_image(4, 64, device, dtype),)


@model("gelu_mlp", "in-repo")
def gelu_mlp(device, dtype, size):
    torch.manual_seed(0)
    width = 4096 if size == "large" else 1024
    m = nn.Sequential(
        nn.Linear(width, width * 4), nn.GELU(), nn.Linear(width * 4, width), nn.LayerNorm(width)
    ).to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    return m, (torch.randn(64, width, generator=g).to(device=device, dtype=dtype),)
