import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kiln_inductor.runtime.cache import STATS, KernelCache, digest


def _write(tmp: Path, text: str = "binary") -> None:
    (tmp / "kernel.so").write_text(text)


def test_entries_are_content_addressed_and_built_once(tmp_path):
    cache = KernelCache("t", tmp_path)
    key = digest("source", "flags")
    calls = []
    path = cache.get_or_build(key, lambda d: (calls.append(1), _write(d)))
    again = cache.get_or_build(key, lambda d: (calls.append(1), _write(d)))
    assert path == again and len(calls) == 1
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["key"] == key and "kernel.so" in manifest["files"]
    assert digest("source", "flags") != digest("source", "other flags")


def test_corrupt_or_truncated_entry_is_removed_and_rebuilt(tmp_path):
    cache = KernelCache("t", tmp_path)
    key = digest("x")
    path = cache.get_or_build(key, _write)
    (path / "kernel.so").write_text("binarX")  # same size, other bytes
    before = STATS.corrupt
    assert cache.lookup(key) is None and STATS.corrupt == before + 1
    path = cache.get_or_build(key, _write)
    (path / "kernel.so").write_text("bin")  # truncated
    assert cache.lookup(key) is None
    path = cache.get_or_build(key, _write)
    (path / "manifest.json").unlink()  # half-written entry
    assert cache.lookup(key) is None
    assert (cache.get_or_build(key, _write) / "kernel.so").read_text() == "binary"


def test_failed_build_leaves_no_entry(tmp_path):
    cache = KernelCache("t", tmp_path)
    key = digest("bad")

    def fail(d):
        _write(d)
        raise RuntimeError("compiler failed")

    try:
        cache.get_or_build(key, fail)
    except RuntimeError:
        pass
    assert cache.lookup(key) is None
    assert not any(p.name.startswith(".tmp") for p in cache.entry_dir(key).parent.iterdir())


def _build_in_process(root: str) -> str:
    cache = KernelCache("t", Path(root))
    return str(cache.get_or_build(digest("race"), _write))


def test_concurrent_builders_agree(tmp_path):
    # builders race on the final rename; each must end with the one intact entry
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(_build_in_process, [str(tmp_path)] * 4))
    assert len(set(paths)) == 1
    assert KernelCache("t", tmp_path).lookup(digest("race")) is not None
