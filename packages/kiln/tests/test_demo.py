"""`python -m kiln demo` end to end, on a GPT-2 small enough for a unit test."""

from __future__ import annotations

import re

import pytest

import kiln
from kiln import demo

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    yield
    kiln.reset()


def test_demo_checks_against_eager_and_prints_the_figures(capsys):
    argv = ["--layers", "1", "--width", "64", "--heads", "2", "--vocab", "512"]
    assert demo.main([*argv, "--seq", "32", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "batch 1 x 32 tokens" in out  # the shape timed is stated
    assert "matches eager" in out
    for label in ("compile time", "eager latency", "kiln latency", "speed-up", "kiln overhead"):
        assert re.search(rf"{label}\s+[0-9.]+", out), label
    assert re.search(r"speed-up\s+[0-9.]+x\s+\(\s*[0-9.]+x\)", out)  # best rounds, then medians
    assert re.search(r"graphs compiled\s+1\s+\(fell back to eager: 0\)", out)


def test_timed_backend_counts_time_inside_the_compiled_graph():
    import torch

    def f(x):
        return torch.relu(x) * 2

    backend = demo.TimedBackend()
    compiled = kiln.compile(f, backend=backend)
    x = torch.randn(64)
    torch.testing.assert_close(compiled(x), f(x))
    assert backend.seconds > 0
