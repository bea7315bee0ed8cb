"""FSDP2 (``fully_shard``): each sharded module's forward compiled as a region of its own.

Design: regions between FSDP's hooks
====================================
``fully_shard(m)`` turns ``m`` into a unit whose parameters are DTensor shards. A forward
pre-hook all-gathers them into plain unsharded ``nn.Parameter``s swapped into the module
(storage resized back from 0, ``torch.ops.fsdp`` copy-in/copy-out, async c10d
collectives), a forward hook frees that storage again, and autograd hooks redo the
all-gather before the unit's backward and reduce-scatter its gradients after it.

kiln does not trace those hooks. It compiles what runs *between* them: each unit's own
``forward``, replaced in place (an instance attribute) by a kiln-captured version of the
class's ``forward``. ``Module.__call__`` still runs FSDP's hooks eagerly around it, so the
compiled graph sees the unsharded parameters as ordinary graph inputs (the same
``nn.Parameter`` objects every step), returns an output whose autograd node is kiln's
compiled backward, and FSDP's autograd hooks fire around that node as they do around
eager autograd: prefetching, resharding after forward and reduce-scatter stay FSDP's own.
No collective, storage resize or DTensor is ever inside a graph, so there is nothing for
kiln-aot to model. This is how per-layer compilation of FSDP2 is structured in practice
(the hooks stay eager, the blocks are compiled), and it needs no ``torch._C`` state
queries or ``autograd.Function`` hooks traced.

A unit's forward that calls a child unit (the root calling its blocks) cannot keep the
child's hooks in one graph with its own code: the call is a *region boundary* (kiln-capture's
B012), where the parent's graph ends, the child runs (hooks eagerly, its forward as its own
compiled region) and the parent's next graph resumes. Region boundaries are counted in
``kiln.stats()["region_boundaries"]``, not as breaks. FSDP's hooks themselves run with capture
off (``kiln_capture.disable``): they are Python around the regions, not code to capture.

``kiln.compile(model)`` on a model holding units compiles every unit's forward this way
(``kiln.compile`` on one block or on the root: the same regions), and ``model``'s own
forward too when ``model`` is not a unit itself. Activation checkpointing inside a unit's
forward (``checkpoint`` of the block's body, or ``checkpoint_wrapper`` applied before
``fully_shard``) is captured into the region as for any module.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from typing import Any

import torch

import kiln_capture

Optimize = Callable[[Callable], Callable]
_copies = itertools.count()


def _fsdp_module_class() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without distributed
        return None
    return FSDPModule


def units(model: object) -> list[torch.nn.Module]:
    """The modules under ``model`` (itself included) that ``fully_shard`` made units."""
    cls = _fsdp_module_class()
    if cls is None or not isinstance(model, torch.nn.Module):
        return []
    return [m for m in model.modules() if isinstance(m, cls)]


def is_unit(module: object) -> bool:
    cls = _fsdp_module_class()
    return cls is not None and isinstance(module, cls)


def compile_units(model: torch.nn.Module, optimize: Optimize) -> int:
    """Replace each unit's ``forward`` under ``model`` by ``optimize`` of its class's
    forward (once per unit: a unit compiled already keeps its region), and run FSDP's
    forward hooks with capture off. Returns the number of units compiled now."""
    count = 0
    for unit in units(model):
        _hooks_without_capture(unit)
        if getattr(unit.__dict__.get("forward"), "_kiln_region", False):
            continue
        region = _region(optimize(_own_copy(type(unit).forward).__get__(unit)), unit)
        unit.forward = region
        count += 1
    return count


def _own_copy(fn: Callable) -> Callable:
    """``fn`` with a code object of its own: kiln-capture keeps its cache per code object,
    and the blocks of a model share one class's ``forward``, so without a copy each block
    after the first would be a recompile of one frame (guarded on ``self``), and a model
    with more blocks than ``KILN_CACHE_SIZE_LIMIT`` would run its last blocks eagerly."""
    # code objects compare by value: an unused constant of its own makes this one distinct
    marker = f"kiln region {next(_copies)}"
    code = fn.__code__.replace(co_consts=(*fn.__code__.co_consts, marker))
    own = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__ = fn.__kwdefaults__
    own.__qualname__ = fn.__qualname__
    own.__dict__.update(fn.__dict__)
    return own


def _region(compiled: Callable, unit: torch.nn.Module) -> Callable:
    def region(*args: Any, **kwargs: Any) -> Any:
        out = compiled(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            return _not_a_view(out, unit, args)
        if type(out) in (tuple, list):
            return type(out)(_not_a_view(o, unit, args, out) for o in out)
        return out

    region._kiln_region = True  # kiln-capture: a call of this module is a region boundary
    region.__wrapped__ = compiled
    return region


def _not_a_view(out: Any, unit: torch.nn.Module, args: tuple, siblings: Any = ()) -> Any:
    """A compiled graph may return a view of one of its own buffers where eager returns a
    fresh tensor (a 3-d ``linear`` is ``_unsafe_view`` of a 2-d ``addmm`` in eager, a view
    in kiln's wrapper). FSDP's pre-backward hook is registered on the unit's outputs, and an
    in-place op on a view output would drop it (FSDP warns so): such an output becomes
    eager's ``_unsafe_view``, not a view for autograd. Views of the arguments, of other
    outputs, of the unit's parameters or buffers keep their aliasing."""
    if not isinstance(out, torch.Tensor) or not out._is_view():
        return out
    base = out._base
    if base.requires_grad and base.is_leaf:  # a view of a parameter
        return out
    known = [*args, *(s for s in siblings if s is not out), *unit.buffers()]
    if any(base is a or getattr(a, "_base", None) is base for a in known):
        return out
    return torch.ops.aten._unsafe_view(out, out.shape)


def _hooks_without_capture(unit: torch.nn.Module) -> None:
    """FSDP's forward pre-hook and forward hook on ``unit``, wrapped in
    ``kiln_capture.disable`` where they are registered (same keys, so FSDP's handles still
    remove them): they run eagerly even when a region boundary's call runs them while a
    compiled frame is active."""
    for table in ("_forward_pre_hooks", "_forward_hooks"):
        hooks = getattr(unit, table)
        for key, hook in list(hooks.items()):
            if getattr(hook, "_kiln_disabled", False) or not _is_fsdp_hook(hook):
                continue
            hooks[key] = kiln_capture.disable(hook)


def _is_fsdp_hook(hook: object) -> bool:
    # FSDPState's bound methods, and the closures of units sharing one state
    return (getattr(hook, "__module__", None) or "").startswith("torch.distributed.fsdp")


__all__ = ["compile_units", "is_unit", "units"]
