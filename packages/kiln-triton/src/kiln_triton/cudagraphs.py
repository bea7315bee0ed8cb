"""CudaGraphRunner: replay a compiled graph as a CUDA graph (``mode="reduce-overhead"``).

The first call with a new input signature (shapes, strides, dtypes, devices) runs the
compiled function normally — that compiles and autotunes its kernels — then captures it
into a CUDA graph reading from static input buffers, and replays it once for its result.
Later calls copy their inputs into those buffers and replay the graph (one launch instead
of one per kernel). Parameters are used in place rather than copied (the signature
includes their addresses).

Where a graph cannot be captured the function runs as is and the reason is logged once:
inputs on the CPU, a call made during another capture, or a capture that fails
(synchronizing or allocating host-side ops). Training replays too: ``compile_fx`` wraps
the forward and the backward graph of a training step each in a runner of its own, and a
runner around the whole step lets the calls that need grad through to them.

Design note: "copied and lent outputs"
--------------------------------------
A replay writes its outputs into the same static buffers each time. The first ``copied``
outputs (all of them by default: inference results the caller may keep) are returned as
copies. The rest are *lent*: returned as new tensors over the static buffers, with no
copy. A forward graph lends the tensors it saves for the backward, a backward graph lends
the gradients (which autograd then takes as ``param.grad`` without a copy either).

A lent tensor is valid until the next replay of its runner overwrites it, so a replay
first checks that every lent tensor of the last one is dead: the use count of each lent
storage is back to what the runner itself holds. Saved tensors die once the backward ran,
gradients once ``optimizer.zero_grad()`` set them to None. While one is alive (two forwards
before a backward, gradients accumulated over several steps) the call runs without the
graph, correct and slower, and the reason is logged once.

An input that is a lent output of another runner (the backward's saved tensors, lent by
the forward's graph) is *borrowed*: the capture reads that runner's static buffer in place
and a replay only checks that the same buffer came again; otherwise (the forward ran
without its graph) the call runs without the graph.

Design note: "inputs the graph writes"
--------------------------------------
A function that updates an input in place (a KV cache, BatchNorm's running statistics)
must update the caller's tensor, not a static copy of it. The first call finds them by
their version counters, which the warm-up run advances (inference tensors have none: by
their values); the graph then reads and writes those tensors in place, and a replay
checks that the same tensor came again (otherwise the call runs without the graph, logged
once). That first call returns the warm-up's result rather than replaying, which would
write them a second time. Training graphs never write their inputs (kiln-aot's forward
returns the new values; its runtime writes them back, outside the forward's runner), so
this concerns the runner around a whole call.

Design note: "one graph per size bucket"
----------------------------------------
A graph compiled for symbolic sizes serves every size, but a CUDA graph replays the sizes
it was recorded with. A runner records at most one CUDA graph per *size bucket* (the
input signature with every size and stride rounded up to a power of two), and at most
``MAX_GRAPHS`` in all: the first size of a bucket is recorded and replays whenever it
comes again; other sizes of a recorded bucket, and new buckets past the bound, run the
compiled function without a graph (its kernels take the sizes as arguments), logged once.
So a sequence length that changes every call never records more than ``MAX_GRAPHS``
graphs, each with its own static buffers; padding inputs to a few sizes makes them replay.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from kiln_inductor import log
from kiln_inductor.index_check import deferred_checks

# training graphs need grad for their inputs outside the runner: the runner around the
# whole step passes such calls on to the forward and backward graphs' own runners
TRAINING = "inputs require grad: the training graphs' own runners replay them"
# graphs one runner records (one per size bucket) before new signatures run without
MAX_GRAPHS = 8


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    static_inputs: list[Any]
    owned: list[int]  # positions of our copies of inputs, refreshed each call
    borrowed: list[int]  # positions read in place from another runner's lent outputs
    inplace: list[int]  # positions of inputs the function writes: the caller's, in place
    static_outputs: Any
    # (storage handle, the use count the runner's own tensors make) of every lent output
    lent_storages: list[tuple[int, int]] = field(default_factory=list)
    # the graphs' index-check error rows, read after each replay (kiln_inductor.index_check)
    index_errors: list[Any] = field(default_factory=list)


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a captured graph depends on, built in one cheap pass (it runs every call)."""
    sig: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            ptr = a.data_ptr() if isinstance(a, torch.nn.Parameter) else None
            sig.append((a.shape, a.stride(), a.dtype, a.device, a.requires_grad, ptr))
        else:
            sig.append(("value", repr(a), a if type(a) is int else None))
    return tuple(sig)


def _pow2(n: Any) -> Any:
    return n if not isinstance(n, int) or n <= 1 else 1 << (n - 1).bit_length()


def _bucket(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """The size bucket of a signature: sizes, strides and int arguments rounded up to a
    power of two (the rest as it is)."""
    out: list[Any] = []
    for item in key:
        if item[0] == "value":  # an int (a size passed as a number) is bucketed too
            out.append(item if item[2] is None else ("value", _pow2(item[2])))
            continue
        shape, stride, *rest = item
        out.append((tuple(map(_pow2, shape)), tuple(map(_pow2, stride)), *rest))
    return tuple(out)


def _lent_key(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


_RUNNERS: weakref.WeakSet[CudaGraphRunner] = weakref.WeakSet()


def _lender(t: torch.Tensor) -> torch.Tensor | None:
    """The static output of a live runner that ``t`` is a lent view of, if any."""
    key = _lent_key(t)
    for runner in list(_RUNNERS):
        static = runner.lent.get(key)
        if static is not None:
            return static
    return None


def _run_finding_writes(run: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, list[int]]:
    """``run(args)``, and the positions of the tensors (not parameters) it wrote to: by
    their version counters, or for inference tensors, which have none, by their values."""
    before: list[tuple[int, Any]] = []
    for k, a in enumerate(args):
        if isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter):
            before.append((k, a.clone() if a.is_inference() else a._version))
    result = run(args)
    written = []
    for k, was in before:
        a = args[k]
        if isinstance(was, torch.Tensor):
            same = torch.equal(a, was) or (
                a.is_floating_point() and bool(((a == was) | (a.isnan() & was.isnan())).all())
            )
        else:
            same = a._version == was
        if not same:
            written.append(k)
    return result, written


class CudaGraphRunner:
    device_type = "cuda"

    def __init__(self, fn: Callable[..., Any], name: str = "graph", copied: int | None = None):
        """``copied``: how many leading outputs (of a flat tuple or list) a replay returns
        as copies; the rest are lent (module docstring). None: every output, of any
        structure, is copied."""
        self.fn, self.name, self.copied = fn, name, copied
        self.graphs: dict[tuple[Any, ...], _Captured | None] = {}
        # size bucket -> the signature recorded for it ("one graph per size bucket")
        self.buckets: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        # why a bucket can never be captured, decided once per bucket (not per size)
        self.checked: dict[tuple[Any, ...], tuple[str | None, bool]] = {}
        self.pool: Any = None
        self.replays = 0
        self.lent: dict[tuple[Any, ...], torch.Tensor] = {}  # _lent_key -> static output
        _RUNNERS.add(self)

    # -- what a call may do ------------------------------------------------------------------
    def _static_reason(self, args: tuple[Any, ...]) -> tuple[str | None, bool]:
        """(why this signature can never be captured, whether some input requires grad)."""
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or any(t.device.type != self.device_type for t in tensors):
            return f"inputs are not all {self.device_type.upper()} tensors", False
        return None, any(t.requires_grad for t in tensors)

    def why_not(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> str | None:
        if key not in self.checked:
            self.checked[key] = self._static_reason(args)
        reason, needs_grad = self.checked[key]
        if reason is not None:
            return reason
        if needs_grad and torch.is_grad_enabled():
            return TRAINING
        if self._capturing():
            return "called while another CUDA graph is being captured"
        return None

    def __call__(self, *args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], list):
            args = tuple(args[0])
        return self._call(args, self.fn)

    def guarded(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """This runner's ``kiln_guarded_call`` (kiln-aot's protocol: a call for inputs the
        caller has guarded to match the example inputs) given ``inner``, the wrapped
        function's: where no CUDA graph runs (training), ``inner`` runs instead of the
        function's checked call."""

        def call(*args: Any) -> Any:
            return self._call(args, inner)

        return call

    def _call(self, args: tuple[Any, ...], run: Callable[..., Any]) -> Any:
        key = _signature(args)
        bucket = _bucket(key)
        reason = self.why_not(bucket, args)
        if reason is not None:
            if reason is not TRAINING:
                log.warn_once(f"cudagraphs:{reason}", f"kiln-triton: CUDA graphs skipped: {reason}")
            return run(*args)
        if key not in self.graphs:
            if bucket in self.buckets:
                log.warn_once(
                    f"cudagraphs-bucket:{self.name}",
                    f"kiln-triton: {self.name} ran without a CUDA graph for sizes it has no "
                    "graph of: it records one graph per size bucket (sizes rounded up to a "
                    "power of two), for the first sizes of each (pad inputs to one size per "
                    "bucket to replay)",
                )
                return run(*args)
            if len(self.graphs) >= MAX_GRAPHS:
                log.warn_once(
                    f"cudagraphs-many:{self.name}",
                    f"kiln-triton: {self.name} has captured {MAX_GRAPHS} CUDA graphs, one per "
                    "input signature and size bucket (shapes, strides, dtypes): new ones run "
                    "without a graph, and each graph keeps its own buffers (pad inputs to a "
                    "few sizes to replay)",
                )
                return run(*args)
            self.buckets[bucket] = key
            return self._first_call(key, args)
        entry = self.graphs[key]
        if entry is None:
            return self.fn(*args)
        return self._replay(entry, args)

    # -- capture -----------------------------------------------------------------------------
    def _first_call(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
        result, written = _run_finding_writes(self._warm_up, args)  # compiles, autotunes
        try:
            entry = self.graphs[key] = self._capture(args, written)
            log.log("cudagraphs", f"{self.name}: captured a CUDA graph for {len(args)} inputs")
        except Exception as e:
            self.graphs[key] = None
            log.warn_once(
                f"cudagraphs-capture:{self.name}:{type(e).__name__}",
                f"kiln-triton: CUDA graph capture of {self.name} failed, running it without: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            )
            return result
        if written:  # the warm-up wrote them once already: a replay would write them again
            return result
        del result
        return self._replay(entry, args)

    def _capture(self, args: tuple[Any, ...], written: Sequence[int] = ()) -> _Captured:
        statics: list[Any] = []
        owned: list[int] = []
        borrowed: list[int] = []
        for k, a in enumerate(args):
            if not isinstance(a, torch.Tensor) or isinstance(a, torch.nn.Parameter):
                statics.append(a)
                continue
            if k in written:  # a buffer the function updates (a cache, running stats)
                statics.append(a)
                continue
            lender = _lender(a)
            if lender is not None:
                statics.append(lender)
                borrowed.append(k)
                continue
            s = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            s.copy_(a)
            statics.append(s)
            owned.append(k)
        with deferred_checks() as index_errors:
            graph, outputs = self._record(statics)
        entry = _Captured(graph, statics, owned, borrowed, list(written), outputs)
        entry.index_errors = index_errors
        if self.copied is not None:
            self._lend(entry, args)
        return entry

    def _lend(self, entry: _Captured, args: tuple[Any, ...]) -> None:
        """Record the lent outputs: their storages' use counts now, while only the runner's
        own tensors hold them, and their keys, for runners borrowing them."""
        outs = entry.static_outputs
        assert isinstance(outs, (tuple, list)), "lent outputs need a flat tuple or list"
        # the caller's tensors (parameters), which no replay writes, need no check
        theirs = {
            s.untyped_storage()._cdata
            for k, s in enumerate(entry.static_inputs)
            if isinstance(s, torch.Tensor) and k not in entry.owned
        }
        seen: set[int] = set()
        for t in outs[self.copied :]:
            if not isinstance(t, torch.Tensor):
                continue
            self.lent[_lent_key(t)] = t
            handle = t.untyped_storage()._cdata
            if handle not in theirs and handle not in seen:
                seen.add(handle)
                entry.lent_storages.append((handle, torch._C._storage_Use_Count(handle)))

    # -- replay ------------------------------------------------------------------------------
    def _replay(self, entry: _Captured, args: tuple[Any, ...]) -> Any:
        if entry.lent_storages and not self._lent_returned(entry):
            log.warn_once(
                f"cudagraphs-lent:{self.name}",
                f"kiln-triton: {self.name} ran without its CUDA graph: tensors its last replay "
                "lent out are still alive (a second forward before the backward, or "
                "gradients kept across steps: optimizer.zero_grad() with set_to_none=True "
                "lets it replay)",
            )
            return self.fn(*args)
        statics = entry.static_inputs
        for k in entry.borrowed:
            if args[k].data_ptr() != statics[k].data_ptr():
                return self.fn(*args)  # the lender ran without its graph
        for k in entry.inplace:
            if args[k].data_ptr() != statics[k].data_ptr():
                log.warn_once(
                    f"cudagraphs-inplace:{self.name}",
                    f"kiln-triton: {self.name} ran without its CUDA graph: it writes to an "
                    "input, which came in another tensor than at capture (pass the same "
                    "buffer on every call to replay)",
                )
                return self.fn(*args)
        for k in entry.owned:
            a, s = args[k], statics[k]
            if a.data_ptr() != s.data_ptr():
                s.copy_(a)
        entry.graph.replay()
        self.replays += 1
        for errors in entry.index_errors:
            try:
                errors.check()
            except (IndexError, RuntimeError) as e:
                if entry.inplace:  # the replay ran to its end, writing them with bad rows
                    e.add_note(
                        f"kiln-triton: the CUDA graph of {self.name} writes inputs "
                        f"{entry.inplace} in place; this replay may have updated them"
                    )
                raise
        outs = entry.static_outputs
        if self.copied is None:
            return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, outs)
        n = self.copied
        result = [
            t if not isinstance(t, torch.Tensor) else t.clone() if k < n else t.detach()
            for k, t in enumerate(outs)
        ]
        return tuple(result) if isinstance(outs, tuple) else result

    @staticmethod
    def _lent_returned(entry: _Captured) -> bool:
        count = torch._C._storage_Use_Count
        return all(count(handle) == mine for handle, mine in entry.lent_storages)

    # -- the device (a subclass in the tests replaces these on the CPU) ----------------------
    def _capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def _warm_up(self, args: Sequence[Any]) -> Any:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            result = self.fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        return result

    def _record(self, statics: list[Any]) -> tuple[Any, Any]:
        graph = torch.cuda.CUDAGraph()
        # graphs of one runner (one per input signature) share a memory pool: a capture may
        # place its outputs where an earlier graph kept temporaries, which that graph's
        # replays then overwrite. Copied outputs are copied right after their own replay,
        # before any other; lent ones may outlive it, so each lending graph gets its own pool
        if self.pool is None or self.copied is not None:
            self.pool = torch.cuda.graph_pool_handle()
        # a capture that fails leaves the device's generator in capture mode (its epilogue
        # never runs), and every later random op raises "Offset increment outside graph
        # capture encountered unexpectedly": give it back its state from before
        rng = torch.cuda.default_generators[torch.cuda.current_device()]
        before = rng.clone_state()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.fn(*statics)
        except BaseException:
            rng.graphsafe_set_state(before)
            raise
        return graph, outputs
