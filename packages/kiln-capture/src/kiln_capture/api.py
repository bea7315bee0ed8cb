"""The public API: optimize, explain, disable, reset."""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn

from kiln_capture import _C, call_reuse
from kiln_capture.breaks import GraphBreak
from kiln_capture.hook import Context, Recorder, context_stack, force_capture, reset


class _Enabled:
    """Push a capture context and turn the frame hook on for this thread."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def __enter__(self) -> None:
        context_stack().append(self.ctx)
        self.prev = _C.set_enabled(True)

    def __exit__(self, *exc) -> None:
        _C.set_enabled(self.prev)
        context_stack().pop()


def run_enabled(ctx: Context, fn, args: tuple, kwargs: dict):
    """``fn(*args, **kwargs)`` with ``ctx`` pushed and the hook on: ``_Enabled`` written
    out, for the per-call path (a ``with`` of an object costs ~3 us more a call)."""
    stack = context_stack()
    stack.append(ctx)
    prev = _C.set_enabled(True)
    try:
        return fn(*args, **kwargs)
    finally:
        _C.set_enabled(prev)
        stack.pop()


class OptimizedModule(nn.Module):
    """An nn.Module whose calls run under capture; parameters stay those of the original."""

    # called inside captured code, the original module is traced (evaluator.Frame.call)
    __kiln_inline__ = "_orig_mod"

    def __init__(self, mod: nn.Module, ctx: Context) -> None:
        super().__init__()
        self._orig_mod = mod
        self._kiln_ctx = ctx

    def forward(self, *args, **kwargs):
        return run_enabled(self._kiln_ctx, self._orig_mod, args, kwargs)


def optimize(backend, fullgraph: bool = False, dynamic: bool | None = None):
    """Return a decorator: ``optimize(backend)(fn_or_module)`` captures graphs for ``backend``.

    ``backend(gm: torch.fx.GraphModule, example_inputs: list) -> callable`` is called once
    per captured graph (the protocol of torch.compile custom backends).

    ``dynamic``: ``True`` makes every dimension of every tensor argument symbolic (sizes
    0 and 1 aside); ``None`` (the default) specializes the first compile and makes the
    dimensions whose size changed symbolic when the frame compiles again; ``False``
    specializes every size. ``mark_dynamic``/``mark_static`` override it per dimension.
    """
    if dynamic is not None and type(dynamic) is not bool:
        raise TypeError(f"optimize(dynamic=...) takes None, True or False, got {dynamic!r}")
    ctx = Context(backend=backend, fullgraph=fullgraph, dynamic=dynamic)

    def wrap(obj):
        if isinstance(obj, nn.Module):
            return OptimizedModule(obj, ctx)

        code = getattr(getattr(obj, "__func__", obj), "__code__", None)
        if isinstance(code, types.CodeType):
            force_capture(code)

        @functools.wraps(obj)
        def optimized(*args, **kwargs):
            return run_enabled(ctx, obj, args, kwargs)

        optimized._kiln_ctx = ctx
        optimized.__kiln_inline__ = "__wrapped__"  # functools.wraps: obj
        return optimized

    return wrap


def disable(fn=None):
    """Run ``fn`` without capture (also inside an optimized function: a graph break there)."""
    if fn is None:
        return disable

    @functools.wraps(fn)
    def disabled(*args, **kwargs):
        prev = _C.set_enabled(False)
        try:
            return fn(*args, **kwargs)
        finally:
            _C.set_enabled(prev)

    disabled._kiln_disabled = True
    return disabled


@dataclass
class ExplainOutput:
    graphs: list[fx.GraphModule] = field(default_factory=list)
    breaks: list[GraphBreak] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)
    recompiles: list[str] = field(default_factory=list)
    result: Any = None
    symbols: list[str] = field(default_factory=list)  # "s0 in [2, inf] (hint 8) from x.size(0)"
    shape_guards: list[str] = field(default_factory=list)  # "s0 > 8  # model.py:12"
    eager_frames: list[str] = field(default_factory=list)  # frames that run eagerly, and why
    # calls of modules compiled as regions of their own (fully_shard units): not breaks
    region_boundaries: list[GraphBreak] = field(default_factory=list)
    # module calls replayed from an earlier identical call's trace (call_reuse.py)
    reused_calls: list[str] = field(default_factory=list)

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def break_count(self) -> int:
        return len(self.breaks)

    # torch._dynamo.explain's names, for code written against it
    @property
    def graph_break_count(self) -> int:
        return len(self.breaks)

    @property
    def break_reasons(self) -> list[GraphBreak]:
        return self.breaks

    @property
    def out_guards(self) -> list[str]:
        return self.guards

    @property
    def ops_per_graph(self) -> list[list[Any]]:
        return [[n.target for n in gm.graph.nodes if n.op.startswith("call")] for gm in self.graphs]

    @property
    def op_count(self) -> int:
        return sum(len(ops) for ops in self.ops_per_graph)

    def __str__(self) -> str:
        lines = [
            f"graphs: {self.graph_count}, graph breaks: {self.break_count}, recompiles: {len(self.recompiles)}"
        ]
        for i, gm in enumerate(self.graphs):
            ops = sum(1 for n in gm.graph.nodes if n.op.startswith("call"))
            lines.append(f"--- graph {i} ({ops} ops) ---\n{gm.code.strip()}")
        for b in self.breaks:
            lines.append(f"--- break ---\n{b}")
        if self.guards:
            lines.append("--- guards ---\n  " + "\n  ".join(self.guards))
        if self.symbols:
            lines.append("--- symbols ---\n  " + "\n  ".join(self.symbols))
        if self.shape_guards:
            lines.append("--- shape guards ---\n  " + "\n  ".join(self.shape_guards))
        for r in self.recompiles:
            lines.append(f"--- recompile ---\n{r}")
        for e in self.eager_frames:
            lines.append(f"--- runs eagerly ---\n{e}")
        for b in self.region_boundaries:
            lines.append(f"--- region boundary (not a break) ---\n{b}")
        if self.reused_calls:
            lines.append(
                "--- calls traced once, replayed (capture) ---\n  " + "\n  ".join(self.reused_calls)
            )
        return "\n".join(lines)


def explain(fn, *args, **kwargs):
    """``explain(fn)(*args)`` (or ``explain(fn, *args)``): run ``fn`` captured and report
    its graphs, graph breaks (reason and source line), guards, recompiles, and the symbols
    and shape guards of symbolic sizes. For a function or module that ``optimize`` made,
    its ``dynamic`` setting applies (else the default, None: sizes marked with
    ``mark_dynamic`` are symbolic)."""
    optimized = getattr(fn, "_kiln_ctx", None)
    dynamic = optimized.dynamic if optimized is not None else None

    def run(*a, **k) -> ExplainOutput:
        reset()
        rec = Recorder()

        def backend(gm, example_inputs):
            return gm.forward

        ctx = Context(backend=backend, fullgraph=False, recorder=rec, dynamic=dynamic)
        target = fn._orig_mod if isinstance(fn, OptimizedModule) else fn
        if optimized is not None and not isinstance(fn, OptimizedModule):
            target = fn.__wrapped__
        call_reuse.REPLAYED.clear()
        with _Enabled(ctx):
            result = target(*a, **k)
        replayed = list(call_reuse.REPLAYED)
        return ExplainOutput(
            rec.graphs,
            rec.breaks,
            rec.guards,
            rec.recompiles,
            result,
            rec.symbols,
            rec.shape_guards,
            rec.eager_frames,
            rec.region_boundaries,
            replayed,
        )

    if args or kwargs:
        return run(*args, **kwargs)
    return run


__all__ = ["ExplainOutput", "OptimizedModule", "disable", "explain", "optimize", "reset"]
