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


class _Embedder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(16, 8)
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, ids):
        return self.proj(self.table(ids).relu())


def test_backward_scatter_of_forward_checked_ids_is_not_checked_again(monkeypatch):
    """The forward's embedding checks the ids; the backward's scatter of the same ids into
    the same table's gradient does not check them again (on a GPU that check's wait held
    the host until the backward had run). Gradients equal eager's; a bad id still raises
    eager's error in the forward."""
    import kiln_inductor.index_check as ic
    from kiln_inductor.lowering.context import current_node

    made = []
    real = ic.index_check

    def recording(*args, **kwargs):
        check = real(*args, **kwargs)
        made.append((str(current_node().target), check is not None))
        return check

    for mod in ("kiln_inductor.lowering.scatter", "kiln_inductor.lowering.tensors"):
        monkeypatch.setattr(f"{mod}.index_check", recording)
    torch.manual_seed(0)
    model = _Embedder()
    ref = _Embedder()
    ref.load_state_dict(model.state_dict())
    ids = torch.randint(0, 16, (4, 6))
    kiln.reset()
    compiled = kiln.compile(model, options={"artifact_cache": False})
    compiled(ids).square().sum().backward()
    ref(ids).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    s = kiln.stats()
    assert s["graphs"] == 1 and s["fallbacks"] == 0 and s["breaks"] == 0
    assert ("aten.embedding.default", True) in made, made
    assert ("aten.embedding_dense_backward.default", False) in made, made
    assert ("aten.embedding_dense_backward.default", True) not in made, made
    bad = ids.clone()
    bad[2, 3] = 16
    with pytest.raises(IndexError, match="index out of range in self"):
        compiled(bad)
