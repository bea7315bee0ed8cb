"""kiln-inductor's persistent artifact cache through kiln.compile: a warm hit skips
tracing and lowering and matches eager; damaged, stale, concurrently written and
unwritable caches rebuild or run without the cache, with a warning, and match eager."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kiln
import kiln_aot.api
import kiln_inductor.compile
from kiln_inductor.runtime import artifacts
from kiln_inductor.runtime.artifacts import MAGIC, STATS, ArtifactCache


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))) * 0.5 + 1.0)


def _model() -> Block:
    torch.manual_seed(0)
    return Block()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_ARTIFACT_CACHE", "1")
    monkeypatch.setattr(artifacts, "_warned", set())
    monkeypatch.setattr(artifacts, "_unwritable", set())
    kiln.reset()
    yield tmp_path
    kiln.reset()


def _run(model: torch.nn.Module, x: torch.Tensor, train: bool = False) -> None:
    """Compile ``model`` afresh (capture included), compare with eager: outputs, and the
    gradients of the parameters when ``train``."""
    kiln.reset()
    compiled = kiln.compile(model, options={"raise_on_error": True})
    if not train:
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        assert kiln.stats()["fallbacks"] == 0
        return
    compiled(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    model.zero_grad(set_to_none=True)
    assert kiln.stats()["fallbacks"] == 0


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in (root / "artifacts").rglob("*") if p.is_file())


def _counting(monkeypatch) -> dict[str, int]:
    """Counts of kiln-aot's traces and kiln-inductor's lowerings from now on."""
    calls = {"trace": 0, "lower": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(kiln_aot.api, "trace", counted("trace", kiln_aot.api.trace))
    monkeypatch.setattr(kiln_aot.api, "trace_joint", counted("trace", kiln_aot.api.trace_joint))
    lowering = kiln_inductor.compile.GraphLowering
    monkeypatch.setattr(lowering, "run", counted("lower", lowering.run))
    return calls


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_warm_hit_skips_tracing_and_lowering(cache, monkeypatch, train):
    model, x = _model(), torch.randn(5, 8)
    before = STATS.hits, STATS.saves
    _run(model, x, train)
    # a training plan is saved again once its backward compiled (on the first backward)
    assert STATS.saves == before[1] + (2 if train else 1) and STATS.hits == before[0]
    (entry,) = _entries(cache)
    state = ArtifactCache(cache)._decode(entry.name, entry.read_bytes())
    assert state["kind"] == ("TrainingPlan" if train else "InferencePlan")
    assert all(g["kernels"] for g in state["graphs"])  # generated kernels, no fallback
    if train:  # the forward, the backward for the strides that came, the graph to compile
        assert len(state["graphs"]) == 2 and state["backward"]["graph"] is not None
    calls = _counting(monkeypatch)
    _run(model, x, train)  # a fresh capture: the plan comes from the cache
    assert STATS.hits == before[0] + 1
    assert calls == {"trace": 0, "lower": 0}


def test_option_turns_the_cache_off(cache):
    model, x = _model(), torch.randn(2, 8)
    compiled = kiln.compile(model, options={"artifact_cache": False, "raise_on_error": True})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    stats = kiln.stats()  # compiled (not run eagerly), and nothing written
    assert stats["graphs"] == 1 and stats["fallbacks"] == 0, stats
    assert _entries(cache) == []


def _damage_and_rerun(cache, damage, match: str) -> None:
    model, x = _model(), torch.randn(5, 8)
    _run(model, x)
    (entry,) = _entries(cache)
    damage(entry)
    rejected = STATS.rejected
    artifacts._warned.clear()  # a damaged entry warns once a process
    with pytest.warns(RuntimeWarning, match=match):
        _run(model, x)
    assert STATS.rejected == rejected + 1
    (rebuilt,) = _entries(cache)
    assert ArtifactCache(cache)._decode(rebuilt.name, rebuilt.read_bytes())["graphs"]


def test_corrupt_entry_is_rebuilt(cache):
    def flip(entry: Path) -> None:
        data = bytearray(entry.read_bytes())
        data[-10] ^= 0xFF
        entry.write_bytes(bytes(data))

    _damage_and_rerun(cache, flip, "corrupt")


def test_truncated_entry_is_rebuilt(cache):
    def cut(entry: Path) -> None:
        data = entry.read_bytes()
        entry.write_bytes(data[: len(data) // 2])

    _damage_and_rerun(cache, cut, "truncated")


def _rewrite_header(entry: Path, **changes) -> None:
    data = entry.read_bytes()
    end = data.index(b"\n", len(MAGIC))
    header = {**json.loads(data[len(MAGIC) : end]), **changes}
    entry.write_bytes(MAGIC + json.dumps(header).encode() + data[end:])


def test_entry_of_other_versions_or_format_is_rebuilt(cache):
    other = {**artifacts.versions(), "kiln-inductor": "0.0.1"}
    _damage_and_rerun(cache, lambda e: _rewrite_header(e, versions=other), "written by")
    _damage_and_rerun(cache, lambda e: _rewrite_header(e, format=0), "format")


def test_kiln_version_change_compiles_anew(cache, monkeypatch):
    model, x = _model(), torch.randn(5, 8)
    _run(model, x)
    other = {**artifacts.versions(), "kiln": "9.9.9"}
    monkeypatch.setattr(artifacts, "versions", lambda: other)
    misses = STATS.misses
    _run(model, x)  # another key: compiled and saved beside the old entry
    assert STATS.misses == misses + 1 and len(_entries(cache)) == 2


_SCRIPT = textwrap.dedent(
    """
    import json, torch, kiln
    from kiln_inductor.runtime.artifacts import STATS
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    x = torch.randn(5, 8)
    with torch.no_grad():
        out = kiln.compile(model, options={"raise_on_error": True})(x)
        torch.testing.assert_close(out, model(x))
    print(json.dumps({"hits": STATS.hits, "saves": STATS.saves, "unsaved": STATS.unsaved}))
    """
)


def _spawn(cache: Path) -> subprocess.Popen:
    env = {**os.environ, "KILN_CACHE_DIR": str(cache), "KILN_ARTIFACT_CACHE": "1"}
    env["KILN_VERIFY"] = "1"
    return subprocess.Popen(
        [sys.executable, "-W", "always::RuntimeWarning", "-c", _SCRIPT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def test_two_processes_compiling_at_once(tmp_path):
    procs = [_spawn(tmp_path), _spawn(tmp_path)]
    results = [_result(p)[0] for p in procs]
    assert all(r["unsaved"] == 0 for r in results)
    entries = _entries(tmp_path)
    assert len(entries) == 1 and not any(e.name.startswith(".tmp") for e in entries)
    warm, err = _result(_spawn(tmp_path))
    assert warm["hits"] == 1 and "RuntimeWarning" not in err


def _read_only(folder: Path, on: bool) -> bool:
    """Make ``folder`` read-only (or writable again); False where that cannot be done.
    Root writes through permission bits: the immutable attribute stops it."""
    if os.geteuid() != 0:
        folder.chmod(0o555 if on else 0o755)
        return True
    flag = subprocess.run(["chattr", "+i" if on else "-i", str(folder)], capture_output=True)
    return flag.returncode == 0


def test_read_only_cache_runs_without_it(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    if not _read_only(root, True):
        pytest.skip("running as root where chattr cannot make a folder read-only")
    try:
        result, err = _result(_spawn(root))
    finally:
        _read_only(root, False)
    assert result["saves"] == 0 and result["unsaved"] == 1
    assert "cannot write the artifact cache" in err and "cannot write the kernel cache" in err
    assert not any(root.iterdir())


_TRAIN_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, kiln, kiln_aot, kiln_aot.api, kiln_inductor
    from unittest import mock
    from kiln_inductor.runtime.artifacts import STATS
    trace = mock.patch.object(kiln_aot.api, "trace_joint", wraps=kiln_aot.api.trace_joint).start()
    lowering = kiln_inductor.compile.GraphLowering
    lower = mock.patch.object(lowering, "run", autospec=True, side_effect=lowering.run).start()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 4))
    x, s = torch.randn(5, 8), torch.randn(4, 5)
    losses = {"sum": lambda y: y.sum(), "transposed": lambda y: (y.t() * s).sum()}
    loss = losses[sys.argv[1]]
    compiled = kiln.compile(model, options={"raise_on_error": True})
    for _ in range(2):
        loss(compiled(x)).backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        loss(model(x)).backward()
        for g, p in zip(got, model.parameters()):
            torch.testing.assert_close(g, p.grad)
        model.zero_grad(set_to_none=True)
    calls = {"trace": trace.call_count, "lower": lower.call_count}
    print(json.dumps({"hits": STATS.hits, "saves": STATS.saves, **calls,
                      "tangent_copies": sum(kiln_aot.tangent_copies().values()),
                      "layout_copies": len(kiln_inductor.layout_copies()),
                      "fallbacks": kiln.stats()["fallbacks"]}))
    """
)


def _train_process(cache: Path, loss: str) -> dict:
    env = {**os.environ, "KILN_CACHE_DIR": str(cache), "KILN_ARTIFACT_CACHE": "1"}
    env["KILN_VERIFY"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _TRAIN_SCRIPT, loss], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_warm_process_runs_the_backward_for_its_tangent_strides(tmp_path):
    """The expanded ones of ``.sum()`` in a warm process: the backward variant comes from
    the cache (no tangent copy, no tracing or lowering); a transposed gradient compiles
    its variant from the stored backward graph (no copy, no tracing), which a third
    process then loads. Gradients equal eager's in each process."""
    clean = {"tangent_copies": 0, "layout_copies": 0, "fallbacks": 0}
    cold = _train_process(tmp_path, "sum")
    # saved with the forward, then again with the backward compiled on its first call
    assert cold == {"hits": 0, "saves": 2, "trace": 1, "lower": 2, **clean}
    warm = _train_process(tmp_path, "sum")
    assert warm == {"hits": 1, "saves": 0, "trace": 0, "lower": 0, **clean}
    other = _train_process(tmp_path, "transposed")
    assert other == {"hits": 1, "saves": 1, "trace": 0, "lower": 1, **clean}
    again = _train_process(tmp_path, "transposed")
    assert again == {"hits": 1, "saves": 0, "trace": 0, "lower": 0, **clean}
