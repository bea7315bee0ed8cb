"""FSDP2 (``fully_shard``): each sharded module's forward compiled as a region of its own.

``kiln.compile(root)`` first tries kiln/fsdp_graph.py, which compiles the whole model as
one graph holding FSDP's all-gathers and reduce-scatters; the regions here serve per-block
compilation (``kiln.compile(block)`` under an eager FSDP root), ``fsdp_graph=False`` and
the calls whose FSDP options the graph does not model.

Design: regions between FSDP's hooks
====================================
``fully_shard(m)`` turns ``m`` into a unit whose parameters are DTensor shards. A forward
pre-hook all-gathers them into plain unsharded ``nn.Parameter``s swapped into the module
(storage resized back from 0, ``torch.ops.fsdp`` copy-in/copy-out, async c10d
collectives), a forward hook frees that storage again, and autograd hooks redo the
all-gather before the unit's backward and reduce-scatter its gradients after it.

kiln does not trace those hooks. It compiles what runs *between* them: each unit's own
``forward``, as a kiln-captured version of the class's ``forward`` (a *region*).
``Module.__call__`` still runs FSDP's hooks eagerly around it, so the compiled graph sees
the unsharded parameters as ordinary graph inputs (the same ``nn.Parameter`` objects
every step), returns an output whose autograd node is kiln's compiled backward, and
FSDP's autograd hooks fire around that node as they do around eager autograd:
prefetching, resharding after forward and reduce-scatter stay FSDP's own. No collective,
storage resize or DTensor is ever inside a graph, so there is nothing for kiln-aot to
model. This is how per-layer compilation of FSDP2 is structured in practice (the hooks
stay eager, the blocks are compiled), and it needs no ``torch._C`` state queries or
``autograd.Function`` hooks traced.

A unit's forward that calls a child unit (the root calling its blocks) cannot keep the
child's hooks in one graph with its own code: the call is a *region boundary* (kiln-capture's
B012), where the parent's graph ends, the child runs (hooks eagerly, its forward as its own
compiled region) and the parent's next graph resumes. Region boundaries are counted in
``kiln.stats()["region_boundaries"]``, not as breaks. FSDP's hooks themselves run with capture
off (``kiln_capture.disable``): they are Python around the regions, not code to capture.

``kiln.compile(model)`` on a model holding units compiles every unit's forward this way
(each ``kiln.compile`` call with regions of its own, compiled with its options), and
``model``'s own forward too when ``model`` is not a unit itself. Activation checkpointing inside a unit's
forward (``checkpoint`` of the block's body, or ``checkpoint_wrapper`` applied before
``fully_shard``) is captured into the region as for any module; a checkpoint *around* a
unit (``checkpoint(block, x)`` in the parent, ``checkpoint_wrapper`` after
``fully_shard``) runs as checkpoint does, around the unit's call: a region boundary.

The user's modules stay as they were
====================================
``Module.__call__`` runs ``self.forward``, so a unit runs its region only while its
instance attribute ``forward`` is the region. kiln sets it (and wraps FSDP's forward
hooks in ``kiln_capture.disable``) only while kiln's code may call the unit: during a
call of the object ``kiln.compile`` returned (``scoped``), and during a backward that
reaches that call's outputs, where a checkpoint around a unit recomputes the unit's
forward and must save what the compiled forward saved (a node pre-hook on each output's
``grad_fn`` enters the scope, an autograd engine callback at the end of that backward
leaves it). Outside those, ``m.forward``, ``type(m).forward``, ``m.__dict__``, the hook
tables, ``state_dict`` and ``repr`` are the user's: calling the original ``model`` runs
eagerly, as with ``torch.compile``. Scopes nest (a compiled block called by a compiled
root); each unit counts how many scopes hold it and is restored when the last leaves.
"""

from __future__ import annotations

import itertools
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

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


def share_state(compiled: torch.nn.Module, unit: torch.nn.Module) -> None:
    """Make ``compiled`` (``kiln.compile(unit)``: another object, sharing ``unit``'s
    ``__dict__``) a module FSDP knows as ``unit``. FSDP finds a module's state by the
    module object (``torch.distributed._composable_state``'s weak map), not through its
    ``__dict__``; without this, ``model.blocks[i] = kiln.compile(block)`` hides the block
    from the root's lazy init, so each compiled block became a root of its own (its own
    communication context, not resharded after forward) and a prefetch of a block not yet
    run failed, and FSDPModule's methods on the compiled object
    (``set_requires_gradient_sync``, ``unshard``, ...) raised "No FSDP state found". ``compiled``'s FQN in FSDP's labels stays unset (FSDP names a unit's
    parameter group by the original module, which the tree no longer holds)."""
    from torch.distributed import _composable_state

    state = _composable_state._get_module_state(unit)
    if state is not None and _composable_state._get_module_state(compiled) is None:
        _composable_state._insert_module_state(compiled, state)


def compile_units(model: torch.nn.Module, optimize: Optimize) -> list[tuple[Any, Callable]]:
    """A region (``optimize`` of its class's forward) for each unit under ``model``, for
    ``scoped``; the user's modules are left as they are. Each ``kiln.compile`` call makes
    its own regions, so its options (backend, mode, fullgraph) hold for its units."""
    return [
        (weakref.ref(unit), _region(optimize(_own_copy(type(unit).forward)), unit))
        for unit in units(model)
    ]


# unit -> [scopes holding it, forward attribute and hooks it had]
_HELD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ABSENT = object()
# unit -> {(hook table, key): (FSDP's hook, its kiln_capture.disable wrapper)}
_DISABLED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Scope:
    """The units of one ``kiln.compile`` call; ``enter``/``leave`` nest."""

    def __init__(self, regions: list[tuple[Any, Callable]]) -> None:
        self.regions = regions
        self.depth = 0

    def enter(self) -> None:
        self.depth += 1
        if self.depth == 1:
            for ref, region in self.regions:
                if (unit := ref()) is not None:
                    _hold(unit, region)

    def leave(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            for ref, _ in self.regions:
                if (unit := ref()) is not None:
                    _release(unit)

    def backward_prehook(self, grad_outputs: Any) -> None:
        """A backward reached the outputs of a scoped call: hold the units until it ends
        (a checkpoint around a unit recomputes the unit's forward in there)."""
        self.enter()
        torch.autograd.Variable._execution_engine.queue_callback(self.leave)


def _hold(unit: torch.nn.Module, region: Callable) -> None:
    """Put ``region`` in place as ``unit``'s forward, unless a scope holds it already (a
    compiled block called by a compiled root: the outer scope's region runs)."""
    held = _HELD.get(unit)
    if held is not None:
        held[0] += 1
        return
    d = unit.__dict__
    hooks = _hooks_without_capture(unit)
    _HELD[unit] = [1, d.get("forward", _ABSENT), hooks]
    d["forward"] = region


def _release(unit: torch.nn.Module) -> None:
    held = _HELD[unit]
    held[0] -= 1
    if held[0]:
        return
    del _HELD[unit]
    d = unit.__dict__
    if held[1] is _ABSENT:
        d.pop("forward", None)
    else:
        d["forward"] = held[1]
    for table, key, hook, wrapped in held[2]:
        hooks = getattr(unit, table)
        if hooks.get(key) is wrapped:  # FSDP may have removed it meanwhile
            hooks[key] = hook


def scoped(regions: list[tuple[Any, Callable]], call: Callable) -> Callable:
    """``call`` with ``regions`` (from ``compile_units``) in place while it runs and while
    a backward through its outputs runs (see "The user's modules stay as they were")."""
    scope = _Scope(regions)

    def in_scope(*args: Any, **kwargs: Any) -> Any:
        scope.enter()
        try:
            out = call(*args, **kwargs)
        finally:
            scope.leave()
        if torch.is_grad_enabled():
            _hook_backward(out, args, kwargs, scope)
        return out

    in_scope.__wrapped__ = call
    return in_scope


def _hook_backward(out: Any, args: tuple, kwargs: dict, scope: _Scope) -> None:
    known = {id(a.grad_fn) for a in pytree.tree_leaves((args, kwargs)) if _has_grad_fn(a)}
    nodes = {id(o.grad_fn): o.grad_fn for o in pytree.tree_leaves(out) if _has_grad_fn(o)}
    for key, node in nodes.items():
        if key not in known:  # an input passed through: not this call's node
            node.register_prehook(scope.backward_prehook)


def _has_grad_fn(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.grad_fn is not None


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
    """The forward a unit runs in a scope: ``compiled(unit, ...)``. It holds the unit
    weakly, as the scope does: compiling a model keeps none of its modules alive."""
    ref = weakref.ref(unit)

    def region(*args: Any, **kwargs: Any) -> Any:
        owner = ref()
        out = compiled(owner, *args, **kwargs)
        leaves, spec = pytree.tree_flatten(out)  # HF's ModelOutput is a pytree node too
        fixed = [_not_a_view(o, owner, args, leaves) for o in leaves]
        if all(a is b for a, b in zip(fixed, leaves)):
            return out
        return pytree.tree_unflatten(fixed, spec)

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


def _hooks_without_capture(unit: torch.nn.Module) -> list[tuple[str, Any, Any, Any]]:
    """FSDP's forward pre-hook and forward hook on ``unit``, wrapped in
    ``kiln_capture.disable`` where they are registered (same keys, so FSDP's handles still
    remove them): they run eagerly even when a region boundary's call runs them while a
    compiled frame is active. Returns (table, key, hook, wrapper) to put them back."""
    swapped = []
    made = _DISABLED.setdefault(unit, {})
    for table in ("_forward_pre_hooks", "_forward_hooks"):
        hooks = getattr(unit, table)
        for key, hook in list(hooks.items()):
            if _is_fsdp_hook(hook):
                # the same wrapper every time: a captured parent guards the hooks it sees
                old = made.get((table, key))
                wrapped = old[1] if old and old[0] is hook else kiln_capture.disable(hook)
                made[(table, key)] = (hook, wrapped)
                hooks[key] = wrapped
                swapped.append((table, key, hook, wrapped))
    return swapped


def _is_fsdp_hook(hook: object) -> bool:
    # FSDPState's bound methods, and the closures of units sharing one state
    return (getattr(hook, "__module__", None) or "").startswith("torch.distributed.fsdp")


__all__ = ["compile_units", "is_unit", "scoped", "share_state", "units"]
