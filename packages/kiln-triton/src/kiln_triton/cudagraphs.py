"""CudaGraphRunner: replay a compiled graph as a CUDA graph (``mode="reduce-overhead"``).

The first call with a new input signature (shapes, strides, dtypes, devices) runs the
compiled function normally — that compiles and autotunes its kernels — and then captures
it into a CUDA graph reading from static input buffers. Later calls copy their inputs into
those buffers, replay the graph (one launch instead of one per kernel), and return copies
of the static outputs, so results stay valid after the next call. Parameters are used in
place rather than copied (the signature includes their addresses).

Where a graph cannot be captured the function runs as is and the reason is logged once:
inputs on the CPU, inputs that require grad (training), a call made during another
capture, or a capture that fails (synchronizing or allocating host-side ops).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from kiln_inductor import log


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    static_inputs: list[Any]
    owned: list[bool]  # True: our copy, refreshed each call; False: the caller's tensor
    static_outputs: Any


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a captured graph depends on, built in one cheap pass (it runs every call)."""
    sig: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            ptr = a.data_ptr() if isinstance(a, torch.nn.Parameter) else None
            sig.append((a.shape, a.stride(), a.dtype, a.device, a.requires_grad, ptr))
        else:
            sig.append(("value", repr(a)))
    return tuple(sig)


def _static_reason(args: tuple[Any, ...]) -> tuple[str | None, bool]:
    """(why this signature can never be captured, whether some input requires grad)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or any(t.device.type != "cuda" for t in tensors):
        return "inputs are not all CUDA tensors", False
    return None, any(t.requires_grad for t in tensors)


class CudaGraphRunner:
    def __init__(self, fn: Callable[..., Any], name: str = "graph"):
        self.fn, self.name = fn, name
        self.graphs: dict[tuple[Any, ...], _Captured | None] = {}
        self.checked: dict[tuple[Any, ...], tuple[str | None, bool]] = {}
        self.pool: Any = None
        self.replays = 0

    def why_not(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> str | None:
        if key not in self.checked:
            self.checked[key] = _static_reason(args)
        reason, needs_grad = self.checked[key]
        if reason is not None:
            return reason
        if needs_grad and torch.is_grad_enabled():
            return "inputs require grad (training graphs run without CUDA graphs)"
        if torch.cuda.is_current_stream_capturing():
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
        reason = self.why_not(key, args)
        if reason is not None:
            log.warn_once(f"cudagraphs:{reason}", f"kiln-triton: CUDA graphs skipped: {reason}")
            return run(*args)
        if key not in self.graphs:
            return self._first_call(key, args)
        entry = self.graphs[key]
        if entry is None:
            return self.fn(*args)
        return self._replay(entry, args)

    def _first_call(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            result = self.fn(*args)  # compiles, autotunes, warms up
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        try:
            self.graphs[key] = self._capture(args)
            log.log("cudagraphs", f"{self.name}: captured a CUDA graph for {len(args)} inputs")
        except Exception as e:
            self.graphs[key] = None
            log.warn_once(
                f"cudagraphs-capture:{self.name}:{type(e).__name__}",
                f"kiln-triton: CUDA graph capture of {self.name} failed, running it without: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            )
        return result

    def _capture(self, args: tuple[Any, ...]) -> _Captured:
        statics: list[Any] = []
        owned: list[bool] = []
        for a in args:
            if isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter):
                s = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                s.copy_(a)
                statics.append(s)
                owned.append(True)
            else:
                statics.append(a)
                owned.append(False)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
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
        return _Captured(graph, statics, owned, outputs)

    def _replay(self, entry: _Captured, args: tuple[Any, ...]) -> Any:
        for a, s, mine in zip(args, entry.static_inputs, entry.owned):
            if mine and a.data_ptr() != s.data_ptr():
                s.copy_(a)
        entry.graph.replay()
        self.replays += 1
        return pytree.tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) else t, entry.static_outputs
        )
