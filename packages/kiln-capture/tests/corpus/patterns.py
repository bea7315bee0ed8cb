"""Patterns common in model code: kwargs forwarding, config objects, helper modules in
other files, optional arguments, residual blocks, masks built from shapes."""

import dataclasses
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from corpus import T, case


@dataclasses.dataclass
class Config:
    hidden: int = 4
    heads: int = 2
    eps: float = 1e-5
    act: str = "gelu"
    use_bias: bool = True


CFG = Config()


class Out(NamedTuple):
    value: torch.Tensor
    aux: torch.Tensor


def activation(name):
    return {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}[name]


def forward_kwargs(x, **kwargs):
    return inner_kwargs(x, **kwargs)


def inner_kwargs(x, scale=1.0, shift=0.0, **unused):
    return x * scale + shift


@case()
def kwargs_forwarding(x):
    return forward_kwargs(x, scale=2.0, shift=1.0, ignored="yes")


@case()
def config_object_reads(x):
    y = x * CFG.hidden + CFG.eps
    if CFG.use_bias:
        y = y + 1
    return activation(CFG.act)(y)


@case()
def dataclass_replace(x):
    cfg = dataclasses.replace(CFG, hidden=8)
    return x * cfg.hidden


@case()
def namedtuple_replace_and_fields(x):
    o = Out(x, x * 2)
    o2 = o._replace(aux=x * 3)
    return o2.value + o2.aux, Out._fields


@case()
def causal_mask_from_shape(x):
    n = x.shape[-1]
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    return x.masked_fill(mask, float("-inf")).softmax(-1)


@case(args=lambda: (T(2, 3, 8),))
def rotary_like(x):
    half = x.shape[-1] // 2
    freqs = torch.arange(half, dtype=torch.float32) / half
    angles = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@case()
def math_on_shapes(x):
    d = x.shape[-1]
    return x / math.sqrt(d) * math.log(d + 1)


@case()
def optional_tensor_argument(x, mask=None, *, temperature=1.0):
    if mask is not None:
        x = x + mask
    return (x / temperature).softmax(-1)


@case(args=lambda: (T(4, 4), T(4, 4)))
def optional_tensor_given(x, mask=None):
    if mask is not None:
        x = x + mask
    return x.softmax(-1)


@case()
def enumerate_with_start(x):
    out = x
    for i, s in enumerate([1.0, 2.0], start=1):
        out = out + i * s
    return out


@case()
def list_of_lists_flatten(x):
    groups = [[x, x * 2], [x * 3]]
    flat = [t for g in groups for t in g]
    return torch.stack(flat).sum(0)


@case()
def dict_of_functions(x):
    ops = {"a": torch.sin, "b": torch.cos}
    return sum(fn(x) for fn in ops.values())


@case()
def isinstance_tuple_of_classes(x):
    val = 3
    if isinstance(val, (float, int)) and not isinstance(val, bool):
        x = x * val
    return x


@case()
def int_float_conversions_on_python_values(x):
    n = int(x.shape[0] / 3)
    f = float(n) + 0.5
    return x * f, round(f), divmod(7, n)


class Residual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, **kw):
        return x + self.fn(x, **kw)


class FF(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x, scale=1.0):
        return self.down(F.silu(self.up(x))) * scale


_RES = nn.Sequential(Residual(FF(4)), nn.LayerNorm(4), Residual(FF(4))).eval()


@case(args=lambda: (T(2, 4),))
def residual_blocks(x):
    return _RES(x)


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.router = nn.Linear(4, 3)

    def forward(self, x):
        weights = self.router(x).softmax(-1)
        return sum(weights[:, i : i + 1] * e(x) for i, e in enumerate(self.experts))


_GATE = Gate().eval()


@case(args=lambda: (T(2, 4),))
def dense_mixture_of_experts(x):
    return _GATE(x)


@case()
def chained_comparisons_on_dims(x):
    assert 1 <= x.dim() <= 4
    return x.unsqueeze(0) if x.dim() < 3 else x


@case()
def tuple_unpack_in_for_with_dict(x):
    pairs = {"a": (1, 2), "b": (3, 4)}
    for _name, (p, q) in pairs.items():
        x = x * p + q
    return x


@case()
def namedtuple_asdict(x):
    d = Out(x, x + 1)._asdict()
    return d["value"] * d["aux"]


class Layers:
    """A container of layers with ``__len__`` and no ``__bool__`` (a transformers cache)."""

    def __init__(self, n):
        self.layers = [i + 1 for i in range(n)]

    def __len__(self):
        return len(self.layers)


class Flagged:
    def __init__(self, on):
        self.on = on

    def __bool__(self):
        return self.on


@case()
def truth_of_objects_made_in_the_trace(x):
    # Python's rule: __bool__, else __len__ != 0, else true (Whisper: `if cache and ...`)
    made = [Layers(2), Layers(0), Flagged(True), Flagged(False), Out(x, x)]
    for i, obj in enumerate(made):
        if obj:
            x = x + i
    return x
