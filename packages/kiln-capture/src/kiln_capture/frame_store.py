"""Captures kept on disk: a warm process runs a frame's compiled graph without tracing it.

Design note: "persistent captures"
----------------------------------
Capturing a frame (evaluating its bytecode symbolically, running every op on meta
tensors, building guards) is most of a warm process's first call: HF GPT-2 spends
~0.2-0.8 s there while its compiled graph loads from kiln-inductor's artifact cache in
~0.05 s. The result of a capture is a cache entry: a guard function, a run function that
calls the compiled graph, the constants both read (``__k_C``), and the graph. Its code is
text (code_cache.py keeps it already); its graph is plain data (graph_data.py); only the
constants are objects of the process. This module keeps a whole entry on disk, with a
recipe per constant (recipes.py), so that a process meeting the same frame again finds
every constant again, checks the guards against the live objects and installs the entry
without evaluating any bytecode.

What makes a loaded entry the one a fresh capture would make:

- the key: sha256 of this module's ``FORMAT``, the frame's code object (its bytecode,
  constants, names, file, first line; nested code too), Python's version and bytecode
  magic, torch's version, kiln-capture's version and the digest of its sources (path,
  size and time of every module and extension of the package: the capture engine
  itself), the ``affects_cache``
  settings, and the ``dynamic``/``fullgraph`` of the optimize call. The backend is not
  part of it: the graph is handed to whichever backend the process uses now.
- the code the trace ran: every source file whose code the trace evaluated (the frame's,
  each inlined function's) and the module of each constant's class is kept with the
  sha256 of its contents, its size and its modification time; an edited file never
  reuses an entry (a file of the recorded size and time is taken as unchanged, as
  Python's own ``.pyc`` check does; another size or time is hashed again). A function constant's
  fingerprint is its code's digest and literal defaults. A trace of code not read from a
  file (``exec``, generated code) is not kept.
- the constants: each found again by value, import path or a path from the frame's
  arguments; an object found by a path must have the captured class (or be a function
  with the captured code). Identity guards then hold by construction; every other guard
  (types, literals, hooks, tensors' metadata and dispatch keys, grad mode...) runs as it
  would on a cache hit, and a record whose guards fail is not used.

Only entries that end in a return (no graph break: a break's continuation is a code
object of this process), with at most one graph, static sizes, and no value the graph
assumed from data are kept. Each frame key holds up to ``config.cache_size_limit``
records, newest first; the first one whose guards pass is installed, and the disk is read
once per frame per process (after ``reset()`` too: a process that captured a frame
already knows it). The graph is rebuilt and handed to the backend (contract 1), so the
backend's own cache (kiln-inductor's artifact cache, keyed by the graph's code and
metadata) gives the compiled graph.

Reload recipes. Rebuilding the graph (a ``GraphModule`` of thousands of nodes) and
handing it to a backend that only hashes it to find its earlier result was half of a warm
first call. A backend's callable may carry ``kiln_reload_recipe``: plain data
(``marshal``-able) naming what the backend built; the record keeps it, and a warm process
whose backend has ``kiln_reload(recipe, example_inputs, make_graph)`` asks it for the
callable first (kiln-inductor's runtime/reload.py checks that its compiler, machine and
settings are the ones the recipe was made with). ``make_graph()`` rebuilds the graph
when the backend needs it after all (a plan its cache lost); an answer of None rebuilds
the graph and calls the backend as usual, and the recipe of that callable replaces the
kept one (a compiler whose sources or settings changed reloads again from the next
process on). The graph is kept as ``marshal`` bytes inside
the record, decoded only then. A reloaded graph counts as a graph (``stats()``) and is
called as a compiled one would be (the guarded call when every input's metadata is
guarded).

File: ``<cache dir>/capture/frames/<key[:2]>/<key>``: a magic line, a JSON header (format,
key, payload size and sha256), then ``marshal`` of the records. Written to a temporary
file and moved into place (``os.replace``); on load the header, size and checksum are
checked before ``marshal`` reads it. A damaged entry warns once, is removed, and the frame
is captured; a record that does not resolve or whose guards fail is skipped (logged under
``KILN_LOG=recompiles``); a directory that cannot be written warns once (code_cache.py's
warning). ``KILN_CAPTURE_FRAMES=0`` (or ``KILN_CAPTURE_CACHE=0``) turns it off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import re
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch
from kiln_shapes.settings import cache_key

from kiln_capture import code_cache, graph_data
from kiln_capture import stats as counters
from kiln_capture.config import config
from kiln_capture.dynamic import DYNAMIC_ATTR, STATIC_ATTR
from kiln_capture.guards import (
    CONST_REF as _CONST,
)
from kiln_capture.guards import (
    Guard,
    GuardSet,
    TensorGuards,
    guard_namespace,
    tensor_metadata,
)
from kiln_capture.log import log
from kiln_capture.recipes import (
    NotPersistable,
    Unresolved,
    class_attributes,
    code_digest,
    files_of,
    import_recipe,
    recipe_of,
    resolve,
)

RELOAD_ATTR = "kiln_reload_recipe"  # on a backend's callable (design note)
# 2: the graph as marshal bytes, read only when it is rebuilt; reload recipes.
# 3: each traced file's size and time beside its sha256
FORMAT = 3
MAGIC = b"kiln-capture-frame\n"
_CHAIN = re.compile(r"[\w.\[\]()'\", -]+")  # names, attributes, items, calls of sources
_LOOSE_SPACE = re.compile(r"[^,] ")  # a space not after a comma: an operator or keyword
# names a run function may read besides its constants and the compiled graph (codegen.py)
_RUN_NAMES = frozenset(
    {
        "__builtins__",
        "__run",
        "__k_C",
        "__k_G",
        "__k_graph",
        "__k_new_object",
        "__k_MethodType",
        "__k_FunctionType",
        "__k_enable",
        "__k_cell",
        "torch",
        "math",
    }
)

# methods dataclasses and namedtuples generate (``exec`` of text made from a class body,
# in the file of a class the record names) and the standard library's frozen modules
# (Python's version is in the key): the only code not read from a file a kept capture
# may have traced
_GENERATED = frozenset({"__init__", "__new__", "__eq__", "__repr__", "__hash__", "__setattr__"})


class _Stats:
    saved = 0  # records written
    unsaved = 0  # captures not kept (a constant without recipe, a graph break...)
    loaded = 0  # entries installed from disk
    skipped = 0  # records read but not used (unresolved, guards failed)
    reloaded = 0  # graphs the backend rebuilt from a reload recipe (no graph rebuilt)


STATS = _Stats()


def enabled(ctx) -> bool:
    return config.capture_cache and config.capture_frames and ctx.recorder is None


# -- the key ---------------------------------------------------------------------------

_digest: list[str] = []


def _sources_digest() -> str:
    """kiln-capture's version and every module and extension of the package (path, size
    and modification time: an edited source never reuses a record)."""
    if not _digest:
        import kiln_capture  # its version, read once at import

        ver = getattr(kiln_capture, "__version__", "unknown")
        h = hashlib.sha256(ver.encode())
        root = os.path.dirname(os.path.realpath(__file__))
        found = []
        for folder, _, files in os.walk(root):  # os.walk: a quarter of Path.rglob's time
            for f in files:
                if f.endswith((".py", ".so", ".pyd")):  # as Python's .pyc check: size, time
                    path = os.path.join(folder, f)
                    st = os.stat(path)
                    found.append(f"{path[len(root) :]}\0{st.st_size}\0{st.st_mtime_ns}\0")
        for line in sorted(found):
            h.update(line.encode())
        _digest.append(h.hexdigest())
    return _digest[0]


def frame_key(code: types.CodeType, ctx) -> str:
    h = hashlib.sha256(f"{FORMAT}\0{sys.version}\0{torch.__version__}\0".encode())
    h.update(importlib.util.MAGIC_NUMBER)
    h.update(_sources_digest().encode())
    h.update(cache_key(config.current()).encode())
    h.update(repr((ctx.dynamic, ctx.fullgraph)).encode())
    h.update(code_digest(code).encode())
    return h.hexdigest()


def _path(key: str) -> Path:
    return code_cache.cache_root() / "frames" / key[:2] / key


_file_shas: dict[str, str | None] = {}


def _file_stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _file_sha(path: str) -> str | None:
    sha = _file_shas.get(path, "")
    if sha == "":
        try:
            sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            sha = None
        _file_shas[path] = sha
    return sha


# -- saving ----------------------------------------------------------------------------


PROCESS_SPECIFIC = "<process-specific>"


def stable_hash(value: object) -> bool:
    """Whether ``hash(value)`` is the same in every process: numbers and tuples of them
    (str and bytes hashes are salted per process, an object's is its address)."""
    if type(value) is tuple:
        return all(stable_hash(v) for v in value)
    return type(value) in (int, bool, float, complex)


def note_process_specific(out, why: str) -> None:
    """The trace used something another process would see otherwise (a set's iteration
    order, ``hash()``, ``id()``): its capture is not kept."""
    out.traced_code.add((PROCESS_SPECIFIC, why))


def _marked(t: object) -> bool:
    return bool(getattr(t, DYNAMIC_ATTR, None) or getattr(t, STATIC_ATTR, None))


def _identity_paths(gs: GuardSet) -> dict[int, str]:
    """id of each object an identity guard compares with -> the expression it reads."""
    paths: dict[int, str] = {}
    for g in gs.guards:
        if g.attrs is not None:
            base, entries = g.attrs
            for read, key, mode, value in entries:
                if mode != "i":
                    continue
                if read == "a":
                    expr = f"getattr({base}, {key!r})"
                elif read == "k":
                    expr = f"{base}[{key!r}]"
                else:
                    expr = f"{base}.__closure__[{key}].cell_contents"
                paths.setdefault(id(value), expr)
        lhs, sep, rhs = g.code.rpartition(" is ")
        m = _CONST.fullmatch(rhs) if sep else None
        # ``<source> is __k_C[i]`` (GuardSet.id_is, type_is): the source a read chain, so
        # that nothing of lower precedence (``and``, ``or``, ``not``) belongs to the left
        if m is not None and _CHAIN.fullmatch(lhs) and not _LOOSE_SPACE.search(lhs):
            paths.setdefault(id(gs.consts[int(m.group(1))]), lhs)
    return paths


def _evaluator(params: list[str], func, args: tuple, consts: list, codes: dict | None = None):
    """``evaluate(expr)``: ``expr`` read against the frame (``codes``: each expression
    compiled when the record was made, so a load compiles none of them)."""
    ns = dict(zip(params, args, strict=True))
    ns.update(__k_fn=func, __k_G=func.__globals__, __k_C=consts)
    codes = codes or {}

    def evaluate(expr: str) -> Any:
        try:
            return eval(codes.get(expr) or _expr_code(expr), ns)
        except Exception as e:  # the user's objects: anything may raise
            raise Unresolved(f"{expr}: {type(e).__name__}: {e}") from None

    return evaluate


_expr_codes: dict[str, types.CodeType] = {}


def _expr_code(expr: str) -> types.CodeType:
    """``expr`` compiled, once per process (a save evaluates each tensor input's path and
    then keeps its code: a model's hundreds of parameters compiled twice each)."""
    code = _expr_codes.get(expr)
    if code is None:
        code = _expr_codes[expr] = compile(expr, "<kiln recipe>", "eval")
    return code


def _path_exprs(consts: list, tensors: list) -> set[str]:
    """The expressions a load evaluates: each path recipe's, each tensor input's."""
    found = {t[0] for t in tensors}

    def walk(r: tuple) -> None:
        if r[0] == "path":
            found.add(r[1])
        elif r[0] == "t":
            for x in r[1]:
                walk(x)

    for r in consts:
        walk(r)
    return found


def _record(entry, code, func, args, frame_shapes) -> dict:
    if len(entry.graphs) > 1:
        raise NotPersistable("more than one graph")
    extra = set(entry.run.__globals__) - _RUN_NAMES
    if extra:
        raise NotPersistable(f"a graph break (the entry calls {sorted(extra)[0]})")
    gs: GuardSet = entry.guard_set
    if gs.shapes is not None and (gs.shapes.tensors or gs.shapes.ints):
        raise NotPersistable("symbolic sizes")
    graph = None
    if entry.graphs:
        gm = entry.graphs[0]
        graph = gm.meta.get("kiln_capture_data")
        env = gm.meta.get("shape_env")
        if graph is None or (env is not None and (env.symbols or env.has_unbacked)):
            raise NotPersistable("a graph that is not plain data")
    files = set()
    for f, name in entry.traced_code:
        if f == PROCESS_SPECIFIC:
            raise NotPersistable(f"the trace relied on this process's {name}")
        if not f.startswith("<"):
            files.add(f)
        elif not (f.startswith("<frozen ") or (f == "<string>" and name in _GENERATED)):
            raise NotPersistable(f"code that is not read from a file ({name} in {f})")
    paths = _identity_paths(gs)
    class_attributes(gs.consts, paths)
    texts = [entry.guard.__kiln_source__, entry.run.__kiln_source__, *(g.code for g in gs.guards)]
    used = {int(i) for text in texts for i in _CONST.findall(text)}
    consts = []
    for i, c in enumerate(gs.consts):
        if i not in used:  # made while tracing, read by no code of the entry
            consts.append(("v", None))
            continue
        consts.append(recipe_of(c, paths))
        files.update(files_of(c) if not isinstance(c, tuple) else ())
        if isinstance(c, tuple):
            for v in c:
                files.update(files_of(v) if type(v) not in (int, float, str, bytes, bool) else ())
    evaluate = _evaluator(entry.params, func, args, list(gs.consts))
    tensors = []
    for g in gs.guards:
        if g.tensor is None:
            continue
        t = evaluate(g.tensor)
        if _marked(t):
            raise NotPersistable("a tensor with mark_dynamic/mark_static dimensions")
        cls, dtype, device, shape, stride, requires_grad = gs.tensor_meta[g.tensor]
        r = import_recipe(cls)
        if r is None:
            raise NotPersistable(f"tensor class {cls.__qualname__} has no import path")
        tensors.append(
            (
                g.tensor,
                r,
                str(dtype).removeprefix("torch."),
                str(device),
                tuple(shape),
                tuple(stride),
                requires_grad,
                str(torch._C._dispatch_keys(t)),
            )
        )
    file_shas = []
    for f in sorted(files):
        sha = _file_sha(f)
        if sha is None:
            raise NotPersistable(f"source file {f} cannot be read")
        file_shas.append((f, sha, _file_stat(f)))
    shapes = frame_shapes or None
    return {
        # the graph: rebuilt only when the backend cannot reload its callable without it
        "graph": marshal.dumps(graph) if graph is not None else None,
        "inputs": tuple(graph[2]) if graph is not None else (),
        "reload": _reload_recipe(entry) if graph is not None else None,
        "qualname": code.co_qualname,
        "params": tuple(entry.params),
        "guard": entry.guard.__code__,
        "guard_src": getattr(entry.guard, "__kiln_source__", ""),
        "run": entry.run.__code__,
        "run_src": getattr(entry.run, "__kiln_source__", ""),
        "guards": tuple((g.code, g.what, g.tensor, g.native) for g in gs.guards),
        "native": gs.native is not None,
        "consts": tuple(consts),
        "tensors": tuple(tensors),
        "codes": {e: _expr_code(e) for e in _path_exprs(consts, tensors)},
        "files": tuple(file_shas),
        "frame_shapes": (
            tuple((k, tuple(v)) for k, v in shapes.seen.items()),
            tuple(shapes.ints.items()),
        )
        if shapes is not None
        else None,
    }


def _reload_recipe(entry) -> Any:
    """The reload recipe the backend's callable carries (design note, "Reload recipes"),
    if it is plain data."""
    recipe = getattr(entry.run.__globals__.get("__k_graph"), RELOAD_ATTR, None)
    try:
        marshal.dumps(recipe)
    except ValueError:
        return None
    return recipe


def save(code: types.CodeType, func, args: tuple, ctx, entry, frame_shapes) -> None:
    """Keep ``entry`` (just captured for ``func``'s frame with ``args``) on disk."""
    if not enabled(ctx):
        return
    try:
        record = _record(entry, code, func, args, frame_shapes)
        marshal.dumps(record)  # every value must be marshal-able
    except (NotPersistable, Unresolved, ValueError) as e:
        STATS.unsaved += 1
        log("recompiles", f"capture of {code.co_qualname} not kept on disk: {e}")
        return
    key = frame_key(code, ctx)
    old = _read(key) or []
    same = ("guard_src", "consts", "tensors")  # a record the new one replaces
    records = [record] + [r for r in old if any(r.get(k) != record[k] for k in same)]
    code_cache.write_entry(_path(key), MAGIC, FORMAT, key, records[: config.cache_size_limit])
    STATS.saved += 1


# -- loading ---------------------------------------------------------------------------


def _read(key: str) -> list | None:
    value = code_cache.read_entry(_path(key), MAGIC, FORMAT, key, "captured frames")
    if value is None:
        return None
    if type(value) is not list or not all(type(r) is dict for r in value):
        code_cache.reject(_path(key), "unexpected contents", "captured frames")
        return None
    return value


def _resolve_consts(recipes: tuple, evaluate_in, consts: list) -> None:
    """Fill ``consts`` (the list ``evaluate_in`` reads as ``__k_C``) in place, each
    constant resolved before the first path that names it."""
    done = [False] * len(recipes)
    memo: dict = {}
    busy: set[int] = set()

    def const(i: int) -> Any:
        if not done[i]:
            if i in busy:
                raise Unresolved("constants that name each other")
            busy.add(i)
            consts[i] = resolve(recipes[i], evaluate, memo)
            done[i] = True
        return consts[i]

    def evaluate(expr: str) -> Any:
        for m in _CONST.finditer(expr):
            const(int(m.group(1)))
        return evaluate_in(expr)

    for i in range(len(recipes)):
        const(i)


def _install(rec: dict, code, func, args: tuple, ctx):
    for path, sha, stat in rec["files"]:
        # the size and time it had when it was hashed: unchanged, as Python's own .pyc
        # check (hashing every traced file was ~2 ms of a warm first call)
        if (stat is None or _file_stat(path) != tuple(stat)) and _file_sha(path) != sha:
            raise Unresolved(f"{path} changed")
    params = list(rec["params"])
    if len(params) != len(args):
        raise Unresolved("another number of arguments")
    consts: list = [None] * len(rec["consts"])
    codes = rec["codes"]
    if type(codes) is not dict or not all(type(c) is types.CodeType for c in codes.values()):
        raise Unresolved("damaged expression codes")
    evaluate = _evaluator(params, func, args, consts, codes)
    _resolve_consts(rec["consts"], evaluate, consts)
    native = None
    if rec["native"]:
        if TensorGuards is None:
            raise Unresolved("the native tensor guard is not built")
        native = TensorGuards()
    tensor_meta = {}
    kinds: dict[tuple, tuple] = {}  # (class, dtype, device) -> their objects: few per model
    for expr, cls, dtype, device, shape, stride, requires_grad, keys in rec["tensors"]:
        t = evaluate(expr)
        kind = kinds.get((cls, dtype, device))
        if kind is None:
            kind = kinds[cls, dtype, device] = (
                resolve(cls, evaluate),
                getattr(torch, dtype),
                torch.device(device),
            )
        if type(t) is not kind[0] or _marked(t):  # marks: what they ask is a capture's to decide
            return None
        expected = (*kind, shape, stride, requires_grad)
        if tensor_metadata(t) != expected or str(torch._C._dispatch_keys(t)) != keys:
            return None  # this record's tensor guard fails for these arguments
        if native is not None:
            native.add(t)
        tensor_meta[expr] = expected
    guards = [Guard(c, what, tensor, nat) for c, what, tensor, nat in rec["guards"]]
    gs = GuardSet(guards=guards, consts=consts, native=native, tensor_meta=tensor_meta)
    guard = types.FunctionType(rec["guard"], guard_namespace(gs, func.__globals__), "__guard")
    guard.__kiln_source__ = rec["guard_src"]
    if not guard(func, *args):
        return None
    from kiln_capture.capture import CacheEntry, compile_captured
    from kiln_capture.codegen import namespace_of

    compiled, graphs = None, []
    if rec["graph"] is not None:
        inputs = list(rec["inputs"])
        examples = [evaluate(e) for e in inputs]
        built: list = []

        def make_graph():
            if not built:
                from kiln_shapes import ShapeEnv

                gm, _ = graph_data.rebuild(marshal.loads(rec["graph"]))
                gm.meta["shape_env"] = ShapeEnv()
                built.append(gm)
            return built[0]

        compiled = _reloaded(ctx, rec["reload"], examples, inputs, gs, make_graph)
        if compiled is None:
            gm = make_graph()
            compiled = compile_captured(ctx, gm, examples, inputs, gs)
            graphs.append(gm)
            # a recipe that did not hold (the compiler, its settings or the machine
            # changed) is replaced by the one this compile made: the next process reloads
            recipe = getattr(compiled, RELOAD_ATTR, None)
            if recipe is not None and recipe != rec["reload"]:
                try:
                    marshal.dumps(recipe)
                    rec["reload"] = recipe
                except ValueError:
                    pass
    ns = namespace_of(consts, func.__globals__, compiled, {})
    run = types.FunctionType(rec["run"], ns, "__run")
    run.__kiln_source__ = rec["run_src"]
    return CacheEntry(guard, run, gs, params, func.__globals__, graphs)


def _reloaded(ctx, recipe, examples: list, inputs: list[str], gs: GuardSet, make_graph):
    """The backend's callable rebuilt from its reload recipe without the graph (design
    note, "Reload recipes"), or None."""
    reload = getattr(ctx.backend, "kiln_reload", None)
    if recipe is None or not callable(reload):
        return None
    start = time.perf_counter()
    try:
        compiled = reload(recipe, examples, make_graph)
    except Exception as e:  # the backend's: the graph is rebuilt and compiled instead
        log("recompiles", f"a reload recipe failed ({type(e).__name__}: {e}): compiling")
        compiled = None
    seconds = time.perf_counter() - start
    ctx.backend_seconds += seconds
    if compiled is None:
        return None
    STATS.reloaded += 1
    log("timings", f"compiled graph reloaded from its recipe: {seconds:.4f} s")
    fast = getattr(compiled, "kiln_guarded_call", None)
    if callable(fast) and gs.guards_tensors(inputs, examples):
        compiled = fast  # as compile_captured: every input's metadata is guarded
    counters.bump("graphs")
    return compiled


def load(code: types.CodeType, func, args: tuple, ctx):
    """A cache entry for this frame from the disk whose guards pass, or None."""
    if not enabled(ctx):
        return None
    start = time.perf_counter()
    key = frame_key(code, ctx)
    records = _read(key)
    for rec in records or ():
        recipe = rec.get("reload")
        try:
            entry = _install(rec, code, func, args, ctx)
        except (Unresolved, KeyError, TypeError, ValueError) as e:
            entry = None
            log("recompiles", f"a kept capture of {code.co_qualname} is not used: {e}")
        if entry is None:
            STATS.skipped += 1
            continue
        STATS.loaded += 1
        if rec.get("reload") != recipe:  # the backend's callable of this process: kept
            code_cache.write_entry(_path(key), MAGIC, FORMAT, key, records)
        log(
            "timings",
            f"capture of {code.co_qualname} loaded from disk: {time.perf_counter() - start:.4f} s",
        )
        return entry, rec["frame_shapes"]
    return None


def restore_shapes(frame_shapes, data) -> None:
    """What the kept capture's frame saw, for automatic dynamic shapes (dynamic.py)."""
    if frame_shapes is None or data is None:
        return
    seen, ints = data
    frame_shapes.seen.update((k, list(v)) for k, v in seen)
    frame_shapes.ints.update(ints)


def warn_once(what: str, message: str) -> None:
    code_cache.warn_once(f"frames:{what}", message)


def reset() -> None:
    """Forget the files' digests (tests edit files)."""
    _file_shas.clear()
