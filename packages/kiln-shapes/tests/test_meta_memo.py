"""Symbolic meta results reused within one ShapeEnv (meta_memo.py): the second identical op
gives a result of the same symbolic metadata and aliasing without running its meta
function, and nothing is reused once the env changed."""

from __future__ import annotations

import sympy
import torch
from kiln_shapes import ShapeEnv, meta_memo
from kiln_shapes.meta import symbolic_meta


def _meta(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t._is_view())


def _layer(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """A transformer-like layer's shape work: linear, split into heads, attention scores."""
    b, s, h = x.shape
    y = torch.nn.functional.linear(x, w)
    q = y.view(b, s, 4, h // 4).transpose(1, 2)
    scores = torch.matmul(q, q.transpose(-2, -1)).softmax(-1)
    out = torch.matmul(scores, q).transpose(1, 2).reshape(b, s, h)
    return [y, q, scores, out, x + out, out.unsqueeze(0)]


def _run(env: ShapeEnv, x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    with symbolic_meta(env):
        return _layer(x, w)


def test_a_repeated_layer_is_answered_from_the_first():
    env = ShapeEnv()
    x = env.symbolic_tensor(torch.empty(2, 10, 16, device="meta"), "x", dims=[1])
    w = torch.empty(16, 16, device="meta")
    first = _run(env, x, w)
    guards = list(env.guards)
    before = meta_memo.stats()
    again = _run(env, x, w)
    after = meta_memo.stats()
    assert after["hits"] > before["hits"]
    assert [_meta(t) for t in again] == [_meta(t) for t in first]
    assert env.guards == guards  # nothing new to guard
    # each result is its own tensor, aliasing this call's input where the op's would
    assert all(a is not b for a, b in zip(again, first))
    assert again[1].untyped_storage()._cdata == again[0].untyped_storage()._cdata
    assert again[1].untyped_storage()._cdata != first[0].untyped_storage()._cdata
    assert isinstance(again[0].shape[1], torch.SymInt)


def test_nothing_is_reused_after_the_env_changed():
    env = ShapeEnv()
    x = env.symbolic_tensor(torch.empty(2, 10, 16, device="meta"), "x", dims=[1])
    w = torch.empty(16, 16, device="meta")
    _run(env, x, w)
    env.create_symbol(7, "y.size(0)")  # a new symbol: every answer is asked again
    before = meta_memo.stats()
    with symbolic_meta(env):
        torch.nn.functional.linear(x, w)
    assert meta_memo.stats()["hits"] == before["hits"]


def test_views_of_different_inputs_stay_apart():
    env = ShapeEnv()
    s = env.create_symbol(10, "n")
    a = env.meta_tensor([2, s, 16], [16 * s, 16, 1], torch.float32)
    b = env.meta_tensor([2, s, 16], [16 * s, 16, 1], torch.float32)
    with symbolic_meta(env):
        va = a.transpose(0, 1)
        before = meta_memo.stats()["hits"]
        vb = b.transpose(0, 1)  # answered from va's op: a view of b, not of a
    assert meta_memo.stats()["hits"] > before
    assert va.untyped_storage()._cdata == a.untyped_storage()._cdata
    assert vb.untyped_storage()._cdata == b.untyped_storage()._cdata
    assert _meta(va) == _meta(vb)
    assert isinstance(sympy.sympify(str(va.shape[0])), sympy.Symbol)
