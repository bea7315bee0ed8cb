"""Generated code kept on disk: a warm process skips hoisting and compiling it again.

Design note: "persistent generated code"
----------------------------------------
A cache entry's guard function is Python source that capture generates from its guard
expressions: ``guards.hoist_reads`` scans every expression, finds the read chains they
share and writes straight-line code, then ``compile`` turns that into a code object. For
a model this is thousands of AST nodes (HF GPT-2, 24 layers: 772 guards, ~0.17 s, a
fifth of a warm process's first call). The step is a pure function of text: the same
expressions give the same function, in any process. This module keeps its result on
disk, so that a process meeting the same frame again (the usual warm start: the same
model in a new process) loads the code object instead of making it.

Only text and code objects are kept, never objects of the process: the constants,
globals and frame values a guard reads stay the running process's own (``__k_C``,
``__k_G``, the arguments), bound when the loaded code is executed. So a loaded entry
can only be the code that making it afresh would give; what could differ is guarded by
the key: sha256 of this file's ``FORMAT``, the kind of text, the input text itself,
Python's version and bytecode magic number (code objects are ``marshal``-ed; hoisted
text is ``ast.unparse``'s, whose spelling may change between releases), kiln-capture's
version and a digest of the modules that generate the text (this file, guards.py and
read_chains.py).

File: ``<cache dir>/capture/<key[:2]>/<key>``: a magic line, a JSON header line (format,
key, payload size and sha256), then the payload (``marshal`` of the value). It is
written to a temporary file beside it and moved into place with ``os.replace``: a
reader sees a whole entry or none, and two processes writing the same entry each write
a whole one. On load the header and the payload's checksum are checked before
``marshal`` reads it, and the value's shape is checked after; an entry that fails
(truncated, corrupt, another format) warns once, is removed and made again. A cache
directory that cannot be written warns once; the process then makes the code without
saving. ``KILN_CAPTURE_CACHE=0`` turns it off. Nothing is kept in memory beyond the
entries that use the code (a process compiling thousands of functions, as the OpInfo
sweep does, would otherwise hold every one).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import sys
import tempfile
import types
import warnings
from collections.abc import Callable
from pathlib import Path

from kiln_capture.config import config

FORMAT = 1
MAGIC = b"kiln-capture-code\n"
_warned: set[str] = set()
_read_only: list[bool] = []  # set once the directory refused a write


class _Stats:
    hits = 0  # loaded from disk
    misses = 0  # made (and saved where the directory allows)


STATS = _Stats()


def _default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kiln"


def cache_root() -> Path:
    return Path(config.cache_dir or _default_dir()) / "capture"


_digest: list[str] = []


def _generator_digest() -> str:
    """Of kiln-capture's version and the sources that write the cached text."""
    if not _digest:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ver = version("kiln-capture")
        except PackageNotFoundError:
            ver = "unknown"
        h = hashlib.sha256(ver.encode())
        here = Path(__file__).resolve().parent
        for name in ("code_cache.py", "guards.py", "read_chains.py"):
            h.update((here / name).read_bytes())
        _digest.append(h.hexdigest())
    return _digest[0]


def key_of(kind: str, text: str) -> str:
    h = hashlib.sha256(f"{FORMAT}\0{kind}\0{sys.version}\0".encode())
    h.update(importlib.util.MAGIC_NUMBER)
    h.update(_generator_digest().encode())
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def warn_once(what: str, message: str) -> None:
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"kiln-capture: {message}", RuntimeWarning, stacklevel=4)


def _path(key: str) -> Path:
    return cache_root() / key[:2] / key


def reject(path: Path, why: str, what: str = "code cache") -> None:
    """Warn once that the entry at ``path`` is damaged, and remove it."""
    warn_once(
        f"damaged:{path}",
        f"a damaged entry in the {what} ({path}: {why}) was removed and is made again",
    )
    try:
        path.unlink()
    except OSError:
        pass


def read_entry(path: Path, magic: bytes, fmt: int, key: str, what: str) -> object | None:
    """The value kept at ``path`` (the file layout of the design note above), or None:
    missing, or damaged (then warned once and removed)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        if not data.startswith(magic):
            raise ValueError("no magic line")
        end = data.index(b"\n", len(magic))
        header = json.loads(data[len(magic) : end])
        payload = data[end + 1 :]
        if header.get("format") != fmt or header.get("key") != key:
            raise ValueError("another format or key")
        if header.get("size") != len(payload):
            raise ValueError("truncated")
        if header.get("sha256") != hashlib.sha256(payload).hexdigest():
            raise ValueError("checksum differs")
        return marshal.loads(payload)
    except (ValueError, EOFError, TypeError, json.JSONDecodeError) as e:
        reject(path, str(e), what)
        return None


def write_entry(path: Path, magic: bytes, fmt: int, key: str, value: object) -> None:
    """Write ``value`` (``marshal``-able) to ``path`` atomically; a directory that cannot
    be written warns once and is not tried again."""
    if _read_only:
        return
    payload = marshal.dumps(value)
    header = json.dumps(
        {
            "format": fmt,
            "key": key,
            "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
    ).encode()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(magic + header + b"\n" + payload)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        _read_only.append(True)
        warn_once(
            "read-only",
            f"the code cache directory {cache_root()} cannot be written ({e}); generated "
            "code is made in this process only (set KILN_CACHE_DIR to a writable directory, "
            "or KILN_CAPTURE_CACHE=0)",
        )
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _load(key: str, shape: tuple[type, ...]) -> tuple | None:
    path = _path(key)
    value = read_entry(path, MAGIC, FORMAT, key, "code cache")
    if value is not None and (
        type(value) is not tuple
        or len(value) != len(shape)
        or not all(isinstance(v, t) for v, t in zip(value, shape, strict=True))
    ):
        reject(path, "unexpected contents")
        return None
    return value


def _save(key: str, value: tuple) -> None:
    write_entry(_path(key), MAGIC, FORMAT, key, value)


def cached(kind: str, text: str, shape: tuple[type, ...], make: Callable[[], tuple]) -> tuple:
    """``make()``'s value (a tuple of ``shape``'s types, each ``marshal``-able), from the
    disk when ``text`` under ``kind`` was made before (design note above)."""
    if not config.capture_cache:
        return make()
    key = key_of(kind, text)
    value = _load(key, shape)
    if value is not None:
        STATS.hits += 1
        return value
    STATS.misses += 1
    value = make()
    _save(key, value)
    return value


def compiled_function(
    kind: str, name: str, src: str, filename: str, ns: dict
) -> types.FunctionType:
    """The function ``name`` that ``src`` defines, executed in ``ns``; its code object
    comes from the cache when ``src`` was compiled before."""
    (code,) = cached(kind, src, (types.CodeType,), lambda: (compile(src, filename, "exec"),))
    exec(code, ns)
    fn = ns[name]
    fn.__kiln_source__ = src
    return fn


def reset() -> None:
    """Forget that the directory refused a write and which warnings were given (tests)."""
    _read_only.clear()
    _warned.clear()
