"""nn.Module capture: parameters lifted, submodules inlined, containers, hooks, training."""

import torch
import torch.nn.functional as F
from torch import nn

from corpus import T, case


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)
        self.act = nn.GELU()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        for layer in self.layers:
            x = x + F.relu(layer(x))
        return self.norm(x)


class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x):
        return {k: head(x) for k, head in self.heads.items()}


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.randn(4))
        self.weight = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * self.weight + self.offset


class TrainingSwitch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if self.training:
            return self.lin(x) * 2
        return self.lin(x)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.drop = nn.Dropout(0.0)

    def forward(self, ids):
        return self.drop(self.emb(ids)).mean(1)


class TiedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lin.register_forward_hook(lambda m, inp, out: out * 2)
        self.lin.register_forward_pre_hook(lambda m, inp: (inp[0] + 1,))

    def forward(self, x):
        return self.lin(x)


class Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh())

    def forward(self, x):
        return self.body(x) + self.body[0](x)


class Attention(nn.Module):
    def __init__(self, d=8, h=2):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class UsesHelperMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = 0.5

    def _project(self, x):
        return self.lin(x) * self.scale

    def forward(self, x):
        return self._project(x) + self._project(x * 2)


class ParamList(nn.Module):
    def __init__(self):
        super().__init__()
        self.ws = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(2)])

    def forward(self, x):
        for w in self.ws:
            x = x * w
        return x


def _module_case(cls, shape=(2, 4), graphs=1, breaks=0, train=False, **kw):
    torch.manual_seed(0)
    mod = cls(**kw)
    mod.train(train)

    def run(x, mod=mod):
        return mod(x)

    run.__name__ = cls.__name__
    run.__qualname__ = cls.__name__
    return case(graphs=graphs, breaks=breaks, args=lambda: (T(*shape),))(run)


def _ids():
    return (torch.randint(0, 10, (2, 5)),)


_module_case(MLP)
_module_case(Stack)
_module_case(Branches)
_module_case(WithBuffer)
_module_case(TrainingSwitch)
_module_case(TrainingSwitch, train=True)
_module_case(ConvNet, shape=(2, 3, 8, 8))
_module_case(ConvNet, shape=(2, 3, 8, 8), train=True)
_module_case(TiedWeights)
_module_case(Hooked)
_module_case(Seq)
_module_case(Attention, shape=(2, 5, 8))
_module_case(UsesHelperMethod)
_module_case(ParamList)

_EMB = Embedder().eval()


@case(args=_ids)
def embedding_module(ids):
    return _EMB(ids)


@case(args=lambda: (T(2, 4),))
def functional_linear_with_module_params(x):
    m = _LIN
    return F.linear(x, m.weight, m.bias)


_LIN = nn.Linear(4, 3)
_MLP = MLP()


@case(args=lambda: (T(2, 4, grad=True),))
def module_with_grad_input(x):
    return _MLP(x).sum()


@case(args=lambda: (T(2, 4),))
def module_under_no_grad(x):
    with torch.no_grad():
        y = _MLP(x)
    return y * 2


class KwargHooked(nn.Module):
    """Pre- and post-hooks that take keyword arguments, and a hook returning None."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lin.register_forward_pre_hook(
            lambda m, args, kwargs: ((args[0] * 2,), kwargs), with_kwargs=True
        )
        self.lin.register_forward_hook(lambda m, args, out: None)
        self.register_forward_hook(
            lambda m, args, kwargs, out: out * kwargs["scale"], with_kwargs=True
        )

    def forward(self, x, scale=1.0):
        return self.lin(x).tanh()


_KW_HOOKED = KwargHooked()


@case(args=lambda: (T(2, 4),))
def keyword_argument_hooks(x):
    return _KW_HOOKED(x, scale=3.0) + 1


class _HookLog(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.shapes = {}
        self.lin.register_forward_hook(self._record)

    def _record(self, mod, args, out):
        self.shapes["lin"] = out.shape[-1]

    def forward(self, x):
        return self.lin(x) * self.shapes.get("lin", 0)


_HOOK_LOG = _HookLog()


@case(args=lambda: (T(2, 4),))
def hook_bound_method_mutates_a_dict(x):
    return _HOOK_LOG(x), dict(_HOOK_LOG.shapes)


class _NoGradForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @torch.no_grad()
    def forward(self, x):
        return self.lin(x).relu()


_NG_FORWARD = _NoGradForward()


@case(args=lambda: (T(2, 4, grad=True),))
def no_grad_decorated_forward(x):
    y = _NG_FORWARD(x)
    return y + x, y.requires_grad


@torch.no_grad
def _bare_no_grad(x):
    return x * 2


@torch.enable_grad()
def _enable_grad_deco(x):
    return x * 3


@case(args=lambda: (T(2, 4, grad=True),))
def grad_mode_decorators_nested(x):
    a = _bare_no_grad(x)
    with torch.no_grad():
        b = _enable_grad_deco(x)
    return a, b, a.requires_grad, b.requires_grad


_REFLECT_CONV = nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")


@case(args=lambda: (T(1, 2, 6, 6),))
def reflect_padded_conv(x):  # its forward calls _pair(0): itertools.repeat with a count
    return _REFLECT_CONV(x).relu()
