"""Every path on which kiln runs a frame eagerly by its own choice warns once, with the
frame's source line, and is counted in kiln.stats()."""

from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln_capture.stats import eager_reasons


def _grows(x):
    return x * 2 + 1


def test_cache_size_limit_warns_once_and_counts(monkeypatch):
    from kiln_capture.config import config

    monkeypatch.setattr(config, "cache_size_limit", 2)
    kiln.reset()
    f = kiln.compile(_grows, dynamic=False)  # each size compiles a graph
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 7):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), _grows(x))
    mine = [w for w in caught if "cache size limit" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert mine[0].filename == __file__
    assert "dynamic=True" in str(mine[0].message)  # the fix
    assert kiln.stats()["eager_frames"] == 1 and kiln.stats()["cache_limit_hits"] == 1
    assert eager_reasons() == {"cache size limit": 1}


def _plain(x):
    return x.sin() + 1


def test_internal_capture_error_warns_once_and_counts(monkeypatch):
    import kiln_capture.hook as hook
    from kiln_capture.config import config

    def broken(*args, **kwargs):
        raise AssertionError("a bug in the evaluator")

    monkeypatch.setattr(hook, "compile_frame", broken)
    monkeypatch.setattr(config, "raise_internal", False)
    kiln.reset()
    f = kiln.compile(_plain)
    x = torch.randn(3)
    with pytest.warns(RuntimeWarning, match="internal error capturing _plain"):
        torch.testing.assert_close(f(x), _plain(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        torch.testing.assert_close(f(x), _plain(x))
    assert kiln.stats()["eager_frames"] == 1
    assert eager_reasons() == {"internal error": 1}


def test_generated_code_is_captured():
    """exec, eval and fx GraphModule.forward: code objects whose file name starts with '<'
    were skipped, and ran eagerly without a word."""
    ns: dict = {"torch": torch}
    exec("def made(x):\n    return torch.relu(x) * 3 + 1\n", ns)
    made_by_eval = eval("lambda x: x.exp() - 1", {"torch": torch})
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    x = torch.randn(2, 4)
    for fn in (ns["made"], made_by_eval, gm):
        kiln.reset()
        compiled = kiln.compile(fn)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), fn(x))
        assert kiln.stats()["graphs"] == 1, fn
        assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["eager_frames"] == 0
