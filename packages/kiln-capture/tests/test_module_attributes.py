"""Attribute reads on nn.Modules and objects follow Python's lookup order, and an
attribute set on the instance after capture fails the guards (variables/modules.py)."""

import types

import torch
from helpers import CountingBackend, assert_same

import kiln_capture


class _Scaled(torch.nn.Module):
    """Class methods named as the submodules and the float attribute __init__ sets."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)  # a submodule in _modules; the method below wins
        self.gate = torch.nn.Sigmoid()
        self.offset = torch.full((6,), 0.25)  # a plain tensor in __dict__: wins over the method
        self.factor = 1.5

    def proj(self, x):
        return x * 4.0 - 1.0

    def gate(self, x):
        return x.tanh()

    def offset(self):
        return torch.zeros(6)

    def factor(self):
        return 7.0

    def forward(self, x):
        return self.gate(self.proj(x + self.offset)) * self.factor


def test_class_methods_shadow_submodules_as_in_python():
    m = _Scaled()
    x = torch.randn(3, 6)
    expected = m(x)
    backend = CountingBackend()
    out = kiln_capture.optimize(backend, fullgraph=True)(m)(x)
    assert_same(out, expected)
    assert_same(out, torch.tanh((x + 0.25) * 4.0 - 1.0) * 1.5)
    assert len(backend.graphs) == 1


class _Doubler(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1


def _halve(self, x):
    return x.sin() / 2


class _Plain:
    def step(self, x):
        return x.cos()


def test_forward_set_on_the_instance_after_capture_recompiles():
    m, obj = _Doubler(), _Plain()

    def fn(x):
        return m(x) + obj.step(x)

    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(fn)
    x = torch.randn(5)
    assert_same(opt(x), fn(x))
    m.forward = types.MethodType(_halve, m)
    assert_same(opt(x), x.sin() / 2 + x.cos())
    obj.step = lambda t: t.exp()
    assert_same(opt(x), x.sin() / 2 + x.exp())
    assert len(backend.graphs) == 3
    assert kiln_capture.stats()["eager_frames"] == 0


class _Block(torch.nn.Module):
    def __init__(self, act) -> None:
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.second = torch.nn.Linear(6, 6)
        self.act = act

    def forward(self, x):
        for layer in (self.first, self.second):
            y = layer(x)
            # a module compares by identity; a function or module attribute is true
            x = y.relu() if layer == self.first else y.sigmoid()
        if self.act:
            x = self.act(x)
        return x


def test_truth_of_functions_and_identity_of_modules():
    x = torch.randn(2, 6)
    for act in (torch.nn.functional.gelu, torch.nn.Tanh(), None):
        block = _Block(act)
        backend = CountingBackend()
        assert_same(kiln_capture.optimize(backend, fullgraph=True)(block)(x), block(x))
        assert len(backend.graphs) == 1


def test_multihead_attention_without_weights_is_one_graph():
    # F.multi_head_attention_forward returns (out, None) and reads query.is_nested
    attn = torch.nn.MultiheadAttention(8, 2).eval()

    def fn(x):
        return attn(x, x, x, need_weights=False)[0] * 2

    x = torch.randn(5, 8)
    backend = CountingBackend()
    assert_same(kiln_capture.optimize(backend, fullgraph=True)(fn)(x), fn(x))
    assert len(backend.graphs) == 1


class _Reversed(torch.nn.ModuleList):
    """A ModuleList whose indexing and iteration are its own."""

    def __getitem__(self, i):
        return super().__getitem__(len(self) - 1 - i)

    def __iter__(self):
        return iter([self[i] for i in range(len(self) - 1)])  # the first layer held back


class _Indexed(torch.nn.Module):
    """A plain module indexed as ``self[i]`` through its own ``__getitem__``/``__len__``."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = _Reversed([torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Sigmoid()])

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def forward(self, x):
        for i in range(len(self)):
            x = self[i](x) * (i + 2)
        for layer in self.layers:
            x = layer(x)
        return x


def test_indexing_length_and_iteration_a_module_class_defines_are_inlined():
    m = _Indexed()
    x = torch.randn(3, 4)
    backend = CountingBackend()
    assert_same(kiln_capture.optimize(backend, fullgraph=True)(m)(x), m(x))
    assert len(backend.graphs) == 1


def test_a_container_subclass_indexing_its_own_way_is_not_read_as_a_plain_container():
    layers = _Reversed([torch.nn.Linear(4, 4), torch.nn.Tanh()])

    def fn(x):
        return layers[0](x)  # the Tanh: _Reversed counts from the end

    x = torch.randn(3, 4)
    assert_same(kiln_capture.optimize(CountingBackend())(fn)(x), x.tanh())


class _LazyHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.LazyLinear(6)
        self.head = torch.nn.LazyLinear(2)

    def forward(self, x):
        return self.head(self.body(x).relu())


def test_lazy_submodules_are_initialized_while_capturing():
    # their first call makes the parameters from the input's shape, as eager's does
    torch.manual_seed(0)
    m = _LazyHead()
    x = torch.randn(3, 5)
    backend = CountingBackend()
    out = kiln_capture.optimize(backend, fullgraph=True)(m)(x)
    assert isinstance(m.body, torch.nn.Linear) and not isinstance(m.body, torch.nn.LazyLinear)
    assert m.body.weight.shape == (6, 5) and m.head.weight.shape == (2, 6)
    assert_same(out, m(x))
    assert len(backend.graphs) == 1
