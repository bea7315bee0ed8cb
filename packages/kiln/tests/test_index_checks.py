"""kiln.compile with bad indices: eager's exception with the op and the user's source
line, then correct results again; the check_indices option."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln


def _embed(i, w):
    return F.embedding(i, w) * 2  # the line the error names


def test_embedding_id_out_of_range_names_the_source_line():
    w = torch.randn(10, 16)
    good = torch.randint(0, 10, (2, 3))
    kiln.reset()
    compiled = kiln.compile(_embed)
    torch.testing.assert_close(compiled(good, w), _embed(good, w))
    bad = good.clone()
    bad[1, 2] = 10**8
    with pytest.raises(IndexError, match="index out of range in self") as e:
        compiled(bad, w)
    assert "aten.embedding" in str(e.value) and "F.embedding(i, w) * 2" in str(e.value)
    torch.testing.assert_close(compiled(good, w), _embed(good, w))
    assert kiln.stats()["fallbacks"] == 0


def test_gather_negative_index_is_not_wrapped():
    def f(x, i):
        return torch.gather(x, 1, i).relu()

    x = torch.randn(4, 8)
    i = torch.randint(0, 8, (4, 3))
    kiln.reset()
    compiled = kiln.compile(f)
    torch.testing.assert_close(compiled(x, i), f(x, i))
    i[0, 0] = -1
    # eager raises the same: the kiln note in the message shows the compiled kernel checked
    with pytest.raises(
        RuntimeError, match="index -1 is out of bounds for dimension 1 with size 8"
    ) as e:
        compiled(x, i)
    assert "checked in the compiled kernel of aten.gather" in str(e.value)
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0


def test_check_indices_option_is_known_and_typed():
    with pytest.raises(Exception, match="check_indices"):
        kiln.compile(_embed, options={"check_indices": "yes"})
    kiln.reset()
    f = kiln.compile(_embed, options={"check_indices": False})
    w, i = torch.randn(10, 16), torch.randint(0, 10, (2, 3))
    torch.testing.assert_close(f(i, w), _embed(i, w))
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0


def _positions_and_ids(ids, w, x):
    pos = torch.arange(ids.shape[1])
    return F.embedding(pos, w) + F.embedding(ids, w), torch.gather(x, 1, ids.clamp(0, 15))


def test_provably_in_range_indices_are_not_checked(tmp_path):
    """arange positions and clamped ids need no check; the input ids do (one check)."""
    w, x = torch.randn(16, 8), torch.randn(4, 16)
    ids = torch.randint(0, 16, (4, 5))
    f = kiln.compile(_positions_and_ids, options={"debug_dir": str(tmp_path)})
    for got, want in zip(f(ids, w, x), _positions_and_ids(ids, w, x)):
        torch.testing.assert_close(got, want)
    sources = "".join(p.read_text() for p in tmp_path.rglob("kernel*.cpp"))
    assert sources.count("kiln_index_fail(&kiln_err") == 1, sources[-3000:]
