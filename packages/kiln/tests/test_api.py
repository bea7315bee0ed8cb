"""The facade's dynamic-shape options: kiln.compile(dynamic=...), kiln.mark_dynamic,
kiln.mark_static and the cache-limit count in kiln.stats()."""

from __future__ import annotations

import warnings

import pytest
import torch

import kiln
import kiln_capture


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


class RecordingBackend:
    """Runs each captured graph as given; records which placeholders have symbolic sizes."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        assert "shape_env" in gm.meta
        self.graphs.append(gm)
        return gm.forward

    def symbolic(self, i: int = 0) -> list[list[bool]]:
        return [
            [isinstance(s, torch.SymInt) for s in n.meta["val"].shape]
            for n in self.graphs[i].graph.nodes
            if n.op == "placeholder"
        ]


def attention_scores(x):
    b, t, c = x.shape
    mask = torch.ones(t, t).tril()
    scores = (x @ x.transpose(1, 2)) / c**0.5
    return scores.masked_fill(mask == 0, float("-inf")).softmax(-1) @ x


def test_dynamic_true_reaches_capture_one_graph_for_every_length():
    backend = RecordingBackend()
    compiled = kiln.compile(attention_scores, backend=backend, dynamic=True)
    torch.manual_seed(0)
    for t in (5, 8, 13):
        x = torch.randn(2, t, 16)
        torch.testing.assert_close(compiled(x), attention_scores(x))
    assert len(backend.graphs) == 1
    assert backend.symbolic() == [[True, True, True]]


def test_dynamic_none_makes_the_changed_size_symbolic_on_the_recompile():
    backend = RecordingBackend()
    compiled = kiln.compile(attention_scores, backend=backend)
    torch.manual_seed(0)
    for t in (5, 8, 13, 7):
        x = torch.randn(2, t, 16)
        torch.testing.assert_close(compiled(x), attention_scores(x))
    assert len(backend.graphs) == 2
    assert backend.symbolic(0) == [[False, False, False]]
    assert backend.symbolic(1) == [[False, True, False]]


def test_dynamic_false_specializes():
    backend = RecordingBackend()
    compiled = kiln.compile(attention_scores, backend=backend, dynamic=False)
    for t in (5, 8):
        x = torch.randn(2, t, 16)
        torch.testing.assert_close(compiled(x), attention_scores(x))
    assert len(backend.graphs) == 2 and backend.symbolic(1) == [[False, False, False]]


def test_dynamic_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="dynamic"):
        kiln.compile(attention_scores, dynamic=1)


def test_mark_dynamic_and_mark_static_are_reexported():
    import kiln_capture

    assert kiln.mark_dynamic is kiln_capture.mark_dynamic  # re-exported, not rewrapped
    assert kiln.mark_static is kiln_capture.mark_static
    backend = RecordingBackend()
    compiled = kiln.compile(attention_scores, backend=backend, dynamic=False)
    for t in (6, 11):
        x = torch.randn(2, t, 16)
        kiln.mark_dynamic(x, 1, min=2, max=64)
        kiln.mark_static(x, 0)
        torch.testing.assert_close(compiled(x), attention_scores(x))
    assert len(backend.graphs) == 1 and backend.symbolic() == [[False, True, False]]
    with pytest.raises(ValueError, match="min"):
        kiln.mark_dynamic(torch.randn(2, 3), 1, min=5, max=4)


def test_a_range_violation_under_fullgraph_raises():
    compiled = kiln.compile(attention_scores, backend=RecordingBackend(), fullgraph=True)
    x = torch.randn(2, 40, 16)
    kiln.mark_dynamic(x, 1, max=32)
    with pytest.raises(kiln_capture.DynamicShapeError, match="outside the range"):
        compiled(x)


def test_stats_count_frames_that_reach_the_cache_limit(monkeypatch):
    from kiln_capture.config import config

    monkeypatch.setattr(config, "cache_size_limit", 2)
    compiled = kiln.compile(attention_scores, backend=RecordingBackend(), dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in (3, 4, 5, 6):
            x = torch.randn(2, t, 16)
            torch.testing.assert_close(compiled(x), attention_scores(x))
    assert kiln.stats()["cache_limit_hits"] == 1
    (warning,) = [w for w in caught if "cache size limit" in str(w.message)]
    assert "kiln.mark_dynamic" in str(warning.message)
