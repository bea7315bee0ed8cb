"""Turning one frame into a cache entry: trace, split at graph breaks, generate code.

The root frame is evaluated symbolically. When a step cannot be captured the whole
trace restarts with that instruction marked as a break (restarting is simpler and safer
than undoing a half-done inline); on reaching it, everything before becomes one graph,
the step runs eagerly in generated code, and a continuation function (bytecode/resume.py)
runs the rest of the frame, itself captured when the hook sees it.

Inside a loop the continuation re-enters the loop (the loop's iterator is one of the
stack values it takes), so its own break in the next iteration makes a continuation of
the continuation; ``config.loop_resume_limit`` bounds that chain. Inside a ``with`` block
of a grad mode or autocast, the generated code enters an equal real context and hands
its ``__exit__`` on. Inside exception handlers (``try``, ``with``), the step runs under a
Python ``try``: what it raises goes to a second continuation that enters the frame's code
at the step itself with a ``Reraise`` in place of the callable, so the frame's own
handlers see the exception at the right place (that path then runs eagerly).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
import time
import types
from dataclasses import dataclass, field

import torch
from torch import fx

from kiln_capture import breaks, frame_store, graph_data
from kiln_capture import stats as counters
from kiln_capture.breaks import GraphBreak
from kiln_capture.bytecode.resume import keeps_first_slot, live_locals, make_resume_code
from kiln_capture.bytecode.rewrite import covering_handlers, in_exception_range
from kiln_capture.codegen import CodeGen, build_function
from kiln_capture.config import config
from kiln_capture.dynamic import FrameShapes
from kiln_capture.errors import BackendError, GraphBreakError, Raised, Unsupported
from kiln_capture.evaluator import UNBOUND, NestedStop, Return, RootFrame
from kiln_capture.guards import GuardSet, hoist_args
from kiln_capture.log import log
from kiln_capture.output import OutputGraph
from kiln_capture.variables.base import NULL, NullVar, Var
from kiln_capture.variables.contexts import ContextMethodVar
from kiln_capture.variables.exceptions import Reraise
from kiln_capture.variables.generators import drain_generators
from kiln_capture.variables.iterators import IteratorVar
from kiln_capture.variables.sizes import SymIntVar

MAX_RESTARTS = 32
_STEP_CALLS = frozenset(
    {
        "CALL",
        "CALL_FUNCTION_EX",
        "BINARY_SUBSCR",
        "FORMAT_VALUE",
        "BINARY_OP",
        "COMPARE_OP",
        "CONTAINS_OP",
    }
)
_STEP_JUMPS = {
    "POP_JUMP_IF_TRUE": True,
    "POP_JUMP_FORWARD_IF_TRUE": True,
    "POP_JUMP_BACKWARD_IF_TRUE": True,
    "POP_JUMP_IF_FALSE": False,
    "POP_JUMP_FORWARD_IF_FALSE": False,
    "POP_JUMP_BACKWARD_IF_FALSE": False,
}
_STEP_JUMP_OR_POP = {"JUMP_IF_TRUE_OR_POP": True, "JUMP_IF_FALSE_OR_POP": False}

# (code, offset, stack presence, params) -> continuation code; one code object per site
_RESUME_CODES: dict[tuple, types.CodeType] = {}
# continuation code -> the key it was made from (code, offset, stack presence, params)
_RESUME_ORIGIN: dict[types.CodeType, tuple] = {}
# continuation code -> how many loop resumes led to it (a break inside a loop resumes in a
# continuation that re-enters the loop; its next break makes a continuation of that one)
_LOOP_DEPTH: dict[types.CodeType, int] = {}
# continuations whose prologue calls a callee's continuation (see "nested breaks")
_NESTED_CODES: set[types.CodeType] = set()
# continuation codes that must run eagerly (past config.loop_resume_limit)
EAGER_RESUME_CODES: set[types.CodeType] = set()
# continuation code -> its parameters that held symbolic sizes at the break (they stay
# symbolic there: RootFrame, OutputGraph.wrap_size)
_SIZE_PARAMS: dict[types.CodeType, set[str]] = {}


@dataclass
class CacheEntry:
    guard: types.FunctionType
    run: types.FunctionType
    guard_set: GuardSet
    params: list[str]
    globals: dict
    graphs: list[fx.GraphModule] = field(default_factory=list)
    traced_code: frozenset[tuple[str, str]] = frozenset()  # (file, name); frame_store.py


@dataclass
class SkipFrame:
    reason: str
    graph_break: GraphBreak | None = None


class _Restart(Exception):
    def __init__(self, offset: int, error: Unsupported) -> None:
        self.offset = offset
        self.error = error


def compile_frame(
    code: types.CodeType, func, args: tuple, ctx, frame_shapes: FrameShapes | None = None
) -> CacheEntry | SkipFrame:
    """Trace ``func``'s frame into a cache entry. ``frame_shapes`` holds the sizes earlier
    compiles of this frame saw (automatic dynamic shapes, dynamic.py)."""
    break_at: dict[int, Unsupported] = {}
    nested: tuple | None = None  # see "nested breaks"
    nested_error: Unsupported | None = None
    tried_nested: set[int] = set()
    for _ in range(MAX_RESTARTS):
        out = OutputGraph(
            func.__globals__,
            dynamic=getattr(ctx, "dynamic", False),
            frame_shapes=frame_shapes,
            fullgraph=ctx.fullgraph,
        )
        try:
            sizes = frozenset(_SIZE_PARAMS.get(code, ()))
            root = RootFrame(out, code, func, args, set(break_at), sizes)
            root.nested_stop = nested
            kind, value = _run_root(root)
        except _Restart as r:
            stop = None if ctx.fullgraph else _nested_stop(root, r)
            if stop is not None and r.offset not in tried_nested and r.offset not in break_at:
                tried_nested.add(r.offset)
                nested, nested_error = stop, r.error
                continue
            nested = None
            if r.offset in break_at:
                return SkipFrame(f"break at offset {r.offset} repeated")
            _break_at(break_at, code, r.offset, r.error, ctx)
            continue
        except Unsupported as e:  # wrapping the arguments failed
            return SkipFrame(f"{e.kind.id}: {e.detail}")
        if kind == "nested":
            entry = _finish_nested_break(out, root, value, nested_error, ctx)
            if entry is not None:
                return entry
            _break_at(break_at, code, nested[0], nested_error, ctx)  # at the call, as before
            nested = None
            continue
        if kind == "return":
            return _finish_return(out, root, value, ctx)
        if kind == "raise":
            offset, error = value
            entry = _finish_return(out, root, error.exc, ctx, raises=True)
            if isinstance(entry, CacheEntry):
                return entry
            break_at[offset] = error  # the exception cannot be rebuilt: break at the step
            continue
        moved = None if ctx.fullgraph else _enclosing_generic_with(root)
        if moved is not None and moved[0] not in break_at:
            break_at[moved[0]] = moved[1]  # enter that manager in Python, then resume
            continue
        drain_generators([*root.stack, *root.locals.values()])
        return _finish_break(out, root, value, break_at[root.instructions[value].offset], ctx)
    return SkipFrame("too many graph breaks in one frame")


def _break_at(break_at: dict, code: types.CodeType, offset: int, error, ctx) -> None:
    """Break at ``offset`` on the next run; inside a loop, also where an iteration starts
    (see "breaks inside for loops")."""
    break_at[offset] = error
    head = None if ctx.fullgraph else _loop_head(code, offset)
    if head is not None and head[0] == _entry_offset(code):
        head = None  # a while loop's iteration continuation: it starts there
    if head is not None and head[0] not in break_at:
        at, next_in_python = head
        what = "the loop's next() runs in Python" if next_in_python else "a new iteration"
        entry = Unsupported(error.kind, f"{what}: its body breaks ({error.detail})")
        entry.loop_entry = not next_in_python
        break_at[at] = entry


def _run_root(root: RootFrame):
    while True:
        ins = root.instructions[root.ip]
        if ins.offset in root.break_at:
            return "break", root.ip
        try:
            root.step()
        except Return as r:
            return "return", r.value
        except Raised as e:  # no handler of the trace caught it: it leaves the frame
            return "raise", (ins.offset, e)
        except NestedStop as s:
            return "nested", s.frame
        except Unsupported as e:
            raise _Restart(ins.offset, e) from None


def _compile_graph(
    out: OutputGraph, cg: CodeGen, ctx, restore_grad: bool = False
) -> tuple[object, fx.GraphModule | None, list[str]]:
    if out.ops == 0:
        return None, None, []
    graph = out.graph
    out.close_autocast()
    if restore_grad and out.grad_enabled != out.initial_grad:  # cut inside a grad-mode block: the
        # generated code re-enters the block, so the graph leaves the mode as it found it
        graph.call_function(torch._C._set_grad_enabled, (out.initial_grad,))
    graph.output(tuple(t.node for t in cg.outputs))
    kept = []
    for node in list(graph.nodes):
        if node.op == "placeholder":
            if node.users:
                kept.append(node)
            else:
                graph.erase_node(node)
    inputs = [out.input_sources[n] for n in kept]
    position = {n: i for i, n in enumerate(out.input_sources)}  # (as example_inputs)
    examples = [out.example_inputs[position[n]] for n in kept]
    gm = fx.GraphModule(torch.nn.Module(), graph, class_name="KilnCaptured")
    gm.meta["shape_env"] = out.shape_env  # the symbols of its inputs' sizes (kiln-shapes)
    # values of the data were compiled speculating inside some op: a copy runs eagerly
    # for a call whose data takes the other side (_eager_when_assumption_fails)
    eager = _graph_copy(gm) if out.shape_env.has_unbacked else None
    log("graphs", f"captured graph {len(ctx.graphs)} ({out.ops} ops)\n{gm.code}")
    exprs = [s.expr() for s in inputs]
    if eager is None and frame_store.enabled(ctx):  # kept as it is before the backend sees it
        gm.meta["kiln_capture_data"] = graph_data.describe(gm, exprs)
    index = len(ctx.graphs)
    compiled = compile_captured(ctx, gm, examples, exprs, out.guards)
    if eager is not None:
        compiled = _eager_when_assumption_fails(compiled, eager, index)
    return compiled, gm, exprs


def compile_captured(ctx, gm: fx.GraphModule, examples: list, exprs: list[str], guards: GuardSet):
    """``ctx.backend``'s callable for a captured graph (or one frame_store.py rebuilt)."""
    start = time.perf_counter()
    try:
        compiled = ctx.backend(gm, examples)
    except BackendError:
        raise
    except Exception as e:
        raise BackendError(ctx.backend, e) from e
    ctx.backend_seconds += time.perf_counter() - start
    fast = getattr(compiled, "kiln_guarded_call", None)
    if callable(fast) and guards.guards_tensors(exprs, examples):
        # every input's dtype, device, shape, stride and requires_grad is guarded before
        # the graph runs: the backend may skip its own checks of them (kiln_aot.api,
        # "Guarded calls")
        compiled = fast
    counters.bump("graphs")
    ctx.graphs.append(gm)
    if ctx.recorder is not None:
        ctx.recorder.graphs.append(gm)
    return compiled


def _graph_copy(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return fx.GraphModule(gm, graph, class_name="KilnCapturedEager")


def _eager_when_assumption_fails(compiled, eager: fx.GraphModule, index: int):
    """``compiled``, running ``eager`` (the captured graph itself, eagerly) for a call whose
    data takes the side of a branch inside an op that the compiled code did not assume
    (kiln_shapes.AssumptionFailed): eager's result, or eager's own error. Warned once per
    graph and counted as an eager frame."""
    from kiln_shapes import AssumptionFailed

    warned: list[bool] = []

    def run(*args):
        try:
            return compiled(*args)
        except AssumptionFailed as e:
            counters.eager_frame("a value of the data took a branch the graph did not assume")
            if not warned:
                warned.append(True)
                import warnings

                warnings.warn(f"{e} (graph {index} ran eagerly for this call)", stacklevel=2)
            return eager(*args)

    return run


def _graph_lines(compiled, inputs: list[str]) -> list[str]:
    if compiled is None:
        return []
    reads, args = hoist_args(inputs, "__k_a")
    return [*reads, f"__k_out = __k_graph({', '.join(args)})"]


def _finish_return(
    out: OutputGraph, root: RootFrame, value: Var, ctx, raises: bool = False
) -> CacheEntry | SkipFrame:
    """The frame returns ``value`` (or, with ``raises``, raises it: an exception made in
    the trace that none of its handlers caught): the graph runs, the side effects are
    applied, and the generated code returns the value (raises an equal exception, as
    eager code would)."""
    cg = CodeGen(out)
    cg.collect([value, *out.side_effects.values()])
    try:
        expr = cg.rebuild(value)
        compute, apply = out.side_effects.replay(cg)
    except Unsupported as e:
        return SkipFrame(f"{e.kind.id}: {e.detail}")
    compiled, gm, inputs = _compile_graph(out, cg, ctx)
    extra: dict = {}
    body = out.prelude + _graph_call(root, compiled, inputs, extra)
    if compiled is None and out.grad_enabled != out.initial_grad:
        # no graph to carry it: the frame still leaves the grad mode it set
        body.append(f"torch._C._set_grad_enabled({out.grad_enabled})")
    body += cg.preamble + [f"__k_ret = {expr}"] + compute + apply
    body.append("raise __k_ret" if raises else "return __k_ret")
    return _entry(out, root, cg, compiled, gm, body, extra)


def _entry(out, root, cg, compiled, gm, body, extra_ns) -> CacheEntry:
    ns = cg.namespace(compiled, extra_ns)
    run = build_function("__run", root.param_names, body, ns)
    guard = out.guards.compile(root.param_names, out.globals)
    lines = [g.what for g in out.guards.guards]
    if out.shape_env.symbols:
        symbols, shape_guards = out.guards.shapes.describe()
        lines += [f"symbol {s}" for s in symbols] + [f"shape guard {g}" for g in shape_guards]
    log(
        "guards",
        f"guards for {root.code.co_qualname} ({root.code.co_filename}:{root.code.co_firstlineno}):\n  "
        + "\n  ".join(lines),
    )
    return CacheEntry(
        guard,
        run,
        out.guards,
        root.param_names,
        out.globals,
        [gm] if gm is not None else [],
        frozenset(out.traced_code),
    )


# Design note: "breaks inside for loops"
# --------------------------------------
# A break inside a ``for`` loop's body also breaks at the loop's FOR_ITER: ``next()`` runs
# in Python there (``_finish_break``), so the frame's graph stops before the loop, and each
# iteration runs as the same two continuations of the frame's original code: the body up
# to the break (entered with the iterator and the item), and the rest of the body up to the
# FOR_ITER. A ``while`` loop's iteration starts a continuation at the body's first
# instruction (``loop_entry``: no step), its int locals symbolic from the start (a counter
# would otherwise be compiled once per value). Continuations are made from the original code (``_origin``), whichever
# continuation breaks, so the second iteration finds both compiled: a loop of any length
# costs the graphs of one iteration, not one continuation per iteration. Continuations
# return their successor's call as a ``Tail`` to the frame that called the first one,
# which calls it (``drive``): the loop does not nest Python frames per iteration.
# Left as before (a chain of continuations, one per iteration, up to loop_resume_limit):
# frames owning cells (their continuations take the frame's cells first), FOR_ITER inside
# a with/try block, and a continuation recompiled for half the cache size limit (guards
# that differ per iteration, a module per layer). A loop of two or three iterations can
# cost more graphs than the chain did: an int loop variable is compiled at 0, at 1 (both
# specialized) and then symbolic.


class Tail:
    """A continuation's call, returned to the driver that called the continuation."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, *args) -> None:
        self.fn, self.args = fn, args


_DRIVEN = threading.local()


def drive(fn, *args):
    """Call the continuation ``fn``, then each one it hands back as a Tail, in this frame."""
    r = Tail(fn, *args)
    while type(r) is Tail:
        _DRIVEN.on = r.fn  # taken by the continuation's run function, first thing
        try:
            r = r.fn(*r.args)
        finally:
            _DRIVEN.on = None
    return r


def tail_or_drive(fn):
    """How a continuation's run function calls its own continuation: as a Tail where
    ``drive`` called it (the flag is taken before any user code runs), else by driving.
    The flag names the function ``drive`` called: where that one runs eagerly, a
    continuation its code calls (a nested break's callee) drives its own."""
    driven = getattr(_DRIVEN, "on", None)
    _DRIVEN.on = None
    return Tail if driven is fn else drive


def _loop_head(code: types.CodeType, offset: int) -> tuple[int, bool] | None:
    """Where the innermost loop around ``offset`` starts an iteration: a ``for`` loop's
    FOR_ITER (True: next() runs in Python there), or a ``while`` loop's first body
    instruction, the target of its backward jump (False: the continuation starts there).
    None in a frame owning cells (its continuations are not made from the original code)
    and where a with/try block covers that place."""
    import dis

    if _first_code(code).co_cellvars:
        return None
    head = None
    for ins in dis.get_instructions(code):
        if ins.opname == "FOR_ITER" and ins.offset < offset < ins.argval:
            if head is None or ins.offset > head[0]:
                head = (ins.offset, True)
        elif (
            ins.opcode in dis.hasjrel
            and isinstance(ins.argval, int)
            and ins.argval < offset < ins.offset
            and (head is None or ins.argval > head[0])
        ):
            head = (ins.argval, False)  # a backward jump: a while loop (or a for's back-edge)
    if head is not None and not head[1]:
        at = next(i for i in dis.get_instructions(code) if i.offset == head[0])
        if at.opname == "FOR_ITER":
            head = (head[0], True)
    if head is None or covering_handlers(code, head[0]):
        return None
    return head


def _origin(code: types.CodeType) -> tuple[types.CodeType, int] | None:
    """A continuation's original code and how far the prologue moved its body, where the
    continuation's own continuations are made from the original (a frame owning no cells:
    the closure of each is the original function's)."""
    key = _RESUME_ORIGIN.get(code)
    if key is None or _first_code(code).co_cellvars or code in _NESTED_CODES:
        return None
    return key[0], len(code.co_code) - len(key[0].co_code)


def _compiled_entries(code: types.CodeType, ctx) -> int:
    from kiln_capture import hook

    return len(hook._cache.get((code, id(ctx.backend), ctx.dynamic)) or ())


def _entry_offset(code: types.CodeType) -> int | None:
    """Where a continuation's body starts running (in its own code's offsets)."""
    key = _RESUME_ORIGIN.get(code)
    if key is None or code in _NESTED_CODES:
        return None
    return key[1] + len(code.co_code) - len(key[0].co_code)


def _first_code(code: types.CodeType) -> types.CodeType:
    """The user's own code a continuation (of a continuation...) was made from."""
    while code in _RESUME_ORIGIN:
        code = _RESUME_ORIGIN[code][0]
    return code


def _loop_around(code: types.CodeType, offset: int, instructions) -> bool:
    import dis

    return any(
        ins.offset >= offset
        and ins.opcode in dis.hasjrel
        and isinstance(ins.argval, int)
        and ins.argval <= offset
        for ins in instructions
    )


def _finish_break(
    out: OutputGraph, root: RootFrame, idx: int, error: Unsupported, ctx
) -> CacheEntry | SkipFrame:
    ins = root.instructions[idx]
    where = error.where or root.location()
    brk = GraphBreak(
        error.kind, error.detail, where[0], where[1], where[2], True, tuple(error.chain)
    )
    if ctx.fullgraph and error.kind is not breaks.REGION_BOUNDARY:
        raise GraphBreakError(brk)
    code = root.code
    # a 3.12 comprehension's saved local (LOAD_FAST_AND_CLEAR) that was unbound is a NULL
    # on the stack: the continuation pushes NULL there, and STORE_FAST of it unbinds again
    stack = [NULL if v is UNBOUND else v for v in root.stack]

    def skip(reason: str) -> SkipFrame:
        b = dataclasses.replace(brk, detail=f"{brk.detail}; {reason}", resumed=False)
        _record_break(ctx, b)
        # the eager frame's warning names the break's line and what to change, too
        where = f"[{brk.kind.id}] {brk.detail} at {brk.filename}:{brk.lineno}"
        return SkipFrame(f"{reason} ({where}; fix: {brk.kind.hint})", b)

    handlers = covering_handlers(code, ins.offset)
    entered_here = {id(w[1]) for w in root.generic_withs}
    if "with" in handlers and (
        not any(_is_exit(v) for v in stack) or any(id(v) in entered_here for v in stack)
    ):
        return skip("the break is inside a with block of a context manager kiln cannot re-enter")
    pushes = [True]  # what the step leaves on the stack for its continuation
    if ins.opname in _STEP_CALLS:
        if ins.opname == "CALL":
            base = len(stack) - ins.arg - 2
        elif ins.opname == "CALL_FUNCTION_EX":
            base = len(stack) - (3 if ins.arg & 1 else 2) - 1
        elif ins.opname == "FORMAT_VALUE":
            base = len(stack) - (2 if ins.arg & 4 else 1)
        else:
            base = len(stack) - 2
        nxt = root.instructions[idx + 1].offset
        targets = [(nxt, base, True)]
    elif ins.opname == "BEFORE_WITH":  # entered in Python: the continuation starts the block
        base = len(stack) - 1
        targets = [(root.instructions[idx + 1].offset, base, True)]
        pushes = [True, True]
    elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):  # read in Python (it may raise)
        base = len(stack) - 1
        targets = [(root.instructions[idx + 1].offset, base, True)]
        if ins.opname == "LOAD_METHOD" or (sys.version_info >= (3, 12) and ins.arg & 1):
            pushes = [False, True]  # NULL, then the bound attribute (as the trace models it)
    elif ins.opname == "STORE_SUBSCR":  # ``container[key] = value`` in Python
        base = len(stack) - 3
        targets = [(root.instructions[idx + 1].offset, base, False)]
    elif ins.opname in _STEP_JUMPS or ins.opname in _STEP_JUMP_OR_POP:
        base = len(stack) - 1
        nxt = root.instructions[idx + 1].offset
        targets = [(ins.argval, base, False), (nxt, base, False)]
    elif getattr(error, "loop_entry", False):  # a while loop's iteration: a continuation
        base = len(stack)
        targets = [(ins.offset, base, False)]
        pushes = []
    elif ins.opname == "FOR_ITER":
        # next() of the iterator in Python (a filter's predicate on tensor values): the
        # body's continuation gets the iterator and the item, the loop's exit neither.
        # Under a try block (a 3.12 comprehension's own cleanup handler too), what next()
        # raises is re-raised by FOR_ITER on a Reraise in the frame's code
        base = len(stack) - 1
        body = root.instructions[idx + 1]
        if body.opname == "STORE_FAST" and body.argval not in live_locals(
            code, root.instructions[idx + 2].offset
        ):  # ``for _ in ...``: the item is never read, the body starts after its store
            body, pushes = root.instructions[idx + 2], []
        targets = [(body.offset, base + 1, True), (_loop_exit(root, ins), base, False)]
    else:
        return skip(f"no continuation after {ins.opname}")
    bound = {n: v for n, v in root.locals.items() if v is not UNBOUND and n in code.co_varnames}
    live = set()
    for off, _, pushes_result in targets:
        here = live_locals(code, off)
        store = root.instructions[idx + 1]
        if ins.opname == "FOR_ITER" and pushes_result and store.opname == "STORE_FAST":
            here.discard(store.argval)  # the body's first step stores the loop variable
        live |= here
    params = [n for n in code.co_varnames if n in bound and n in live and n not in code.co_cellvars]
    in_loop = any(isinstance(v, IteratorVar) for v in stack) or _loop_around(
        code, ins.offset, root.instructions
    )
    depth = _LOOP_DEPTH.get(code, 0)
    origin = _origin(code)
    if origin is not None and _compiled_entries(code, ctx) >= config.cache_size_limit // 2:
        origin = None  # recompiled per iteration (a module per layer): a chain again
    base_code, shift = origin if origin is not None else (code, 0)
    if origin is not None:  # made from the original code: a bounded set of continuations
        order = {n: i for i, n in enumerate(base_code.co_varnames)}
        params.sort(key=order.__getitem__)
    elif in_loop:
        depth += 1
    eager = depth > config.loop_resume_limit

    cg = CodeGen(out)
    # cells: the frame's own cells are made by the generated code (empty first, filled
    # after the preamble: a closure in a cell may hold that cell) and handed to the
    # continuation as its first free variables (bytecode/resume.py); closures rebuilt
    # here share them
    frame_cells = [root.cells[c] for c in code.co_cellvars if c in root.cells]
    if len(frame_cells) != len(code.co_cellvars):
        return skip("a cell of the frame was not made")
    cg.frame_cells = {id(c): f"__k_c{i}" for i, c in enumerate(frame_cells)}
    cg.collect(
        [v for v in stack if not isinstance(v, NullVar)]
        + [bound[n] for n in params]
        + [c.contents for c in frame_cells if c.contents is not None]
        + out.side_effects.values()
    )
    try:
        temps = [
            f"__k_t{i} = {cg.rebuild(v)}" for i, v in enumerate(stack) if not isinstance(v, NullVar)
        ]
        local_exprs = [cg.rebuild(bound[n]) for n in params]
        locals_line = f"__k_l = ({''.join(e + ', ' for e in local_exprs)})"
        compute, apply = out.side_effects.replay(cg)
        fill_cells = [
            f"__k_c{i}.cell_contents = {cg.rebuild(c.contents)}"
            for i, c in enumerate(frame_cells)
            if c.contents is not None
        ]
    except Unsupported as e:
        return skip(f"cannot rebuild a live value ({e.detail})")
    make_cells = [f"__k_c{i} = __k_cell()" for i in range(len(frame_cells))]
    closure = (
        "(" + "".join(f"__k_c{i}, " for i in range(len(frame_cells))) + ") + "
        if frame_cells
        else ""
    ) + "(__k_fn.__closure__ or ())"
    below = [f"__k_t{i}" for i, v in enumerate(stack[:base]) if not isinstance(v, NullVar)]
    presence_below = [not isinstance(v, NullVar) for v in stack[:base]]

    extra: dict = {}

    def continuation(j: str, off: int, presence: list[bool], reraise: bool = False) -> str:
        """Register the continuation code entering at ``off`` with the stack values
        ``presence`` marks, then the live locals; return an expression for the function."""
        rcode = _resume_code(base_code, off - shift, presence, params, reraise)
        _LOOP_DEPTH[rcode] = depth
        sizes = {n for n in params if isinstance(bound[n], SymIntVar)}
        if getattr(error, "loop_entry", False):  # a while loop's counter: symbolic at once
            sizes |= {n for n in params if type(getattr(bound[n], "value", None)) is int}
        if sizes:
            _SIZE_PARAMS.setdefault(rcode, set()).update(sizes)
        if eager:  # a re-raising one is captured too: RootFrame wraps its Reraise
            EAGER_RESUME_CODES.add(rcode)
        if code.co_freevars or code.co_cellvars:
            extra[f"__k_rc{j}"] = rcode
            return f"__k_FunctionType(__k_rc{j}, __k_G, {rcode.co_name!r}, None, {closure})"
        extra[f"__k_resume{j}"] = types.FunctionType(rcode, out.globals, rcode.co_name)
        return f"__k_resume{j}"

    def call_with(fexpr: str, stack_args: list[str]) -> str:
        # a continuation is called through __k_go: drive(), or a Tail for the driver
        if keeps_first_slot(base_code, params):
            return f"__k_go({', '.join([fexpr, '__k_l[0]', *stack_args, '*__k_l[1:]'])})"
        return f"__k_go({', '.join([fexpr, *stack_args, '*__k_l'])})"

    calls = []
    try:
        for j, (off, _, pushes_result) in enumerate(targets):
            keep_top = ins.opname in _STEP_JUMP_OR_POP and j == 0
            presence = presence_below + (pushes if pushes_result or keep_top else [])
            top = [n for n, p in zip(["__k_x", "__k_r"][-len(pushes) :], pushes) if p]
            if not pushes_result:
                top = [f"__k_t{len(stack) - 1}"] if keep_top else []
            if ins.opname == "FOR_ITER" and pushes_result:  # the iterator, then the item
                presence = [*presence_below, True, *([True] if pushes else [])]
                top = [f"__k_t{base}", *(["__k_r"] if pushes else [])]
            fexpr = continuation(str(j), off, presence)
            calls.append(call_with(fexpr, [*below, *top]))
        reraise = None
        if handlers:  # the step may raise: re-raise it where the frame's handlers see it
            victim = _reraise_victim(ins, stack, base)
            fexpr = continuation(
                "x",
                _reraise_offset(root.instructions, idx),
                [not isinstance(v, NullVar) for v in stack],
                True,
            )
            args = [
                "__k_reraise(__k_exc)" if i == victim else f"__k_t{i}"
                for i, v in enumerate(stack)
                if not isinstance(v, NullVar)
            ]
            reraise = call_with(fexpr, args)
            extra["__k_reraise"] = Reraise
        if ins.opname == "BEFORE_WITH":
            extra["__k_enter_with"] = enter_with
    except Unsupported as e:
        return skip(e.detail)

    if getattr(error, "loop_entry", False):
        step = [f"return {calls[0]}"]
    else:
        step = _step_lines(ins, stack, base, root.kw_names, calls, reraise)
    compiled, gm, body = _step_body(
        out,
        cg,
        ctx,
        root,
        extra,
        make_cells,
        fill_cells,
        temps,
        [locals_line],
        compute,
        apply,
        step,
    )
    if eager:
        detail = (
            brk.detail + f"; the rest of the frame runs eagerly (more than "
            f"{config.loop_resume_limit} breaks resumed inside one loop)"
        )
        brk = dataclasses.replace(brk, detail=detail, resumed=False)
    _record_break(ctx, brk)
    return _entry(out, root, cg, compiled, gm, body, extra)


def _step_body(
    out, cg, ctx, root, extra, make_cells, fill_cells, temps, locals_lines, compute, apply, step
) -> tuple:
    """The compiled graph and the body of a break's generated code: the graph's call, the
    cells and the state it re-establishes, the locals, then the step (run with capture
    enabled again) that hands over to the continuation."""
    compiled, gm, inputs = _compile_graph(out, cg, ctx, restore_grad=True)
    # the graph left the grad mode it found; the blocks re-entered above (cg.preamble)
    # set theirs, and a mode set without a block (``torch.set_grad_enabled(False)`` as
    # a call) is set again, after them, for the step and the continuation
    regrad = []
    if out.grad_enabled != out.initial_grad:
        regrad = [f"torch._C._set_grad_enabled({out.grad_enabled})"]
    extra.update(__k_drive=drive, __k_entry=tail_or_drive)
    go = "__k_entry(__k_fn)" if root.code in _RESUME_ORIGIN else "__k_drive"
    body = (
        [f"__k_go = {go}"]
        + out.prelude
        + _graph_call(root, compiled, inputs, extra)
        + make_cells
        + cg.preamble
        + regrad
        + fill_cells
        + temps
        + locals_lines
        + compute
        + apply
        + ["__k_prev = __k_enable(True)", "try:"]
    )
    body += ["    " + s for s in step] + ["finally:", "    __k_enable(__k_prev)"]
    return compiled, gm, body


# Design note: "nested breaks"
# ----------------------------
# A break inside a function the frame called (one level down: the root frame's CALL, the
# callee's own CALL, say a print()) resumes both frames in one continuation, as
# torch.compile's nested graph breaks do, instead of breaking at the root frame's call
# (which runs the callee as a frame of its own: one graph more). The trace is run again
# and stops at the callee's step (``RootFrame.nested_stop``); the generated code runs the
# step, then calls a continuation of the root frame's code, entered after its CALL, whose
# prologue first calls a continuation of the callee's code (built by the generated code
# around the callee's closure cells, ``make_resume_code(call_args=...)``) and keeps its
# result where the CALL would have left it. Tracing that continuation inlines the
# callee's continuation: the rest of the callee and the rest of the caller make one
# graph. Left as before (a break at the root frame's call): a step other than a call,
# handlers or context managers around either place, a callee owning cells, a closure
# cell the root frame does not hold, other globals, and a call inside a loop.


# a generator's frame is resumed, not called, by the root's call: never a nested break
_NOT_PLAIN_CODE = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ITERABLE_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
)


def _nested_stop(root: RootFrame, r) -> tuple | None:
    """Where a nested break stops the trace: (root offset, callee code, callee offset)."""
    frames = getattr(r.error, "frames", None)
    if not frames or len(frames) < 2 or frames[-1] != (root.code, r.offset):
        return None
    ccode, coff = frames[-2]
    at = root.instructions[root.index_of[r.offset]]
    cins = next((i for i in _instructions(ccode) if i.offset == coff), None)
    if at.opname != "CALL" or cins is None or cins.opname != "CALL":
        return None
    if ccode.co_flags & _NOT_PLAIN_CODE or covering_handlers(root.code, r.offset):
        return None
    if _loop_around(root.code, r.offset, root.instructions):
        return None  # inside a loop: the loop's own continuations (see "breaks inside for loops")
    return (r.offset, ccode, coff)


def _instructions(code: types.CodeType) -> list:
    import dis

    return list(dis.get_instructions(code))


def _finish_nested_break(
    out: OutputGraph, root: RootFrame, frame, error: Unsupported, ctx
) -> CacheEntry | None:
    """The entry for a nested break (see "nested breaks"); None where it does not apply."""
    from kiln_capture.variables.functions import NestedFunctionVar, UserFunctionVar

    code, ccode = root.code, frame.code
    ins = root.current
    cidx = frame.ip
    cins = frame.instructions[cidx]
    fn = root.calling  # the root's CALL called the callee itself (not apply(), a module...)
    if type(fn) is UserFunctionVar:
        called = fn.fn.__code__
    elif type(fn) is NestedFunctionVar:
        called = fn.code
    else:
        return None
    if (
        called is not ccode
        or ccode.co_flags & _NOT_PLAIN_CODE
        or covering_handlers(code, ins.offset)
        or covering_handlers(ccode, cins.offset)
        or frame.contexts
        or frame.generic_withs
        or root.generic_withs
        or ccode.co_cellvars
        or frame.globals is not root.globals
        or any(isinstance(v, IteratorVar) for v in root.stack)
        or _loop_around(code, ins.offset, root.instructions)
        or _loop_around(ccode, cins.offset, frame.instructions)
    ):
        return None
    frame_cells = [root.cells[c] for c in code.co_cellvars if c in root.cells]
    if len(frame_cells) != len(code.co_cellvars):
        return None
    cell_names = {id(c): f"__k_c{i}" for i, c in enumerate(frame_cells)}
    for j, name in enumerate(code.co_freevars):
        cell_names.setdefault(id(root.cells[name]), f"__k_fn.__closure__[{j}]")
    try:
        callee_cells = [cell_names[id(frame.cells[n])] for n in ccode.co_freevars]
    except KeyError:
        return None  # a closure cell the root frame does not hold
    where = error.where or root.location()
    brk = GraphBreak(
        error.kind, error.detail, where[0], where[1], where[2], True, tuple(error.chain)
    )
    rstack = [NULL if v is UNBOUND else v for v in root.stack]
    cstack = [NULL if v is UNBOUND else v for v in frame.stack]
    cbase = len(cstack) - cins.arg - 2
    rnext = root.instructions[root.index_of[ins.offset] + 1].offset
    cnext = frame.instructions[cidx + 1].offset
    if in_exception_range(code, rnext):
        return None
    bound = {n: v for n, v in root.locals.items() if v is not UNBOUND and n in code.co_varnames}
    live = live_locals(code, rnext)
    params = [n for n in code.co_varnames if n in bound and n in live and n not in code.co_cellvars]
    cbound = {n: v for n, v in frame.locals.items() if v is not UNBOUND}
    clive = live_locals(ccode, cnext)
    cparams = [n for n in ccode.co_varnames if n in cbound and n in clive]
    below_c = [i for i, v in enumerate(cstack[:cbase]) if not isinstance(v, NullVar)]
    cpresence = [not isinstance(v, NullVar) for v in cstack[:cbase]] + [True]
    n_inner = len(below_c) + 1 + len(cparams)
    rpresence = [not isinstance(v, NullVar) for v in rstack] + [False, True] + [True] * n_inner
    try:
        crcode = _resume_code(ccode, cnext, cpresence, cparams)
        orcode = _resume_code(code, rnext, rpresence, params, call_args=n_inner)
    except Unsupported:
        return None

    cg = CodeGen(out)
    cg.frame_cells = {id(c): f"__k_c{i}" for i, c in enumerate(frame_cells)}
    cg.collect(
        [v for v in rstack + cstack if not isinstance(v, NullVar)]
        + [bound[n] for n in params]
        + [cbound[n] for n in cparams]
        + [c.contents for c in frame_cells if c.contents is not None]
        + out.side_effects.values()
    )
    try:
        temps = [
            f"__k_b{i} = {cg.rebuild(v)}"
            for i, v in enumerate(rstack)
            if not isinstance(v, NullVar)
        ]
        temps += [
            f"__k_t{i} = {cg.rebuild(v)}"
            for i, v in enumerate(cstack)
            if not isinstance(v, NullVar)
        ]
        locals_line = f"__k_l = ({''.join(cg.rebuild(bound[n]) + ', ' for n in params)})"
        clocals_line = f"__k_cl = ({''.join(cg.rebuild(cbound[n]) + ', ' for n in cparams)})"
        compute, apply = out.side_effects.replay(cg)
        fill_cells = [
            f"__k_c{i}.cell_contents = {cg.rebuild(c.contents)}"
            for i, c in enumerate(frame_cells)
            if c.contents is not None
        ]
    except Unsupported:
        return None
    make_cells = [f"__k_c{i} = __k_cell()" for i in range(len(frame_cells))]
    closure = (
        "(" + "".join(f"__k_c{i}, " for i in range(len(frame_cells))) + ") + "
        if frame_cells
        else ""
    ) + "(__k_fn.__closure__ or ())"
    cclosure = "(" + "".join(f"{c}, " for c in callee_cells) + ")" if callee_cells else "None"
    extra: dict = {"__k_rcn": crcode, "__k_rco": orcode}
    inner_stack = [f"__k_t{i}" for i in below_c] + ["__k_r"]
    if keeps_first_slot(ccode, cparams):
        inner = ["__k_cl[0]", *inner_stack, "*__k_cl[1:]"]
    else:
        inner = [*inner_stack, "*__k_cl"]
    cfn = f"__k_FunctionType(__k_rcn, __k_G, {crcode.co_name!r}, None, {cclosure})"
    oclosure = closure if code.co_freevars or code.co_cellvars else "None"
    ofn = f"__k_FunctionType(__k_rco, __k_G, {orcode.co_name!r}, None, {oclosure})"
    below = [f"__k_b{i}" for i, v in enumerate(rstack) if not isinstance(v, NullVar)]
    stack_args = [*below, cfn, *inner]
    if keeps_first_slot(code, params):
        call = f"__k_go({', '.join([ofn, '__k_l[0]', *stack_args, '*__k_l[1:]'])})"
    else:
        call = f"__k_go({', '.join([ofn, *stack_args, '*__k_l'])})"
    step = _step_lines(cins, cstack, cbase, frame.kw_names, [call], None)
    compiled, gm, body = _step_body(
        out,
        cg,
        ctx,
        root,
        extra,
        make_cells,
        fill_cells,
        temps,
        [locals_line, clocals_line],
        compute,
        apply,
        step,
    )
    _record_break(ctx, brk)
    return _entry(out, root, cg, compiled, gm, body, extra)


def _loop_exit(root: RootFrame, ins) -> int:
    """Where FOR_ITER goes when its iterator is exhausted (3.12: past the END_FOR at its
    jump target, which the exhausted FOR_ITER skips)."""
    for i, other in enumerate(root.instructions):
        if other.offset == ins.argval:
            if other.opname == "END_FOR":
                return root.instructions[i + 1].offset
            return other.offset
    return ins.argval


def _is_exit(v: Var) -> bool:
    """A with-statement's ``__exit__`` on the stack: of a grad mode or autocast, or the
    bound ``__exit__`` of any other context manager."""
    if isinstance(v, ContextMethodVar):
        return v.which == "exit"
    name = getattr(v, "name", None)
    fn = getattr(v, "fn", None)
    if fn is not None:
        name = getattr(getattr(fn, "fn", None), "__name__", name)
    return name == "__exit__"


def _enclosing_generic_with(root: RootFrame) -> tuple[int, Unsupported] | None:
    """At a graph break inside the block of a with-statement the trace entered on a
    context manager it does not model (no grad mode or autocast), the outermost such
    statement: its offset and the reason to break there instead. Generated code cannot
    re-enter a manager whose ``__enter__`` only ran symbolically, so the ``with`` itself
    becomes the step: the manager is entered in Python and its block continues in a
    continuation, which holds the real ``__exit__`` on its stack like any with-statement."""
    on_stack = {id(v) for v in root.stack}
    for offset, exit_fn, cls, where in root.generic_withs:
        if id(exit_fn) in on_stack:
            e = Unsupported(breaks.GENERIC_WITH, f"graph break inside `with <{cls.__qualname__}>:`")
            e.where = where
            return offset, e
    return None


def _step_lines(
    ins, stack: list[Var], base: int, kw_names: tuple, calls: list[str], reraise: str | None
) -> list[str]:
    """The unsupported step, run eagerly, then the call of its continuation. Under
    exception handlers the step runs in ``try``: what it raises is re-raised inside the
    frame's own code (``reraise``), where its ``except``/``finally``/``with`` see it."""
    t = [f"__k_t{i}" if not isinstance(v, NullVar) else None for i, v in enumerate(stack)]
    if ins.opname == "CALL":
        region = t[base:]
        fn, args = (region[1], region[2:]) if region[0] is None else (region[0], region[1:])
        n = len(kw_names)
        pos = args[: len(args) - n]
        kws = [f"{k}={a}" for k, a in zip(kw_names, args[len(args) - n :])] if n else []
        step, tail = f"__k_r = {fn}({', '.join(pos + kws)})", [f"return {calls[0]}"]
    elif ins.opname == "CALL_FUNCTION_EX":
        region = t[base + 1 :]
        call = f"{region[0]}(*{region[1]}" + (f", **{region[2]})" if ins.arg & 1 else ")")
        step, tail = f"__k_r = {call}", [f"return {calls[0]}"]
    elif ins.opname == "FORMAT_VALUE":
        conv = {0: "", 1: "str", 2: "repr", 3: "ascii"}[ins.arg & 3]
        spec = t[-1] if ins.arg & 4 else "''"
        step, tail = f"__k_r = format({conv}({t[base]}), {spec})", [f"return {calls[0]}"]
    elif ins.opname == "BINARY_SUBSCR":
        step, tail = f"__k_r = {t[-2]}[{t[-1]}]", [f"return {calls[0]}"]
    elif ins.opname in ("BINARY_OP", "COMPARE_OP"):  # a += b calls a.__iadd__, as here
        op = ins.argrepr
        if op.endswith("=") and op not in ("==", "!=", "<=", ">="):
            step = f"__k_r = {t[-2]}; __k_r {op} {t[-1]}"
        else:
            step = f"__k_r = {t[-2]} {op} {t[-1]}"
        tail = [f"return {calls[0]}"]
    elif ins.opname == "CONTAINS_OP":
        step = f"__k_r = {t[-2]} {'not in' if ins.arg else 'in'} {t[-1]}"
        tail = [f"return {calls[0]}"]
    elif ins.opname == "BEFORE_WITH":
        step, tail = f"__k_x, __k_r = __k_enter_with({t[-1]})", [f"return {calls[0]}"]
    elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
        step, tail = f"__k_r = getattr({t[-1]}, {ins.argval!r})", [f"return {calls[0]}"]
    elif ins.opname == "STORE_SUBSCR":
        step, tail = f"{t[-2]}[{t[-1]}] = {t[-3]}", [f"return {calls[0]}"]
    elif ins.opname == "FOR_ITER":
        step = f"__k_r = next({t[-1]}, __k_C)"  # the constants list: never an item
        tail = ["if __k_r is __k_C:", f"    return {calls[1]}", f"return {calls[0]}"]
    else:
        jump_when = _STEP_JUMPS.get(ins.opname, _STEP_JUMP_OR_POP.get(ins.opname))
        step = f"__k_c = {'bool' if jump_when else 'not '}({t[-1]})"
        tail = ["if __k_c:", f"    return {calls[0]}", f"return {calls[1]}"]
    if reraise is None:
        return [step, *tail]
    return [
        "try:",
        f"    {step}",
        "except BaseException as __k_exc:",
        f"    return {reraise}",
        *tail,
    ]


def _reraise_victim(ins, stack: list[Var], base: int) -> int:
    """The stack slot that, replaced by a ``Reraise``, makes the step's own instruction
    raise: the callable, the formatted value, the subscripted container, the condition."""
    if ins.opname == "CALL":
        return base + 1 if isinstance(stack[base], NullVar) else base
    if ins.opname == "CALL_FUNCTION_EX":
        return base + 1
    if ins.opname == "FORMAT_VALUE":
        return base
    if ins.opname in ("BINARY_SUBSCR", "BINARY_OP", "COMPARE_OP", "STORE_SUBSCR"):
        return len(stack) - 2
    return len(stack) - 1


def _reraise_offset(instructions, idx: int) -> int:
    """Where the re-raising continuation enters: the step itself (3.11: its PRECALL,
    which sets up the call)."""
    ins = instructions[idx]
    if ins.opname == "CALL" and idx > 0 and instructions[idx - 1].opname == "PRECALL":
        return instructions[idx - 1].offset
    return ins.offset


def enter_with(mgr: object) -> tuple[object, object]:
    """What BEFORE_WITH does: look ``__enter__`` and ``__exit__`` up on the type (bound
    as descriptors), call ``__enter__``; the bound ``__exit__`` and the result."""
    cls = type(mgr)
    try:
        enter = cls.__enter__
        exit_ = cls.__exit__
    except AttributeError:
        raise TypeError(
            f"'{cls.__qualname__}' object does not support the context manager protocol"
        ) from None
    bind = getattr(type(exit_), "__get__", None)
    bound_exit = bind(exit_, mgr, cls) if bind is not None else exit_
    bind = getattr(type(enter), "__get__", None)
    bound_enter = bind(enter, mgr, cls) if bind is not None else enter
    return bound_exit, bound_enter()


def _resume_code(
    code,
    offset,
    presence,
    params,
    reraise: bool = False,
    raise_at_entry: bool = False,
    call_args: int | None = None,
) -> types.CodeType:
    key = (code, offset, tuple(presence), tuple(params), reraise, raise_at_entry, call_args)
    rc = _RESUME_CODES.get(key)
    if rc is None:
        rc = make_resume_code(code, offset, presence, params, raise_at_entry, call_args)
        _RESUME_CODES[key] = rc
        _RESUME_ORIGIN[rc] = key[:4]
        if call_args is not None:
            _NESTED_CODES.add(rc)
    return rc


def _graph_call(root: RootFrame, compiled, inputs: list[str], extra: dict) -> list[str]:
    """The graph call. In a continuation that starts inside an exception handler's range
    (a with-block above all: its ``__exit__`` came in on the stack), an exception the graph
    raises is raised again inside the frame's code at the continuation's entry, so the
    handler runs (``__exit__`` sees the exception once) before it propagates. The
    handler sees the locals the continuation started with."""
    lines = _graph_lines(compiled, inputs)
    origin = _RESUME_ORIGIN.get(root.code)
    if not lines or origin is None or not in_exception_range(origin[0], origin[1]):
        return lines
    code = origin[0]
    try:
        rcode = _resume_code(*origin, raise_at_entry=True)
    except Unsupported:
        return lines
    EAGER_RESUME_CODES.add(rcode)
    if code.co_freevars or code.co_cellvars:
        extra["__k_rcexc"] = rcode
        fexpr = f"__k_FunctionType(__k_rcexc, __k_G, {rcode.co_name!r}, None, __k_fn.__closure__)"
    else:
        extra["__k_raise_at_entry"] = types.FunctionType(rcode, root.globals, rcode.co_name)
        fexpr = "__k_raise_at_entry"
    args = ", ".join([*root.param_names, "__k_exc"])
    return [
        "try:",
        *(f"    {line}" for line in lines),
        "except BaseException as __k_exc:",
        f"    return {fexpr}({args})",
    ]


def _record_break(ctx, brk: GraphBreak) -> None:
    if brk.kind is breaks.REGION_BOUNDARY:  # a compiled region's edge, not a break
        counters.bump("region_boundaries")
        log("breaks", f"(a region boundary, not a break) {brk}")
        if ctx.recorder is not None:
            ctx.recorder.region_boundaries.append(brk)
        return
    counters.graph_break(
        f"{brk.kind.id} {brk.detail[:200]} @ {brk.filename}:{brk.lineno}".replace("\n", " ")
    )
    log("breaks", str(brk))
    if ctx.recorder is not None:
        ctx.recorder.breaks.append(brk)


__all__ = [
    "EAGER_RESUME_CODES",
    "CacheEntry",
    "SkipFrame",
    "compile_frame",
]
