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
