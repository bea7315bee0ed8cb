"""Reload recipes: a compiled graph found again in the artifact cache without its graph.

# Reload recipes

A warm process that meets a graph an earlier process compiled still paid, before the
artifact cache could answer, for what the cache key is made of: the torch-level
``GraphModule`` rebuilt (kiln-capture's kept capture holds it as data), its repeated
blocks found again (``plan_regions``), a ``GraphModule`` per piece, and each piece's graph
key hashed from its nodes; about half of a warm first call. Yet all of it only leads to
the same keys the first process computed.

So ``compile_fx`` hands its caller, beside the compiled callable, a *reload recipe*
(``fn.kiln_reload_recipe``): plain data (tuples of strings, numbers and booleans,
``marshal``-able) that names what it built, for a caller that keeps it with the graph
(kiln-capture's frame_store.py keeps it in the kept capture):

- ``(TAG, FORMAT, reuse, body)``: ``reuse`` is whether regional reuse applied;
- ``body`` of a graph compiled whole: ``("aot", devices, context key, graph key,
  training)``: its plans are the artifact cache's entries under ``digest(context key,
  graph key)`` (runtime/artifacts.py), ``training`` the module flag kiln-aot's signature
  reads;
- ``body`` of a graph cut into regions: ``("regions", stitched source, pieces, blocks)``:
  each piece an ``"aot"`` body or ``("same", k)`` (the block of piece ``k``), ``blocks``
  the region groups' descriptions (``RegionGroup.describe``).

``reload(recipe, example_inputs, make_graph)`` rebuilds the callable from it: kiln-aot's
runtime over each piece's plans, loaded from the artifact cache, and the stitched
function. It is the callable ``compile_fx`` would return for the graph ``make_graph()``
gives, because a recipe is only used when everything its keys were made of is the same
now: the context key is computed again in this process (versions, the compiler's
sources, the machine, the ``affects_cache`` settings, the default dtype) and must be
equal, the artifact cache must be on, and regional reuse must apply as it did. The
graph key is not computed again: the caller vouches that ``make_graph()`` is the graph
the recipe was made for (kiln-capture keeps both in one record, under the frame's key).
Anything else answers None, and the caller compiles the graph as usual.

A plan missing from the cache (removed, damaged, another signature) is compiled from
``make_graph()`` on demand, exactly as a fresh compile would (kiln-aot traces the piece
of the graph it needs). A graph with symbolic sizes, state of its own (parameters or
attributes held by the ``GraphModule``), or compiled by another ``compile_graph`` has no
recipe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import log

TAG = "kiln-inductor"
FORMAT = 1
ATTR = "kiln_reload_recipe"


class _Flag:
    """What kiln-aot's guarded call reads of a module: its ``training`` flag."""

    def __init__(self, training: bool):
        self.training = training


def recipe_of(fn: Any) -> tuple | None:
    recipe = getattr(fn, ATTR, None)
    return recipe if type(recipe) is tuple else None


def attach(fn: Callable[..., Any], recipe: tuple | None) -> Callable[..., Any]:
    """``fn`` carrying ``recipe`` (its ``kiln_guarded_call`` too: kiln-capture may keep
    that one)."""
    if recipe is None:
        return fn
    for target in (fn, getattr(fn, "kiln_guarded_call", None)):
        if target is not None:
            try:
                setattr(target, ATTR, recipe)
            except AttributeError:  # a callable without attributes: no recipe
                return fn
    return fn


def whole_body(gm: Any, store: Any) -> tuple | None:
    """The ``"aot"`` body of ``gm`` compiled whole through ``store``, or None."""
    if store is None or store.recipe is None or not isinstance(gm, torch.fx.GraphModule):
        return None
    env = gm.meta.get("shape_env")
    if env is not None and getattr(env, "symbols", None):
        return None
    if any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()):
        return None
    if any(n.op == "get_attr" for n in gm.graph.nodes):
        return None
    devices, context, gkey = store.recipe
    return ("aot", devices, context, gkey, bool(gm.training))


def make_recipe(reuse: bool, body: tuple | None) -> tuple | None:
    return None if body is None else (TAG, FORMAT, reuse, body)


def reload(
    recipe: Any, example_inputs: Sequence[Any], make_graph: Callable[[], torch.fx.GraphModule]
) -> Callable[..., Any] | None:
    """The callable ``compile_fx(make_graph(), example_inputs)`` would return, rebuilt
    from ``recipe`` (module docstring), or None when the recipe does not hold here."""
    from ..compile import regional_reuse_applies
    from ..config import read_config

    if type(recipe) is not tuple or len(recipe) != 4 or recipe[:2] != (TAG, FORMAT):
        return None
    if not read_config().artifact_cache:
        return None
    _, _, reuse, body = recipe
    if reuse is not regional_reuse_applies(example_inputs):
        return None
    fn = None
    try:
        if body[0] == "aot":
            fn = _aot(body, make_graph, list(example_inputs))
        elif body[0] == "regions":
            fn = _regions(body, make_graph)
    except (TypeError, ValueError, IndexError, KeyError) as e:  # a malformed recipe
        log.log("cache", f"reload recipe not used: {type(e).__name__}: {e}")
        return None
    return attach(fn, recipe) if fn is not None else None


def _aot(
    body: tuple, make_graph: Callable[[], torch.fx.GraphModule], examples: list | None
) -> Callable[..., Any] | None:
    """kiln-aot's runtime over the plans stored for an ``"aot"`` body (as ``aot_graph``
    makes it for a ``GraphModule`` without state of its own)."""
    from kiln_aot.api import AotCompiled, guarded_call
    from kiln_aot.module_state import call_module

    from ..compile import compile_aten_graph
    from .artifacts import ArtifactCache, PlanStore, context_key
    from .cache import digest

    kind, devices, context, gkey, training = body
    if kind != "aot" or type(training) is not bool:
        return None
    if context_key([torch.device(d) for d in devices]) != context:
        log.log("cache", "reload recipe not used: another compiler, machine or settings")
        return None
    store = PlanStore(ArtifactCache(), digest(context, gkey))
    store.recipe = (devices, context, gkey)
    built: list[torch.fx.GraphModule] = []

    def graph() -> torch.fx.GraphModule:
        if not built:  # a plan the cache does not hold: compiled from the graph
            built.append(make_graph())
        return built[0]

    def flat_fn(*flat: Any) -> Any:
        return call_module(graph(), flat)

    compiled = AotCompiled(flat_fn, compile_aten_graph, compile_aten_graph, None, None, None, store)

    def run_gm(*args: Any) -> Any:
        return compiled.run(list(args), extra=training)

    if examples is not None:  # loaded now (errors surface here), as aot_graph compiles now
        compiled.plan_for(examples, extra=training)
        run_gm.kiln_guarded_call = guarded_call(  # type: ignore[attr-defined]
            compiled, examples, run_gm, _Flag(training)
        )
    return run_gm


def _regions(
    body: tuple, make_graph: Callable[[], torch.fx.GraphModule]
) -> Callable[..., Any] | None:
    from ..regions import STATS, _piece_module, plan_regions

    kind, source, pieces, blocks = body
    if kind != "regions" or type(source) is not str:
        return None
    planned: list[Any] = []

    def piece_graph(k: int) -> Callable[[], torch.fx.GraphModule]:
        def make() -> torch.fx.GraphModule:
            if not planned:
                gm = make_graph()
                plan = plan_regions(gm)
                if plan is None or len(plan.pieces) != len(pieces):
                    raise RuntimeError("kiln: the graph's regions differ from its reload recipe")
                planned.append((gm, plan))
            gm, plan = planned[0]
            return _piece_module(gm, plan.pieces[k], k)

        return make

    fns: list[Callable[..., Any]] = []
    for k, piece in enumerate(pieces):
        if piece[0] == "same":
            fns.append(fns[piece[1]])
            continue
        fn = _aot(piece, piece_graph(k), None)
        if fn is None:
            return None
        fns.append(fn)
    namespace: dict[str, Any] = {f"piece{k}": fn for k, fn in enumerate(fns)}
    exec(compile(source, "<kiln regions>", "exec"), namespace)
    stitched = namespace["stitched"]
    STATS.graphs_split += 1
    STATS.blocks_compiled += len(blocks)  # as a compile whose pieces the cache gave
    STATS.instances += sum(1 for p in pieces if p[0] == "same") + len(blocks)
    for line in blocks:
        STATS.blocks.append(line)
        # the line compile_regions logs (kiln's report and explain() list it), and how
        log.log("graphs", f"regional reuse: {line} (reloaded from the artifact cache)")
    return stitched


__all__ = ["ATTR", "attach", "make_recipe", "recipe_of", "reload", "whole_body"]
