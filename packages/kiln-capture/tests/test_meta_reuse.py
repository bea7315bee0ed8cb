"""meta_reuse.py: meta results reused within a capture. The captured graph (its code and
every node's metadata) is the one a capture without reuse makes, the repeated layers'
ops reuse results, and what must alias, require grad or differ by a literal's type is
evaluated again; a view or an argument returned is reused aliasing the next call's
argument."""

from __future__ import annotations

import operator

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


def _storage_of(gm, name):
    node = next(n for n in gm.graph.nodes if n.name == name)
    return node.meta["val"].untyped_storage()._cdata


def test_views_and_aliases_alias_the_next_calls_arguments(monkeypatch):
    def fn(x, y):
        a = x.t()
        b = y.t()  # the same op on the same metadata: a view of y, not of a's x
        c = x.detach()
        e = y.detach()  # shares its input's storage and is no view: evaluated again
        f = torch.nn.functional.dropout(x, 0.5, training=False)  # x itself
        g = torch.nn.functional.dropout(y, 0.5, training=False)  # y itself
        return a + 1, b * 2, c, e, f + g

    x, y = torch.randn(3, 5), torch.randn(3, 5)
    backend = CountingBackend()
    with monkeypatch.context() as m:
        m.setattr(config, "capture_frames", False)
        kiln_capture.reset()
        out = kiln_capture.optimize(backend)(fn)(x, y)
    assert_same(out, fn(x, y))
    (gm,) = backend.graphs
    _, _, metas, hits = _capture(fn, x, y, reuse=True, monkeypatch=monkeypatch)
    by_name = dict(metas)
    assert by_name["t"][5] and by_name["t_1"][5]  # both views
    names = [n.name for n in gm.graph.nodes]
    x_in, y_in = names[0], names[1]
    assert _storage_of(gm, "t") == _storage_of(gm, x_in)
    assert _storage_of(gm, "t_1") == _storage_of(gm, y_in) != _storage_of(gm, x_in)
    g = next(n for n in gm.graph.nodes if n.name == "dropout_1")
    assert g.meta["val"] is g.args[0].meta["val"]  # the argument itself, as the kernel gives
    assert hits == 2  # y.t() and the second dropout; not detach()


def test_in_place_ops_are_evaluated_again(monkeypatch):
    def fn(x, y):
        a = x.t()
        a.mul_(2)
        b = y.t()
        b.mul_(2)
        x.unsqueeze_(0)
        y.unsqueeze_(0)  # changes y's metadata: never reused
        x += 1
        y += 1
        return a + b, x.shape, y.shape

    _, _, metas, hits = _capture(
        fn, torch.randn(3, 5), torch.randn(3, 5), reuse=True, monkeypatch=monkeypatch
    )
    shapes = [m[0] for name, m in metas if name.startswith("unsqueeze_")]
    assert shapes == [(1, 3, 5), (1, 3, 5)]
    assert hits == 1  # y.t() only
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    out = kiln_capture.optimize(CountingBackend())(fn)(x.clone(), y.clone())
    assert_same(out, fn(x.clone(), y.clone()))


def test_in_place_is_known_by_name_keyword_and_schema():
    assert meta_reuse._in_place("call_method", "add_", {})
    assert meta_reuse._in_place("call_method", "__iadd__", {})
    assert meta_reuse._in_place("call_function", operator.iadd, {})
    assert meta_reuse._in_place("call_function", torch.relu_, {})
    assert meta_reuse._in_place("call_function", torch.nn.functional.relu, {"inplace": True})
    assert meta_reuse._in_place("call_function", torch.add, {"out": None})
    assert meta_reuse._in_place("call_function", torch.ops.aten.add_.Tensor, {})
    assert not meta_reuse._in_place("call_function", torch.ops.aten.add.Tensor, {})
    assert not meta_reuse._in_place("call_function", operator.add, {})
    assert not meta_reuse._in_place("call_method", "transpose", {})
    assert not meta_reuse._in_place("call_method", "__getitem__", {})


def test_a_linear_result_is_a_view_of_a_new_base(monkeypatch):
    lin = nn.Linear(8, 8)

    def fn(x, y):
        return lin(x), lin(y)

    x, y = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    with torch.no_grad():
        out, _, metas, hits = _capture(fn, x, y, reuse=True, monkeypatch=monkeypatch)
        _, _, ref_metas, _ = _capture(fn, x, y, reuse=False, monkeypatch=monkeypatch)
        assert_same(out, fn(x, y))
    assert metas == ref_metas and hits == 1


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
