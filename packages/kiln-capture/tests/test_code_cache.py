"""code_cache.py: generated guard and entry code kept on disk, and what happens when the
disk holds something else (damaged entries, another format, a directory that cannot be
written, two processes at once). Every case must give eager's result with a graph built."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from helpers import CountingBackend
from torch import nn

import kiln_capture
from kiln_capture import code_cache, hook


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_CAPTURE_CACHE", "1")
    monkeypatch.setenv("KILN_CAPTURE_FRAMES", "0")  # whole captures: test_frame_store.py
    code_cache.reset()
    yield tmp_path
    code_cache.reset()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.scale = 0.5

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) * self.scale
        return x


def _run(model, x):
    """A fresh capture of ``model`` (as a new process would make it): its result, the
    backend, and its cache entry."""
    kiln_capture.reset()
    code_cache.reset()
    b = CountingBackend()
    out = kiln_capture.optimize(b)(model)(x)
    entries = hook.cache_entries(type(model).forward.__code__)
    assert len(b.graphs) == 1 and len(entries) == 1
    return out, entries[0]


def _entries(root):
    return sorted(p for p in (root / "capture").rglob("*") if p.is_file())


def test_a_second_capture_loads_the_guard_and_entry_code(cache_dir):
    torch.manual_seed(0)
    m, x = Block(), torch.randn(4, 8)
    out, first = _run(m, x)
    torch.testing.assert_close(out, m(x))
    saved = _entries(cache_dir)
    assert saved  # guard, graph-call arguments, run function
    hits = code_cache.STATS.hits
    out2, second = _run(m, x)
    torch.testing.assert_close(out2, m(x))
    assert code_cache.STATS.hits >= hits + 3
    assert second.guard.__kiln_source__ == first.guard.__kiln_source__
    assert second.run.__kiln_source__ == first.run.__kiln_source__
    # the loaded guard checks what the made one checks
    assert second.guard(m.forward.__func__, m, x)
    assert not second.guard(m.forward.__func__, m, torch.randn(5, 8))
    m.scale = 0.25
    assert not second.guard(m.forward.__func__, m, x)


def test_the_disk_can_be_turned_off(cache_dir, monkeypatch):
    monkeypatch.setenv("KILN_CAPTURE_CACHE", "0")
    m, x = Block(), torch.randn(4, 8)
    out, _ = _run(m, x)
    torch.testing.assert_close(out, m(x))
    assert not (cache_dir / "capture").exists()


def _damage_all(root, how):
    files = _entries(root)
    assert files
    for p in files:
        data = p.read_bytes()
        p.write_bytes(how(data))
    return files


@pytest.mark.parametrize(
    "how",
    [
        pytest.param(lambda d: d[: len(d) // 2], id="truncated"),
        pytest.param(lambda d: d[:-8] + bytes(8), id="corrupt-payload"),
        pytest.param(lambda d: b"garbage", id="no-magic"),
        pytest.param(lambda d: d.replace(b'"format": 1', b'"format": 99', 1), id="other-format"),
    ],
)
def test_a_damaged_entry_is_rebuilt_with_a_warning(cache_dir, how):
    m, x = Block(), torch.randn(4, 8)
    _run(m, x)
    files = _damage_all(cache_dir, how)
    with pytest.warns(RuntimeWarning, match="damaged entry in the code cache"):
        out, entry = _run(m, x)
    torch.testing.assert_close(out, m(x))
    assert entry.guard(m.forward.__func__, m, x)
    # made again and written whole: the next process loads them without a warning
    assert all(p.exists() for p in files)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = _run(m, x)
    torch.testing.assert_close(out, m(x))


def test_an_entry_of_the_wrong_shape_is_rebuilt(cache_dir):
    """A whole, checksummed entry whose value is not what its kind holds (written by a
    buggy or foreign writer): rebuilt, never run."""
    m, x = Block(), torch.randn(4, 8)
    _run(m, x)
    for p in _entries(cache_dir):
        code_cache._save(p.name, (1, 2))
    with pytest.warns(RuntimeWarning, match="unexpected contents"):
        out, _ = _run(m, x)
    torch.testing.assert_close(out, m(x))


def test_another_kiln_capture_version_does_not_load_the_entries(cache_dir, monkeypatch):
    m, x = Block(), torch.randn(4, 8)
    _run(m, x)
    before = set(_entries(cache_dir))
    monkeypatch.setattr(code_cache, "_digest", ["another version"])
    hits = code_cache.STATS.hits
    out, _ = _run(m, x)
    torch.testing.assert_close(out, m(x))
    assert code_cache.STATS.hits == hits
    assert set(_entries(cache_dir)) > before  # its own entries, beside the others


def test_a_cache_directory_that_cannot_be_written(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")  # a file where the directory should be: mkdir fails, even as root
    monkeypatch.setenv("KILN_CACHE_DIR", str(blocker))
    code_cache.reset()
    m, x = Block(), torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        out, _ = _run(m, x)
    torch.testing.assert_close(out, m(x))
    code_cache.reset()


_PROCESS = textwrap.dedent(
    """
    import sys, torch, kiln_capture
    from torch import nn
    from kiln_capture import code_cache
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)], nn.ReLU())
    x = torch.randn(3, 16)
    out = kiln_capture.optimize(lambda gm, ex: gm.forward)(m)(x)
    torch.testing.assert_close(out, m(x))
    print(code_cache.STATS.hits, code_cache.STATS.misses)
    """
)


def test_two_processes_at_once_then_a_third_loads(cache_dir):
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), KILN_CAPTURE_CACHE="1")
    cmd = [sys.executable, "-c", _PROCESS]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
    third = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    hits, misses = map(int, third.stdout.split())
    assert hits >= 3 and misses == 0
    assert not list((cache_dir / "capture").rglob(".tmp-*"))
