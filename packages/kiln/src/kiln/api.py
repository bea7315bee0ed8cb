"""`kiln.compile`: torch.compile's signature and behaviour, on kiln's packages.

Compiled modules
================
`torch.compile(module)` returns a wrapper whose ``state_dict`` keys gain an
``_orig_mod.`` prefix. kiln instead returns an object of a subclass of the module's own
class that *shares the original's ``__dict__``*: the same parameters, buffers,
submodules, hooks and ``training`` flag, so ``state_dict`` keys are unchanged,
``isinstance`` holds, ``compiled.eval()`` switches the original too, and an optimizer
built on either updates both. Only calling it differs: ``compiled(x)`` runs the captured
and compiled ``original(x)`` (forward hooks included); ``compiled._orig_mod`` is the
original.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

import kiln_capture
from kiln import backends, distributed, fsdp, fsdp_graph
from kiln.config import resolve_options

F = TypeVar("F", bound=Callable[..., Any])

_COMPILED_CLASSES: dict[type, type] = {}
# compiled module -> (original module, compiled call); the two share one __dict__, so
# per-object state lives here.
_COMPILED_STATE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compile(
    model: Callable | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Callable = "inductor",
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    disable: bool = False,
) -> Any:
    """Compile ``model`` (a function or an ``nn.Module``) as ``torch.compile`` would.

    Usable as ``kiln.compile(fn)``, ``@kiln.compile`` and ``@kiln.compile(mode=...)``.
    ``backend`` is ``"inductor"`` (kiln's compiler), ``"eager"``, ``"aot_eager"`` or a
    callable ``backend(gm, example_inputs) -> callable``. Errors in the compiler run the
    failing graph eagerly with a warning, unless ``fullgraph=True`` or
    ``options={"raise_on_error": True}``. ``disable=True`` returns ``model`` unchanged.
    ``dynamic``: ``True`` compiles every size of every tensor argument symbolically (sizes
    0 and 1 aside), ``None`` (default) specializes the first call and makes the sizes that
    change symbolic on the recompile, ``False`` specializes every size.
    """
    if model is None:
        return functools.partial(
            compile,
            fullgraph=fullgraph,
            dynamic=dynamic,
            backend=backend,
            mode=mode,
            options=options,
            disable=disable,
        )
    if not callable(model):
        raise RuntimeError(f"kiln.compile expects a callable or an nn.Module, got {type(model)}")
    if dynamic is not None and type(dynamic) is not bool:
        raise TypeError(f"kiln.compile(dynamic=...) takes None, True or False, got {dynamic!r}")
    resolved = resolve_options(mode, options)
    name, fn = backends.lookup(backend, resolved)
    if disable:
        return model
    guarded = backends.with_fallback(
        name, fn, allow_fallback=not (fullgraph or resolved["raise_on_error"])
    )
    if distributed.is_ddp(model):
        # one piece per gradient bucket: DDP's all-reduce overlaps the backward
        guarded = distributed.split_at_buckets(guarded, distributed.bucket_caps(model))
    else:  # a DDP model called by compiled code: its graph split the same way
        guarded = distributed.split_inside_ddp(guarded)
    # dynamic: True makes every size of every tensor argument symbolic, None makes the
    # sizes that changed symbolic when a frame compiles again, False specializes them all
    # (kiln_capture's dynamic.py); kiln.mark_dynamic / mark_static decide per dimension
    optimize = kiln_capture.optimize(guarded, fullgraph=fullgraph, dynamic=dynamic)
    if fsdp.units(model):
        # fully_shard units: each unit's forward is a region of its own, between FSDP's
        # hooks (kiln/fsdp.py), in place only while the compiled object's call (and its
        # backward) runs: the user's modules are left as they are
        regions = fsdp.compile_units(model, optimize)
        # one graph with FSDP's all-gathers and reduce-scatters in it where FSDP's
        # options allow (kiln/fsdp_graph.py), else the regions
        whole = fsdp_graph.compile_whole(
            model,
            lambda b: kiln_capture.optimize(b, fullgraph=fullgraph, dynamic=dynamic),
            guarded,
            enabled=resolved["fsdp_graph"],
        )
        if not fsdp.is_unit(model):
            scoped = fsdp.scoped(regions, optimize(model).forward)
            return _compiled_module(model, whole.or_else(scoped))
        call = functools.partial(torch.nn.Module.__call__, model)
        compiled = _compiled_module(model, whole.or_else(fsdp.scoped(regions, call)))
        fsdp.share_state(compiled, model)  # FSDP's root finds the unit through it
        return compiled
    if isinstance(model, torch.nn.Module):
        return _compiled_module(model, optimize(model))
    return optimize(model)


def _compiled_module(module: torch.nn.Module, compiled_call: Callable) -> torch.nn.Module:
    cls = type(module)
    sub = _COMPILED_CLASSES.get(cls)
    if sub is None:
        sub = type(
            f"Compiled{cls.__name__}",
            (cls,),
            {
                "__call__": _call_compiled,
                # compiled.forward(x) runs the compiled call too, as torch.compile's does
                "forward": _call_compiled,
                "_orig_mod": property(_original_module),
                # called inside captured code, the original module is traced there
                "__kiln_inline__": "_orig_mod",
            },
        )
        _COMPILED_CLASSES[cls] = sub
    compiled = object.__new__(sub)
    # One __dict__ for both objects: parameters, buffers, submodules and flags are shared.
    object.__setattr__(compiled, "__dict__", module.__dict__)
    # capture's wrapper module has no hooks of its own (the original's hooks run inside
    # the captured call): calling its forward skips one nn.Module.__call__ per call.
    if isinstance(compiled_call, torch.nn.Module):
        compiled_call = compiled_call.forward
    _COMPILED_STATE[compiled] = (module, compiled_call)
    return compiled


def _call_compiled(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    state = _COMPILED_STATE.get(self)
    if state is None:  # a copy (deepcopy, pickle) of a compiled module runs eagerly
        return torch.nn.Module.__call__(self, *args, **kwargs)
    return state[1](*args, **kwargs)


def _original_module(self: torch.nn.Module) -> torch.nn.Module:
    return _COMPILED_STATE[self][0]


# per-dimension dynamic-shape marks (torch._dynamo.mark_dynamic / mark_static): capture's own
mark_dynamic = kiln_capture.mark_dynamic
mark_static = kiln_capture.mark_static


def disable(fn: F | None = None, recursive: bool = True) -> Any:
    """Run ``fn`` eagerly even when called from compiled code (``torch.compiler.disable``)."""
    if fn is None:
        return functools.partial(disable, recursive=recursive)
    return kiln_capture.disable(fn)


def reset() -> None:
    """Forget every compiled frame and cache entry (``torch._dynamo.reset``)."""
    from kiln_inductor.regions import STATS as regions

    kiln_capture.reset()
    backends.FALLBACKS[0] = 0
    regions.reset()
    distributed.SPLITS.clear()
    fsdp_graph.GATHERED.clear()


def stats() -> dict[str, int]:
    """Since the last reset: graphs compiled, graphs that fell back to eager, graph breaks,
    recompiles, frames kiln chose to run eagerly (cache size limit, internal errors:
    ``kiln_capture.eager_reasons()`` says which; ``kiln_capture.break_reasons()`` names
    each break), and frames that reached the cache size limit (each warned once, with
    the guard that failed)."""
    captured = kiln_capture.stats()
    return {
        "graphs": captured["graphs"],
        "fallbacks": backends.FALLBACKS[0],
        "breaks": captured["breaks"],
        "recompiles": captured["recompiles"],
        "eager_frames": captured.get("eager_frames", 0),
        "cache_limit_hits": captured.get("cache_limit_hits", 0),
        "region_boundaries": captured.get("region_boundaries", 0),
        "reused_calls": captured.get("reused_calls", 0),
    }


@dataclasses.dataclass
class ExplainOutput(kiln_capture.ExplainOutput):
    """kiln_capture's explanation, plus the blocks kiln's compiler compiles once and
    reuses (``reused_blocks``: one line per group of identical module calls, per graph)."""

    reused_blocks: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        text = super().__str__()
        if self.reused_blocks:
            text += "\n--- reused blocks (compiled once) ---\n  " + "\n  ".join(self.reused_blocks)
        return text


def explain(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Graphs, graph breaks (reason and source line), guards and recompiles of ``fn``, and
    the repeated blocks kiln compiles once (``reused_blocks``; off with
    ``KILN_REGIONAL_REUSE=0``).

    ``kiln.explain(fn)(*args)`` as torch._dynamo.explain; ``kiln.explain(fn, *args)`` too.
    """
    explainer = kiln_capture.explain(fn)

    def run(*a: Any, **k: Any) -> ExplainOutput:
        out = explainer(*a, **k)
        fields = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
        return ExplainOutput(**fields, reused_blocks=_reused_blocks(out.graphs))

    if args or kwargs:
        return run(*args, **kwargs)
    return run


def _reused_blocks(graphs: list[torch.fx.GraphModule]) -> list[str]:
    """What kiln-inductor's regional reuse would do with each graph (regions.py)."""
    from kiln_inductor.compile import regional_reuse_applies
    from kiln_inductor.regions import plan_regions

    lines = []
    for i, gm in enumerate(graphs):
        inputs = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
        if not regional_reuse_applies(inputs):
            continue
        plan = plan_regions(gm)
        for group in plan.groups if plan is not None else ():
            lines.append(f"graph {i}: {group.describe()}")
    return lines
