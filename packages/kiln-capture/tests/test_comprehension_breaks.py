"""A graph break inside a comprehension. On 3.12 a comprehension is inlined in its frame
(PEP 709): its container and the saved value of its loop variable sit on the frame's stack
and travel to the continuation (a 3.11 comprehension is a function of its own)."""

import torch
from helpers import CountingBackend, assert_same

import kiln_capture


def _noted(v):
    print("noted", v)  # a graph break
    return v


def _list_keeps_the_outer_local(x):
    s = 5
    y = x + 1
    out = [_noted(s) * 2 for s in range(3)]
    return y + s, out


def _list_with_an_unbound_loop_name(x):
    y = x * 2
    out = [_noted(s) + 1 for s in [0, 1, 2]]  # s: a NULL saved on the stack (3.12)
    return y, out


def _dict_and_set(x):
    d = {k: _noted(k) * 3 for k in ("a", "b")}
    st = {_noted(i) % 2 for i in range(4)}
    return x - 1, d, st


def _comprehension_over_tensors(x):
    return sum([_noted(r).sum() for r in x.unbind(0)]) + x.mean()


def test_breaks_inside_comprehensions_keep_eagers_values(capsys):
    for fn in (
        _list_keeps_the_outer_local,
        _list_with_an_unbound_loop_name,
        _dict_and_set,
        _comprehension_over_tensors,
    ):
        before = kiln_capture.stats()["eager_frames"]
        opt = kiln_capture.optimize(CountingBackend())(fn)
        x = torch.randn(3, 2)
        assert_same(opt(x), fn(x))
        assert kiln_capture.stats()["eager_frames"] == before, fn.__name__
