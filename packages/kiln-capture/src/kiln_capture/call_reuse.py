"""A module call's trace reused for identical later calls within one capture.

Design note: "reused calls"
---------------------------
A transformer's forward calls the same block class once per layer, over parameters of the
same shapes and inputs of the same metadata; evaluating each layer's bytecode again (ops
on meta tensors, attribute reads, guards, FX nodes) is what makes a 24-layer capture cost
about four times a 6-layer one. The first such call is *recorded*; a later call with the
same key is *replayed* from the recording instead of evaluated.

The first call of a class is evaluated and not recorded (most modules are called once,
and a recording costs every event of the call a little); a second call with a key not
seen yet is recorded. The key: the module's class and ``forward``, the grad mode, each
argument as plain data (a tensor by class, shape, strides, dtype, device,
``requires_grad`` and whether it is a graph input; constants by type and value; tuples of
these; which arguments are the same Var), and the autocast state the call starts in (an
op's output dtype follows it).
Only calls with a source (a module reached from the frame), no forward hooks, static
sizes, no nested break pending and no lifted floats are keyed.

A recording logs, in order, what a trace of the call does to the capture's state:

- ``wrap`` events: each value read from a source (``OutputGraph.wrap`` at its outermost
  level): parameters become placeholders there, attributes constants, submodules modules,
  and the guards of each read are made there;
- ``op`` events: each ``OutputGraph.tensor_op`` (the op, its argument Vars, its result
  Var and the nodes it added);
- ``guard`` events: each guard added outside those two (structural checks such as a
  container's keys or a submodule's hooks), also those ``GuardSet.add`` dropped as
  repeats: the call relied on them all the same.

A recording is kept only when that log is the whole story: no side effect, prelude or
lifted float was added, no symbol was made, the number of nodes the call added is the
number its events added, every op argument and the result are built from the call's
inputs, event results, constants and Vars made before the call (tuples and lists of
these), no node carries metadata beyond its value, device, stack trace and inner
``nn_module_stack`` (a checkpoint region inside the call marks its nodes afterwards: not
kept), no op's target is an object of the recorded module's tree, and no guard outside a
read compares with such an object.

Side effects of the trace before the call. The state a call sees is the live objects,
except where the trace changed them: an attribute or global it stored, a container it
mutated, a forward hook it registered (transformers' output capturing registers hooks
that append to a list the trace made). A replay reads the live objects, so a recording
fails when the call reads any of these (``SideEffects.pending_attr``, a pending global,
a mutated container, a module with a hook of the trace), and a replay is refused when
the side effects changed since the recording or B's own modules hold such state. What
the call reaches otherwise is its arguments (tensors and constants only) and live
objects, so a container the trace made and the call mutates was made inside the call.

A replay of call B from call A's recording re-roots every source below A's (``h[0]`` ->
``h[3]``; the recording's expressions become templates over the module called, compiled
once) and first checks, touching nothing: each re-rooted read gives B's value where A's
gave A's, alike (tensors by metadata, modules by class, constants by type and value,
containers item by item, other objects by identity), and each re-rooted structural guard
holds on B's live objects. Any mismatch and B is evaluated as usual. Then it runs the
events against B: reads through ``wrap`` (so B's parameters get placeholders and B's reads
their own guards, made as a trace of B would make them), ops through ``tensor_op`` with
the arguments mapped and A's meta-reuse key (B's arguments are alike A's, so B's op has
A's key: its meta result comes from meta_reuse.py without building the key or running
the general path, and the general path runs where nothing is kept under it, as with
grad), structural guards re-rooted;
and copies each node's stack trace and inner ``nn_module_stack`` entries (re-rooted, with
fresh call keys, so kiln-inductor's regional reuse sees the same blocks). The result is
A's result Var mapped the same way. Since the log goes through ``wrap`` and ``tensor_op``,
an outer recording (a layer whose two LayerNorms reuse each other) records a replay like
an evaluation.

The graph, node metadata and guards equal those of evaluating every call (tests/
test_call_reuse.py: HF GPT-2, BERT and LLaMA in eval and train mode and under bf16
autocast), except that a
replay re-checks a read an evaluation found deduplicated (``h[1].attn.__class__.__name__``
where ``h[0]``'s class was read before): a guard more, that holds. What it saves: 24-layer
HF models' capture (benchmarks/warm_start.py) spends ~5 ms per replayed layer in the
reads' guards and placeholders and the ops' nodes (FX's ``create_node`` the largest
part), against ~15 ms evaluating it.

``KILN_CAPTURE_REUSE_CALLS=0`` turns it off; ``explain()`` (``reused_calls``) and
``stats()["reused_calls"]`` list and count the replays.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import types
from typing import Any

import torch
from torch import nn

from kiln_capture import stats as counters
from kiln_capture.config import config
from kiln_capture.guards import CONST_REF, Guard, guard_namespace, tensor_metadata
from kiln_capture.log import log
from kiln_capture.sources import _FIELDS, ConstRef, Source
from kiln_capture.variables.constants import ConstVar, is_constant_value
from kiln_capture.variables.containers import DictVar, ListVar, NamedTupleVar, SliceVar, TupleVar
from kiln_capture.variables.tensors import SizeVar, TensorVar

# node metadata a trace sets on an op's nodes; anything else was set after the fact by
# code the replay does not run (a checkpoint region's marks)
_NODE_META = frozenset(
    {"val", "device", "stack_trace", "kiln_speculation", "nn_module_stack", "source"}
)
_MAX_RECORDINGS = 256  # per capture: a trace of many distinct calls stops recording
_MISSING = object()
# the replays since explain() cleared it: what explain() lists under "calls traced once"
REPLAYED: list[str] = []
_HASHABLE_CONSTS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


class _NoKey(Exception):
    pass


# -- keys ------------------------------------------------------------------------------


def _leaves(v: Any, out: list) -> tuple:
    """``v``'s shape as plain data, its Vars appended to ``out`` (tensors and constants in
    order); raises _NoKey for a Var of another kind."""
    if isinstance(v, TensorVar):
        for i, seen in enumerate(out):
            if seen is v:
                return ("same", i)
        out.append(v)
        m = v.meta
        return (
            "T",
            v.cls,
            m.dtype,
            tuple(m.shape),
            tuple(m.stride()),
            m.storage_offset(),
            v.device,
            m.requires_grad,
            v.node.op == "placeholder",
        )
    if isinstance(v, ConstVar):
        value = v.value
        if type(value) not in _HASHABLE_CONSTS:
            raise _NoKey
        out.append(v)
        return ("C", type(value), repr(value) if type(value) is float else value, v.source is None)
    if type(v) in (TupleVar, NamedTupleVar):
        cls = v.cls if type(v) is NamedTupleVar else tuple
        return ("tuple", cls, tuple(_leaves(i, out) for i in v.items))
    raise _NoKey


def call_key(out, module_var, args: list, kwargs: dict) -> tuple | None:
    """The key of a module call whose trace could be reused, and its argument Vars in
    order; None when the call is not reusable (design note)."""
    if not config.reuse_calls or module_var.source is None:
        return None
    if isinstance(module_var.source, ConstRef) or not out.guards_reads_in(module_var.source):
        return None
    if out.shape_env.symbols or out.lifted_floats:
        return None
    shapes = out.frame_shapes  # an int of the arguments that varied becomes a symbol
    if shapes is not None and any(v is None for v in shapes.ints.values()):
        return None
    if out.dynamic is True or out.root_frame is None or out.root_frame.nested_stop is not None:
        return None
    m = module_var.value
    forward = m.__dict__.get("forward", type(m).forward)
    leaves: list = []
    try:
        sig = (
            tuple(_leaves(a, leaves) for a in args),
            tuple((k, _leaves(v, leaves)) for k, v in kwargs.items()),
        )
    except _NoKey:
        return None
    try:
        key = (type(m), forward, out.grad_enabled, out.autocast, sig)
        hash(key)
    except TypeError:
        return None
    return key, leaves


# -- sources ---------------------------------------------------------------------------


def reroot(src: Any, old: Source, new: Source) -> Any:
    """``src`` with ``old`` (a base of it) replaced by ``new``; ``src`` itself when ``old``
    is not in it."""
    if src == old:
        return new
    if not dataclasses.is_dataclass(src):
        return src
    changes = {}
    for f in dataclasses.fields(src):
        value = getattr(src, f.name)
        if isinstance(value, Source):
            moved = reroot(value, old, new)
            if moved is not value:
                changes[f.name] = moved
    return dataclasses.replace(src, **changes) if changes else src


def _text_rerooter(old: str, new: str):
    """``text`` with each mention of the source expression ``old`` made ``new`` (each
    answer kept: a replay asks for the same paths once per node)."""
    if old == new:
        return lambda text: text
    pattern = re.compile(re.escape(old) + r"(?![\w])")
    done: dict[str, str] = {}

    def moved(text: str) -> str:
        got = done.get(text)
        if got is None:
            got = done[text] = pattern.sub(lambda _: new, text)
        return got

    return moved


# -- recording -------------------------------------------------------------------------


@dataclasses.dataclass
class Recording:
    source: Source  # the recorded module's source (A's)
    inputs: list  # A's argument leaves (design note: keys)
    events: list  # ("wrap", source, value, var, nodes) | ("op", ..., meta key, nodes) | ("guard", Guard)
    result: Any = None
    side_version: int = 0
    owned: frozenset = frozenset()  # ids of A's modules, parameters and buffers
    ok: bool = True
    why: str = ""
    prepared: list | None = None  # the events with compiled templates (_prepare)


class Recorder:
    """Logs one call's events (installed on the OutputGraph while the call is traced)."""

    def __init__(self, tx, module_var, leaves: list) -> None:
        out = tx.out
        m = module_var.value
        owned = {id(x) for x in m.modules()}
        owned.update(id(p) for p in m.parameters())
        owned.update(id(b) for b in m.buffers())
        self.rec = Recording(module_var.source, leaves, [], owned=frozenset(owned))
        self.out = out
        self.nodes_before = len(out.graph.nodes)
        self.counted = 0  # nodes the logged events added
        self.made: set = set()  # nodes made by logged events
        self.mapped: set[int] = {id(v) for v in leaves} | {id(module_var)}
        self.side_version = out.side_effects.version
        self.prelude = len(out.prelude)
        self.prefix = tx.stack_trace()  # the caller's frames: each node's trace starts so
        # whether a source reads inside the module: its text names the module's (a read
        # chain's text holds each of its bases' text)
        self.under = re.compile(re.escape(module_var.source.expr()) + r"(?![\w])")

    def fail(self, why: str) -> None:
        if self.rec.ok:
            self.rec.ok, self.rec.why = False, why

    def wrapped(self, value, source, var, nodes: list) -> None:
        self.counted += len(nodes)
        if any(var is c for c in self.out.side_effects.mutated_containers):
            self.fail(f"reads {source.expr()}, which the trace changed")
        if self.under.search(source.expr()):
            self.rec.events.append(("wrap", source, value, var, nodes))
            _mark(var, self.mapped, self.made)
        elif id(value) in self.rec.owned:
            self.fail(f"read {source.expr()}, an object of the module, from outside it")

    def op(self, kind, target, args, kwargs, result, nodes: list, meta_key=None) -> None:
        self.counted += len(nodes)
        if id(target) in self.rec.owned or id(getattr(target, "__self__", None)) in (
            self.rec.owned
        ):
            self.fail("an op calls an object of the module")
        self.made.update(nodes)
        for a in itertools.chain(args, kwargs.values()):
            if not _mappable(a, self.mapped, self.made):
                self.fail(f"an argument of {getattr(target, '__name__', target)}: {a!r}")
        self.rec.events.append(("op", kind, target, args, kwargs, result, meta_key, nodes))
        _mark(result, self.mapped, self.made)

    def guard(self, g: Guard) -> None:
        if self.out._wrap_depth or self.out._op_depth:
            return  # made again by the replayed read or op
        if g.attrs is not None:
            for _, _, mode, value in g.attrs[1]:
                if mode == "i" and id(value) in self.rec.owned:
                    self.fail("a guard compares with an object of the module")
        for m in CONST_REF.finditer(g.code):
            if id(self.out.guards.consts[int(m.group(1))]) in self.rec.owned:
                self.fail("a guard compares with an object of the module")
        self.rec.events.append(("guard", g))

    def finish(self, result) -> Recording | None:
        out, rec = self.out, self.rec
        if out.side_effects.version != self.side_version or len(out.prelude) != self.prelude:
            self.fail("side effects")
        if out.shape_env.symbols or out.lifted_floats:
            self.fail("symbols or lifted floats")
        if len(out.graph.nodes) - self.nodes_before != self.counted:
            self.fail("nodes made outside reads and ops")
        if not _mappable(result, self.mapped, self.made):
            self.fail(f"the result {result!r}")
        for e in rec.events:
            for n in e[-1] if e[0] != "guard" else ():
                extra = set(n.meta) - _NODE_META
                if extra:  # set after the op by code a replay does not run
                    self.fail(f"node metadata {sorted(extra)}")
        if not rec.ok:
            log("graphs", f"call of {rec.source.expr()} not reusable: {rec.why}")
            return None
        rec.result = result
        rec.side_version = out.side_effects.version
        # each node's stack trace below the call, and its inner nn_module_stack as it is
        # now (the call's own entry comes next)
        rec.events = [
            e if e[0] == "guard" else (*e[:-1], [self._meta(n) for n in e[-1]]) for e in rec.events
        ]
        return rec

    def _meta(self, node) -> tuple:
        trace = node.meta.get("stack_trace")
        if trace is not None and trace.startswith(self.prefix):
            trace = (trace[len(self.prefix) :],)  # below the call: after B's caller's frames
        return trace, node.meta.get("nn_module_stack")


def _mark(v: Any, mapped: set[int], made: set) -> None:
    mapped.add(id(v))
    if isinstance(v, TensorVar):
        made.add(v.node)
    for child in _children(v):
        _mark(child, mapped, made)


def _children(v: Any) -> list:
    if isinstance(v, TupleVar | ListVar | SizeVar):
        return list(v.items)
    if isinstance(v, SliceVar):
        return list(v.parts)
    if isinstance(v, DictVar):
        return list(v.items.values())
    return []


def _mappable(v: Any, mapped: set[int], made: set) -> bool:
    if id(v) in mapped or isinstance(v, ConstVar):
        return True
    if isinstance(v, TensorVar):
        return v.node not in made  # a Var made before the call: the same for B
    if type(v) in (TupleVar, NamedTupleVar, ListVar, SizeVar, SliceVar):
        return all(_mappable(i, mapped, made) for i in _children(v))
    return False


# -- replaying -------------------------------------------------------------------------


def _alike(a: object, b: object) -> bool:
    """Whether B's value ``b`` stands where A's ``a`` stood (design note)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return tensor_metadata(a) == tensor_metadata(b) and a.is_leaf == b.is_leaf
    if isinstance(a, nn.Module):
        return True
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(_alike(a[k], b[k]) for k in a)
    if is_constant_value(a) or isinstance(a, torch.dtype | torch.device | torch.layout):
        if isinstance(a, float) and math.isnan(a):
            return math.isnan(b)
        return a == b and repr(a) == repr(b) if isinstance(a, float) else a == b
    if isinstance(a, types.MethodType):
        return a.__func__ is b.__func__ and _alike(a.__self__, b.__self__)
    return a is b


def _map_var(a: Any, b: Any, varmap: dict[int, Any]) -> None:
    """Map A's Var ``a`` to B's ``b``, and their items alike (the values were compared:
    the structures match)."""
    varmap[id(a)] = b
    for x, y in zip(_children(a), _children(b)):
        _map_var(x, y, varmap)


def _remap(v: Any, varmap: dict[int, Any]) -> Any:
    got = varmap.get(id(v))
    if got is not None:
        return got
    if type(v) is TupleVar:
        return TupleVar([_remap(i, varmap) for i in v.items])
    if type(v) is NamedTupleVar:
        return NamedTupleVar(v.cls, [_remap(i, varmap) for i in v.items])
    if type(v) is ListVar:
        return ListVar([_remap(i, varmap) for i in v.items])
    if type(v) is SizeVar:
        return SizeVar([_remap(i, varmap) for i in v.items])
    if type(v) is SliceVar:
        return SliceVar(*[_remap(i, varmap) for i in v.parts])
    return v  # a constant, or a Var made before the call


_BASE = "__k_base"  # the module's object in a recording's templates


def _prepare(rec: Recording) -> list:
    """The recording's events with, for each read and each guard about the module, its
    expression as a template over ``__k_base`` (the module called), compiled once: a
    replay evaluates them against its own module without compiling anything."""
    if rec.prepared is not None:
        return rec.prepared
    sub = _text_rerooter(rec.source.expr(), _BASE)
    prepared: list = []
    for e in rec.events:
        if e[0] == "wrap":
            _, src, value, var, metas = e
            read = sub(src.expr())
            steps = _steps(src, rec.source)
            prepared.append(("wrap", src, steps, _compiled(read), value, var, metas))
        elif e[0] == "guard":
            g = e[1]
            code = sub(g.code)
            if code == g.code:
                continue  # not about the module: it holds already
            attrs = (sub(g.attrs[0]), g.attrs[1]) if g.attrs is not None else None
            tensor = sub(g.tensor) if g.tensor is not None else None
            prepared.append(("guard", _compiled(code), code, sub(g.what), tensor, g.native, attrs))
        else:
            prepared.append(e)
    rec.prepared = prepared
    return prepared


def _compiled(expr: str) -> types.CodeType:
    return compile(expr, "<kiln reused call>", "eval")


def _steps(src: Any, base: Source) -> list | None:
    """The sources from ``base`` (excluded) up to ``src`` when each reads from the one
    before through its ``base`` alone (attribute, item, entry reads); else None."""
    steps = []
    while src != base:
        if getattr(src, "base", None) is None:
            return None
        if any(isinstance(getattr(src, n), Source) and n != "base" for n in _FIELDS[type(src)]):
            return None
        steps.append(src)
        src = src.base
    steps.reverse()
    return steps


def _rebuilt(steps: list, new: Source) -> Source:
    for step in steps:
        new = type(step)(*[new if n == "base" else getattr(step, n) for n in _FIELDS[type(step)]])
    return new


def replay(tx, rec: Recording, module_var, leaves: list) -> Any | None:
    """B's result from A's recording, or None (nothing changed) where B differs."""
    out = tx.out
    effects = out.side_effects
    if effects.version != rec.side_version:
        return None  # something the recording read may have been set since
    if effects.attr_stores or effects.module_hooks:
        # B's own objects must hold nothing the trace set (A's held nothing: a read of it
        # fails the recording)
        m = module_var.value
        owned = {id(x) for x in m.modules()} | {id(p) for p in m.parameters()}
        if any(id(k) in owned for k in effects.module_hooks) or any(
            id(getattr(obj, "value", None)) in owned for obj, _, _ in effects.attr_stores.values()
        ):
            return None
    old, new = rec.source, module_var.source
    new_expr = new.expr()
    root = out.root_frame
    ns = guard_namespace(out.guards, root.func.__globals__)  # what guard text reads
    ns.update(zip(root.param_names, root.args, strict=True))
    ns.update(__k_fn=root.func, **{_BASE: module_var.value})
    # 1. check, touching nothing
    plan: list = []
    for e in _prepare(rec):
        if e[0] == "wrap":
            _, src, steps, code, value, var, metas = e
            try:
                got = eval(code, ns)
            except Exception:  # the user's objects: anything may raise
                got = _MISSING
            if got is _MISSING or not _alike(value, got):
                log("graphs", f"call of {new_expr} not reused: a read differs ({src.expr()})")
                return None
            seen = out._wrapped.get(id(got))
            if seen is not None and any(seen is c for c in effects.mutated_containers):
                return None  # B reads a container the trace changed
            moved = _rebuilt(steps, new) if steps is not None else reroot(src, old, new)
            plan.append(("wrap", moved, got, var, metas))
        elif e[0] == "guard":
            _, code, text, what, tensor, native, attrs = e
            try:
                holds = bool(eval(code, ns))
            except Exception:
                holds = False
            if not holds:
                log("graphs", f"call of {new_expr} not reused: {what} fails")
                return None
            plan.append(
                (
                    "guard",
                    Guard(
                        text.replace(_BASE, new_expr),
                        what.replace(_BASE, new_expr),
                        tensor.replace(_BASE, new_expr) if tensor is not None else None,
                        native,
                        (attrs[0].replace(_BASE, new_expr), attrs[1]) if attrs else None,
                    ),
                )
            )
        else:
            plan.append(e)
    # 2. run the events against B
    varmap: dict[int, Any] = {id(a): b for a, b in zip(rec.inputs, leaves)}
    keys: dict[str, str] = {}
    text = _text_rerooter(old.expr(), new_expr)
    from kiln_capture.variables.modules import _call_ids

    prefix = tx.stack_trace()
    for e in plan:
        kind = e[0]
        if kind == "guard":
            g = e[1]
            out.guards.add(g.code, g.what, g.tensor, g.native, g.attrs)
            continue
        n = len(out.graph.nodes)
        if kind == "wrap":
            _, src, value, var, metas = e
            _map_var(var, out.wrap(value, src), varmap)
        else:
            _, op_kind, target, args, kwargs, result, meta_key, metas = e
            made = out.tensor_op(
                op_kind,
                target,
                [_remap(a, varmap) for a in args],
                {k: _remap(v, varmap) for k, v in kwargs.items()},
                meta_key,
            )
            _map_var(result, made, varmap)
        nodes = out.last_nodes(len(out.graph.nodes) - n)
        if len(nodes) != len(metas):
            continue  # (a read B shares with an earlier one makes no placeholder)
        for node, (trace, stack) in zip(nodes, metas):
            if trace is not None:
                node.meta["stack_trace"] = prefix + trace[0] if type(trace) is tuple else trace
            if stack:
                node.meta["nn_module_stack"] = {
                    _new_key(k, keys, text, _call_ids): (text(path), cls)
                    for k, (path, cls) in stack.items()
                }
    counters.bump("reused_calls")
    line = f"{new_expr} ({type(module_var.value).__name__}): replayed {old.expr()}'s trace"
    if len(REPLAYED) < 4096:
        REPLAYED.append(line)
    log("graphs", f"call of {line}")
    return _remap(rec.result, varmap)


def _new_key(key: str, keys: dict[str, str], text, ids) -> str:
    got = keys.get(key)
    if got is None:
        path = key.rpartition("@")[0]
        got = keys[key] = f"{text(path)}@{next(ids)}"
    return got


# -- the hook in ModuleVar.call ----------------------------------------------------------


def call(tx, module_var, args: list, kwargs: dict, run):
    """``run()`` (the call traced as usual), recorded; or a replay of an earlier call."""
    out = tx.out
    keyed = call_key(out, module_var, args, kwargs)
    if keyed is None:
        return run()
    key, leaves = keyed
    recordings = out.call_recordings
    rec = recordings.get(key)
    if rec is False:  # a call of this key was not reusable: evaluated each time
        return run()
    if rec is not None:
        result = replay(tx, rec, module_var, leaves)
        if result is not None:
            return result
        return run()
    if len(recordings) >= _MAX_RECORDINGS:
        return run()
    kind = key[:2]  # the module's class and forward
    if kind not in out.call_kinds:
        # the first call of a class is evaluated without recording: most modules are
        # called once (the model, its encoder, embeddings), and a recording costs every
        # read, op and guard of the call a little, for each recording around it
        out.call_kinds.add(kind)
        return run()
    recorder = Recorder(tx, module_var, leaves)
    out.recorders.append(recorder)
    try:
        result = run()
    finally:
        out.recorders.remove(recorder)
    rec = recorder.finish(result)
    recordings[key] = rec if rec is not None else False
    return result
