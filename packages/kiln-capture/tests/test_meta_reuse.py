"""meta_reuse.py: meta results reused within a capture. The captured graph (its code and
every node's metadata) is the one a capture without reuse makes, the repeated layers'
ops reuse results, and what must alias, require grad or differ by a literal's type is
evaluated again."""

from __future__ import annotations

import pytest
import torch
from helpers import CountingBackend, assert_same
from torch import nn

import kiln_capture
from kiln_capture import meta_reuse, output
from kiln_capture.config import config


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        h = self.norm(self.fc(x))
        v = h.view(2, 4, 8).transpose(1, 2)  # views: evaluated each time
        d = h.detach()  # shares its input's storage: evaluated each time
        return x + torch.nn.functional.gelu(h) * 0.5 + v.sum() + d.mean()


class Stack(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _describe(val):
    if isinstance(val, torch.Tensor):
        base = val._base
        return (
            tuple(val.shape),
            val.stride(),
            val.storage_offset(),
            val.dtype,
            val.requires_grad,
            val._is_view(),
            None if base is None else (tuple(base.shape), base.dtype),
        )
    if isinstance(val, tuple | list):
        return tuple(_describe(v) for v in val)
    return val


def _capture(fn, *args, reuse: bool, monkeypatch):
    hits = []
    with monkeypatch.context() as m:
        m.setattr(config, "capture_frames", False)  # each capture traces (no kept one)
        if not reuse:
            m.setattr(meta_reuse.MetaResults, "get", lambda self, key: None)
        original = output.OutputGraph.__init__

        def init(self, *a, **k):
            original(self, *a, **k)
            hits.append(self.meta_results)

        m.setattr(output.OutputGraph, "__init__", init)
        kiln_capture.reset()
        backend = CountingBackend()
        out = kiln_capture.optimize(backend)(fn)(*args)
    assert len(backend.graphs) == 1 and kiln_capture.stats()["breaks"] == 0
    (gm,) = backend.graphs
    metas = [(n.name, _describe(n.meta.get("val"))) for n in gm.graph.nodes]
    return out, gm.code, metas, sum(r.hits for r in hits)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_the_graph_is_the_one_without_reuse(monkeypatch, grad):
    torch.manual_seed(0)
    model = Stack(4)
    x = torch.randn(8, 8)
    with torch.set_grad_enabled(grad):
        out, code, metas, hits = _capture(model, x, reuse=True, monkeypatch=monkeypatch)
        ref_out, ref_code, ref_metas, _ = _capture(model, x, reuse=False, monkeypatch=monkeypatch)
        expected = model(x)
    assert code == ref_code and metas == ref_metas
    assert_same(out, expected)
    assert_same(ref_out, expected)
    if grad:  # every layer's results require grad (parameters): none is reused
        assert hits < 10
    else:  # layers 2..4 reuse what layer 1 evaluated, views and detach() aside
        assert hits >= 3 * 8


def test_views_and_aliases_are_evaluated_again(monkeypatch):
    def fn(x):
        a = x.t()
        b = x.t()  # the same op and arguments: a view of x, not of the first result
        c = x.detach()
        e = x.detach()
        return a + 1, b * 2, c, e

    x = torch.randn(3, 5)
    _, _, metas, hits = _capture(fn, x, reuse=True, monkeypatch=monkeypatch)
    by_name = dict(metas)
    assert by_name["t"][5] and by_name["t_1"][5]  # both views of x's value
    assert hits == 0


def test_literal_types_are_kept_apart(monkeypatch):
    def fn(x):
        return x * 1, x * 1.0, x * True, x * 1, torch.full((2,), 0.0), torch.full((2,), 0)

    x = torch.arange(6).reshape(2, 3)
    out, _, metas, hits = _capture(fn, x, reuse=True, monkeypatch=monkeypatch)
    want = [torch.int64, torch.float32, torch.int64, torch.int64, torch.float32, torch.int64]
    dtypes = [m[3] for _, m in metas if isinstance(m, tuple) and len(m) == 7]
    assert dtypes[-6:] == want
    assert [o.dtype for o in out] == want
    assert_same(out, fn(x))
    assert hits == 1  # the second ``x * 1`` only


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_a_user_function_op_is_never_reused(monkeypatch):
    def fn(x):
        return Double.apply(x) + Double.apply(x)

    x = torch.randn(4, requires_grad=True)  # a gradient to compute: apply is a graph call
    out, _, _, hits = _capture(fn, x, reuse=True, monkeypatch=monkeypatch)
    assert_same(out, fn(x))
    assert hits == 0  # the user's forward runs in each call's trace
    assert meta_reuse.reusable_target("call_function", torch.add)
    assert not meta_reuse.reusable_target("call_function", Double.apply)
