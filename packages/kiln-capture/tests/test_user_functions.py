"""Calls of the user's Python functions, inlined (variables/functions.py)."""

import collections

import torch
from helpers import CountingBackend, assert_same

import kiln_capture

_X, _KW = torch.zeros(2, 2), torch.zeros(1, 2)


def _bump(x=_X, *, kw=_KW):
    x.add_(1)
    kw.add_(1)
    return x, kw


def _call_bump():
    return _bump()


def test_tensor_defaults_are_read_from_the_function():
    """A default tensor changed in place, then the defaults replaced: the compiled call
    reads them on each call, as eager does."""
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(_call_bump)
    kiln_capture.reset()
    saved = (_bump.__defaults__, _bump.__kwdefaults__)
    try:
        for i in range(4):
            x, kw = compiled() if i % 2 else _call_bump()
            assert x is _bump.__defaults__[0] and kw is _bump.__kwdefaults__["kw"]
            assert_same(x, torch.full((2, 2), i + 1.0))
        _bump.__defaults__ = (torch.ones(3, 4),)
        _bump.__kwdefaults__ = {"kw": torch.ones(1)}
        x, kw = compiled()
        assert_same((x, kw), (torch.full((3, 4), 2.0), torch.full((1,), 2.0)))
        stats = kiln_capture.stats()
        assert backend.graphs and stats["eager_frames"] == 0 and stats["breaks"] == 0, stats
    finally:
        _bump.__defaults__, _bump.__kwdefaults__ = saved


def _with_a_namedtuple_class(a, b):
    point = collections.namedtuple("point", ["x", "y", "xy"], defaults=(None, 1, None))
    made = point(a, xy=b)
    return made.x + made.xy * made.y, made._fields, type(made).__name__


def test_namedtuple_class_made_in_the_trace():
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend, fullgraph=True)(_with_a_namedtuple_class)
    a, b = torch.randn(3), torch.randn(3)
    assert_same(compiled(a, b), _with_a_namedtuple_class(a, b))
    assert len(backend.graphs) == 1
