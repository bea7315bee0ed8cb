"""compiler_identity: ``cxx --version`` asked once per compiler binary and kept in the
kernel cache; a replaced compiler (another size, time or inode) is asked again."""

from __future__ import annotations

import os

from kiln_cpp.build import compiler_identity

SCRIPT = '#!/bin/sh\necho run >> "{log}"\necho "{name} 1.0"\n'


def _compiler(tmp_path, name: str):
    path = tmp_path / "fake-cxx"
    path.write_text(SCRIPT.format(log=tmp_path / "runs", name=name))
    path.chmod(0o755)
    return str(path)


def _runs(tmp_path) -> int:
    log = tmp_path / "runs"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_asked_once_per_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    ask = compiler_identity.__wrapped__  # past the per-process memo: what a new process does
    cxx = _compiler(tmp_path, "fake")
    assert ask(cxx) == "fake 1.0" and _runs(tmp_path) == 1
    assert ask(cxx) == "fake 1.0" and _runs(tmp_path) == 1  # from the cache
    os.unlink(cxx)
    cxx = _compiler(tmp_path, "other-fake")  # replaced: another binary
    assert ask(cxx) == "other-fake 1.0" and _runs(tmp_path) == 2


def test_a_read_only_cache_still_answers(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o500)
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))
    try:
        cxx = _compiler(tmp_path, "fake")
        assert compiler_identity.__wrapped__(cxx) == "fake 1.0"
    finally:
        cache.chmod(0o700)
