"""The persistent compiled-artifact cache: a process that meets a graph another process
already compiled runs it without tracing, partitioning, lowering or generating code.

# What an entry holds

One entry per torch-level graph, input signature and grad mode: kiln-aot's runtime plan
(``InferencePlan``: the compiled graph and the trace's output, alias and mutation info;
``TrainingPlan``: the compiled forward and backward, the saved-value layout, which inputs
get gradients...), each compiled graph as its ``GraphArtifact``: the wrapper's source and
globals, the source of each kernel (loaded again through the device's backend, whose
kernel cache holds the binaries), the ops the wrapper calls, and the warnings its
compilation gave (replayed on a hit, so an eager path still says so).

# Backward variants

kiln-aot compiles a training plan's backward on its first call, once per set of tangent
strides (kiln-aot's backward_variants.py). The entry of such a plan holds the forward,
each backward variant compiled so far (``graphs[1:]``, keyed by tangent strides in
``backward["keys"]``) and the uncompiled backward graph as plain data (kiln-aot's
graph_data.py: ops by name, no pickled code; None where the graph has symbolic sizes).
The entry is written again each time a variant compiles, so a warm process runs the
backward for the strides the last one met without compiling or copying, and compiles
new strides from the stored graph. A plan with neither (a backward not yet run, of a
graph that cannot be stored) is saved once its backward has compiled.

# The key

sha256 of: this file's ``FORMAT``; the graph (its code; each node's target and the
metadata of its ``meta["val"]``: shapes and strides, symbolic ones as expressions, dtypes,
devices, and whether ``meta["kiln_indices_checked"]`` drops its index check; the ranges, hints and guards of its size symbols; the contents of tensor
constants it holds); the example inputs' metadata; the plan's signature (kiln-aot's plan
cache key: every input's metadata, grad mode, the module's training flag); the versions
of kiln's packages, torch, Triton and Python, and a digest of the compiler's own source
files (path, size and modification time of each: an edited source tree never reuses an
entry); the device (machine, CPU model and
core count, or the GPU's name and capability); the ``affects_cache`` settings of
kiln-aot, kiln-inductor and the device's kernel backend.

# The file

``<cache dir>/artifacts/<key[:2]>/<key>``: a magic line, a JSON header line (format, key,
versions, payload size and sha256), then the payload (a pickle). It is written to a
temporary file beside it and moved into place with ``os.replace``: a reader sees a whole
entry or none, and processes compiling the same graph at once each write a whole entry
(the last one stays). On load the header is checked before the payload is unpickled; an
entry that fails a check (truncated, corrupt, another format or versions) warns once,
is removed and compiled again: it never runs. A cache directory that cannot be written
warns once; the process then compiles without saving (entries already there still load).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import io
import json
import os
import pickle
import platform
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx
from kiln_shapes import env_of
from kiln_shapes.settings import cache_key, registered

from kiln_aot.backward_variants import BackwardVariants
from kiln_aot.runtime import InferencePlan, TrainingPlan

from .. import log
from ..backend import get_backend, registered_backends
from ..compile import GraphArtifact, graph_debug_dir, wrapper_graph
from ..config import cache_dir, read_config
from ..wrapper import call_target
from .cache import digest

FORMAT = 2  # 2: a training plan's backward variants and uncompiled backward graph
MAGIC = b"kiln-artifact\n"
# packages whose versions are part of every key (and checked again in each entry's header)
_VERSIONED = (
    "kiln",
    "kiln-shapes",
    "kiln-aot",
    "kiln-inductor",
    "kiln-cpp",
    "kiln-triton",
    "torch",
    "triton",
)


@dataclass
class ArtifactStats:
    hits: int = 0
    misses: int = 0
    saves: int = 0
    rejected: int = 0  # entries found damaged or stale: removed and compiled again
    unsaved: int = 0  # plans that could not be serialized or written
    key_s: float = 0.0
    load_s: float = 0.0
    save_s: float = 0.0


STATS = ArtifactStats()
_warned: set[str] = set()
_unwritable: set[str] = set()  # roots a write failed in: not tried again in this process


class DamagedEntry(Exception):
    """An entry that must not run (the message says why)."""


def _warn(kind: str, message: str) -> None:
    """Log ``message``; warn the first time per ``kind`` in this process."""
    log.log("cache", message)
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(f"kiln: {message}", RuntimeWarning, stacklevel=3)


# -- the key ---------------------------------------------------------------------------------


@functools.cache
def versions() -> dict[str, str]:
    """Versions of what builds and runs an entry (part of its key and checked on load).
    A package already imported gives its ``__version__`` (read from its metadata at
    import); the others are looked up (about 0.25 ms each)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__}
    for pkg in _VERSIONED:
        if pkg == "torch":
            continue
        module = sys.modules.get(pkg.replace("-", "_"))
        found = getattr(module, "__version__", None) if pkg.startswith("kiln") else None
        if isinstance(found, str):
            out[pkg] = found
            continue
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "-"
    out["python"] = sys.version.split()[0]
    return out


@functools.cache
def _source_digest(packages: tuple[str, ...]) -> str:
    """sha256 of the path, size and modification time of every Python source of
    ``packages`` (an editable install changes code without changing its version; as
    Python's own ``.pyc`` check, a stat per file: reading and hashing the sources cost
    ~3 ms of a warm process's first call)."""
    h = hashlib.sha256()
    for name in packages:
        module = sys.modules.get(name) or importlib.import_module(name)
        root = os.path.dirname(module.__file__ or "")
        found = []
        for folder, _, files in os.walk(root):  # os.walk: a quarter of Path.rglob's time
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    st = os.stat(path)
                    found.append(f"{path[len(root) :]}\0{st.st_size}\0{st.st_mtime_ns}\0")
        for line in sorted(found):
            h.update(line.encode())
    return h.hexdigest()


@functools.cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _device_key(devices: Sequence[torch.device]) -> list[str]:
    out = [platform.machine(), _cpu_model(), str(os.cpu_count())]
    for d in devices:
        if d.type == "cuda" and torch.cuda.is_available():
            index = d.index if d.index is not None else torch.cuda.current_device()
            cap = torch.cuda.get_device_capability(index)
            out.append(f"{torch.cuda.get_device_name(index)} sm{cap[0]}{cap[1]}")
    return out


def _backend_packages(device_types: Sequence[str]) -> list[str]:
    backends = registered_backends()
    found = {type(backends[t]).__module__.split(".")[0] for t in device_types if t in backends}
    return sorted(found)


def _settings_key(packages: Sequence[str]) -> str:
    """The ``affects_cache`` settings of kiln-aot, kiln-inductor and the backends in use."""
    known = registered()
    names = ["kiln-aot", "kiln-inductor", *(p.replace("_", "-") for p in packages)]
    return ";".join(f"{n}:{cache_key(known[n].current())}" for n in names if n in known)


def _describe(value: Any) -> Any:
    """The metadata of a node's value that its compiled code depends on."""
    if isinstance(value, torch.Tensor):
        try:
            stride = tuple(str(s) for s in value.stride())
        except RuntimeError:  # sparse and other layouts without strides
            stride = ()
        shape = tuple(str(s) for s in value.shape)
        return ("T", shape, stride, str(value.dtype), str(value.device), value.requires_grad)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("S", str(value))
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return repr(value)
    return type(value).__qualname__


def _code_digest(code: types.CodeType) -> str:
    parts: list[Any] = [code.co_code, code.co_names]
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            parts.append(_code_digest(c))
        elif isinstance(c, frozenset):
            parts.append(sorted(repr(x) for x in c))
        else:
            parts.append(repr(c))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _tensor_digest(t: torch.Tensor) -> str:
    if t.device.type == "meta":
        return "meta"
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def _target(node: torch.fx.Node, gm: torch.fx.GraphModule, state: set[int]) -> Any:
    t = node.target
    if node.op == "call_function":
        name = f"{getattr(t, '__module__', '')}.{getattr(t, '__qualname__', repr(t))}"
        code = getattr(t, "__code__", None)
        return (name, _code_digest(code)) if isinstance(code, types.CodeType) else name
    if node.op == "get_attr":
        value: Any = gm
        for part in str(t).split("."):
            value = getattr(value, part)
        if isinstance(value, torch.Tensor):
            # parameters and buffers become graph inputs; other tensors are baked in
            return _describe(value) if id(value) in state else _tensor_digest(value)
        return repr(value) if isinstance(value, (int, float, bool, str)) else type(value).__name__
    if node.op == "call_module":
        sub = gm.get_submodule(str(t))
        return (type(sub).__module__, type(sub).__qualname__, repr(sub))
    return str(t)


def graph_key(gm: Any, example_inputs: Sequence[Any]) -> str | None:
    """The graph's part of the key (module docstring); None: not a graph this cache keys."""
    if not isinstance(gm, torch.fx.GraphModule):
        return None
    h = hashlib.sha256(gm.code.encode())
    state = {id(t) for t in (*gm.parameters(), *gm.buffers())}
    values = []
    for n in gm.graph.nodes:
        val = n.meta.get("val", n.meta.get("example_value"))
        values.append(val)
        # a node's own promise that its indices were checked before drops its check
        checked = bool(n.meta.get("kiln_indices_checked"))
        h.update(repr((n.op, n.name, _target(n, gm, state), _describe(val), checked)).encode())
    env = env_of(v for v in values if isinstance(v, (torch.Tensor, torch.SymInt)))
    if env is not None:
        h.update(repr((env.describe(), [str(g) for g in getattr(env, "guards", ())])).encode())
    h.update(repr([_describe(a) for a in example_inputs]).encode())
    return h.hexdigest()


# -- plans to and from plain state ----------------------------------------------------------


def _graph_state(graph: Any) -> dict[str, Any] | None:
    art: GraphArtifact | None = getattr(graph, "artifact", None)
    if art is None:
        return None
    rebuilt = set(art.kernels) | set(art.call_targets)
    return {
        "device": art.device,
        "source": art.source,
        "globals": {k: v for k, v in art.globals.items() if k not in rebuilt},
        "kernels": art.kernels,
        "call_targets": art.call_targets,
        "layouts": art.layouts,
        "stats": art.stats,
        "warnings": art.warnings,
    }


def plan_state(plan: Any) -> dict[str, Any] | None:
    """A plan as plain data (None: it holds a graph kiln-inductor did not compile, or a
    backward it could neither run nor compile again)."""
    backward = None
    if isinstance(plan, InferencePlan):
        graphs = [plan.compiled]
        fields = {"info": plan.info, "num_user": plan.num_user}
    elif isinstance(plan, TrainingPlan):
        fields = {
            f.name: getattr(plan, f.name)
            for f in dataclasses.fields(plan)
            if f.name not in ("fw", "bw")
        }
        if plan.variants is None:
            graphs = [plan.fw, plan.bw]
        else:  # module docstring, "Backward variants"
            backward, compiled = plan.variants.state()
            if backward["graph"] is None and not compiled:
                return None  # nothing to run a backward with yet: saved once one compiled
            graphs = [plan.fw, *compiled]
    else:
        return None
    states = [_graph_state(g) for g in graphs]
    if any(s is None for s in states):
        return None
    return {"kind": type(plan).__name__, "graphs": states, "fields": fields, "backward": backward}


def _rebuild_graph(state: dict[str, Any]) -> Any:
    g = dict(state["globals"])
    names = list(state["kernels"])
    if names:
        backend = get_backend(state["device"])
        g.update(zip(names, backend.load_kernels([state["kernels"][n] for n in names])))
    for name, op in state["call_targets"].items():
        g[name] = call_target(op)
    gid, debug = graph_debug_dir(read_config())
    if debug is not None:  # what a hit has of the stages' dumps
        debug.mkdir(parents=True, exist_ok=True)
        (debug / "wrapper.py").write_text(state["source"])
        for name, src in state["kernels"].items():
            (debug / f"{name}.{src.language}").write_text(src.source)
    stats = {**state["stats"], "artifact_cache": "hit"}
    compiled = wrapper_graph(state["source"], g, stats, state["layouts"], gid)
    compiled.artifact = GraphArtifact(
        state["device"],
        state["source"],
        g,
        state["kernels"],
        state["call_targets"],
        state["layouts"],
        stats,
        state["warnings"],
    )
    for key, message in state["warnings"]:  # an eager path says so in every process
        log.warn_once(key, message)
    return compiled


def rebuild_plan(state: dict[str, Any]) -> Any:
    graphs = [_rebuild_graph(s) for s in state["graphs"]]
    if state["kind"] == "InferencePlan":
        return InferencePlan(graphs[0], **state["fields"])
    if state["kind"] == "TrainingPlan" and state["backward"] is None:
        return TrainingPlan(fw=graphs[0], bw=graphs[1], **state["fields"])
    if state["kind"] == "TrainingPlan":
        plan = TrainingPlan(fw=graphs[0], bw=None, **state["fields"])
        plan.variants = BackwardVariants.restore(state["backward"], graphs[1:])
        return plan
    raise DamagedEntry(f"holds an unknown plan kind {state['kind']!r}")


class _Pickler(pickle.Pickler):
    """Ops and modules by name (an OpOverload does not pickle)."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            return ("op", obj._schema.name, obj._overloadname)
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        return None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "op":
            namespace, name = pid[1].split("::")
            return getattr(getattr(getattr(torch.ops, namespace), name), pid[2])
        if pid[0] == "module":
            return importlib.import_module(pid[1])
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def _dumps(state: Any) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():  # torch's pytree deprecation notes while pickling specs
        warnings.simplefilter("ignore", FutureWarning)
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return buf.getvalue()


# -- the files -------------------------------------------------------------------------------


class ArtifactCache:
    """The entries under ``<root>/artifacts`` (module docstring, "The file")."""

    def __init__(self, root: Path | None = None):
        self.root = (root or cache_dir()) / "artifacts"

    def path(self, key: str) -> Path:
        return self.root / key[:2] / key

    def load(self, key: str) -> Any | None:
        """The state stored under ``key``, or None (missing; or damaged: then removed)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            _warn("unreadable", f"cannot read the artifact cache entry {path} ({e}): compiling")
            return None
        try:
            return self._decode(key, data)
        except DamagedEntry as e:
            self.reject(key, str(e))
            return None

    def reject(self, key: str, why: str) -> None:
        STATS.rejected += 1
        path = self.path(key)
        _warn("damaged", f"artifact cache entry {path} {why}: removed, compiling the graph again")
        try:
            path.unlink()
        except OSError:
            pass

    @staticmethod
    def _decode(key: str, data: bytes) -> Any:
        if not data.startswith(MAGIC):
            raise DamagedEntry("is not a kiln artifact (bad magic line)")
        end = data.find(b"\n", len(MAGIC))
        if end < 0:
            raise DamagedEntry("is truncated (no header)")
        try:
            header = json.loads(data[len(MAGIC) : end])
            size, sha = int(header["size"]), str(header["sha256"])
        except (ValueError, KeyError, TypeError) as e:
            raise DamagedEntry(f"has an unreadable header ({e})") from None
        if header.get("format") != FORMAT:
            raise DamagedEntry(f"has format {header.get('format')}, this kiln reads {FORMAT}")
        if header.get("key") != key:
            raise DamagedEntry("holds another key")
        if header.get("versions") != versions():
            raise DamagedEntry(f"was written by {header.get('versions')}, this is {versions()}")
        payload = data[end + 1 :]
        if len(payload) != size:
            raise DamagedEntry(f"is truncated ({len(payload)} of {size} bytes)")
        if hashlib.sha256(payload).hexdigest() != sha:
            raise DamagedEntry("is corrupt (checksum mismatch)")
        try:
            with warnings.catch_warnings():  # torch's pytree deprecation notes
                warnings.simplefilter("ignore", FutureWarning)
                return _Unpickler(io.BytesIO(payload)).load()
        except Exception as e:
            raise DamagedEntry(f"cannot be read ({type(e).__name__}: {e})") from None

    def save(self, key: str, state: Any) -> bool:
        """Write ``state`` under ``key`` atomically; False (and a warning once) if the
        directory cannot be written."""
        if str(self.root) in _unwritable:
            return False
        payload = _dumps(state)
        header = {
            "format": FORMAT,
            "key": key,
            "versions": versions(),
            "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
        path = self.path(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".tmp-{key[:8]}-", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + json.dumps(header).encode() + b"\n" + payload)
            os.replace(tmp, path)
            return True
        except OSError as e:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            _unwritable.add(str(self.root))
            _warn(
                "unwritable",
                f"cannot write the artifact cache under {self.root} ({e}): running without "
                "the persistent cache (set KILN_CACHE_DIR to a writable directory, or "
                "KILN_ARTIFACT_CACHE=0)",
            )
            return False


class PlanStore:
    """kiln-aot's ``PlanStore`` for one graph: the plans of its signatures, in the cache."""

    def __init__(self, cache: ArtifactCache, graph_key: str):
        self.cache, self.graph_key = cache, graph_key
        self.recipe: tuple | None = None  # set by plan_store_for

    def key(self, signature: tuple) -> str:
        return digest(self.graph_key, repr(signature))

    def load(self, signature: tuple) -> Any | None:
        start = time.perf_counter()
        key = self.key(signature)
        state = self.cache.load(key)
        if state is None:
            STATS.misses += 1
            log.log("cache", f"artifact cache miss: {key[:16]}")
            return None
        try:
            plan = rebuild_plan(state)
        except Exception as e:  # e.g. an op this process does not register
            self.cache.reject(key, f"cannot be rebuilt ({type(e).__name__}: {e})")
            STATS.misses += 1
            return None
        seconds = time.perf_counter() - start
        STATS.hits += 1
        STATS.load_s += seconds
        log.log("cache", f"artifact cache hit: {key[:16]}")
        log.log("timings", f"artifact-load: {seconds:.4f} s")
        return plan

    def save(self, signature: tuple, plan: Any) -> None:
        start = time.perf_counter()
        key = self.key(signature)
        try:
            state = plan_state(plan)
            saved = state is not None and self.cache.save(key, state)
        except Exception as e:  # a value in the plan that does not pickle
            log.log("cache", f"artifact cache: plan not saved ({type(e).__name__}: {e})")
            saved = False
        if not saved:
            STATS.unsaved += 1
            return
        seconds = time.perf_counter() - start
        STATS.saves += 1
        STATS.save_s += seconds
        log.log("timings", f"artifact-save: {seconds:.4f} s")


def _devices(example_inputs: Sequence[Any]) -> list[torch.device]:
    return sorted({a.device for a in example_inputs if isinstance(a, torch.Tensor)}, key=str) or [
        torch.device("cpu")
    ]


def context_key(devices: Sequence[torch.device]) -> str:
    """The part of every key that is not the graph's: versions, the compiler's sources,
    the machine, the ``affects_cache`` settings, the default dtype (module docstring)."""
    packages = _backend_packages(sorted({d.type for d in devices}))
    return digest(
        str(FORMAT),
        json.dumps(versions(), sort_keys=True),
        _source_digest(("kiln_shapes", "kiln_aot", "kiln_inductor", *packages)),
        repr(_device_key(devices)),
        _settings_key(packages),
        str(torch.get_default_dtype()),
    )


def plan_store_for(gm: Any, example_inputs: Sequence[Any]) -> PlanStore | None:
    """The store of ``gm``'s plans, or None (cache off, or a callable that is no graph).
    ``store.recipe`` names it without the graph: ``(devices, context key, graph key)``
    (runtime/reload.py finds it again from these)."""
    if not read_config().artifact_cache:
        return None
    start = time.perf_counter()
    gkey = graph_key(gm, example_inputs)
    if gkey is None:
        return None
    devices = _devices(example_inputs)
    context = context_key(devices)
    store = PlanStore(ArtifactCache(), digest(context, gkey))
    store.recipe = (tuple(str(d) for d in devices), context, gkey)
    STATS.key_s += time.perf_counter() - start
    return store
