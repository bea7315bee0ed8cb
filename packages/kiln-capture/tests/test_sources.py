"""Sources print and hash as their parts do, each made once per source."""

import pickle

from kiln_capture.sources import AttrSource, DictEntrySource, ItemSource, LocalSource


def _layer(i: str) -> AttrSource:
    base = DictEntrySource(DictEntrySource(LocalSource("self"), "_modules", "h"), "_modules", i)
    return AttrSource(base, "eps")


def test_equal_sources_hash_alike_and_print_once():
    a, b, c = _layer("0"), _layer("0"), _layer("1")
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != c and c not in {a}
    assert a.expr() == "self._modules['h']._modules['0'].eps"
    assert a.__dict__["_expr"] is a.expr()  # made once
    assert ItemSource(a, 1) == ItemSource(a, 1) and ItemSource(a, 1) != ItemSource(a, "1")


def test_cached_text_and_hash_are_not_pickled():
    a = _layer("0")
    hash(a), a.expr()
    state = pickle.loads(pickle.dumps(a)).__dict__
    assert "_hash" not in state and "_expr" not in state
    assert pickle.loads(pickle.dumps(a)) == a
