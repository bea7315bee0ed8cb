"""The on-disk kernel cache: content-addressed, atomic, self-checking.

Location: ``$KILN_CACHE_DIR`` if set, else ``~/.cache/kiln`` (``$XDG_CACHE_HOME/kiln``).
Layout: ``<root>/<kind>/<key[:2]>/<key>/`` holding the entry's files and a
``manifest.json`` that lists each file's size and sha256. ``key`` is the sha256 of
everything that determines the files: source, flags, compiler identity, kiln version.

An entry is built in a private temporary directory beside it and renamed into place in one
``os.rename`` (atomic on POSIX), so a reader never sees half an entry; concurrent builders
race harmlessly (the loser discards its copy). A reader verifies the manifest before use; a
truncated or corrupt entry is removed and rebuilt, never loaded. When the cache directory
cannot be written, entries are built in a private temporary directory removed at exit
(with a warning, once): the process runs, without keeping what it built.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import log
from ..config import cache_dir


@dataclass
class CacheStats:
    hits: int = 0
    builds: int = 0
    corrupt: int = 0


STATS = CacheStats()


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class KernelCache:
    def __init__(self, kind: str, root: Path | None = None):
        self.root = (root or cache_dir()) / kind

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lookup(self, key: str) -> Path | None:
        """The entry's directory if present and intact; a damaged entry is removed."""
        path = self.entry_dir(key)
        if not path.exists():
            return None
        if self._verify(path):
            STATS.hits += 1
            return path
        STATS.corrupt += 1
        log.log("kernels", f"cache entry {path} is corrupt; removing and rebuilding it")
        shutil.rmtree(path, ignore_errors=True)
        return None

    def _verify(self, path: Path) -> bool:
        try:
            manifest = json.loads((path / "manifest.json").read_text())
            for name, info in manifest["files"].items():
                f = path / name
                if f.stat().st_size != info["size"] or _file_sha(f) != info["sha256"]:
                    return False
            return True
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def get_or_build(self, key: str, build: Callable[[Path], None]) -> Path:
        """The entry for ``key``, building it with ``build(tmpdir)`` when missing."""
        found = self.lookup(key)
        if found is not None:
            return found
        final = self.entry_dir(key)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:8]}-", dir=final.parent))
        except OSError as e:
            return self._build_privately(key, build, e)
        try:
            build(tmp)
            files = {
                p.name: {"size": p.stat().st_size, "sha256": _file_sha(p)}
                for p in sorted(tmp.iterdir())
                if p.is_file()
            }
            (tmp / "manifest.json").write_text(json.dumps({"key": key, "files": files}, indent=1))
            STATS.builds += 1
            try:
                os.rename(tmp, final)
            except OSError:
                # another process won the race: use its entry if intact, else ours
                if self.lookup(key) is None:
                    shutil.rmtree(final, ignore_errors=True)
                    os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _build_privately(self, key: str, build: Callable[[Path], None], error: OSError) -> Path:
        """Build into this process's private directory (the cache cannot be written)."""
        if not _private:
            _private.append(Path(tempfile.mkdtemp(prefix="kiln-private-cache-")))
            atexit.register(shutil.rmtree, _private[0], True)
            warnings.warn(
                f"kiln: cannot write the kernel cache under {self.root} ({error}): kernels are "
                f"built in {_private[0]} for this process only (set KILN_CACHE_DIR to a "
                "writable directory)",
                RuntimeWarning,
                stacklevel=3,
            )
        path = _private[0] / self.root.name / key
        if not path.exists():
            path.mkdir(parents=True)
            build(path)
            STATS.builds += 1
        return path


_private: list[Path] = []  # this process's build directory when the cache is read-only
