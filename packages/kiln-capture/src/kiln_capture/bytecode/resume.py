"""Continuation functions: the rest of a frame after a graph break, as a new function.

Design note: "prologue + original body"
---------------------------------------
A continuation's code is the original code with a short prologue in front:
``COPY_FREE_VARS; RESUME; LOAD_FAST <stack values> (PUSH_NULL for NULLs); JUMP_FORWARD
<resume offset>``. Relative jumps inside the original body stay valid because the body
moves as a whole; the exception table is shifted by the prologue's length and the
location table gets "no location" entries for the prologue. The continuation's
parameters are the saved stack values followed by the live locals, so local slots are
renumbered (LOAD_FAST/STORE_FAST/... and the cell/free opargs, which index the same
"localsplus" array on 3.11 and 3.12).
"""

from __future__ import annotations

import dis
import inspect
import types

from kiln_capture import breaks
from kiln_capture.bytecode.rewrite import (
    cache_count,
    emit,
    encode_exception_table,
    line_entries,
    no_location_entries,
    parse_exception_table,
)
from kiln_capture.errors import Unsupported

_LOCAL_OPS = frozenset(
    dis.opmap[n]
    for n in ("LOAD_FAST", "STORE_FAST", "DELETE_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR")
    if n in dis.opmap
)
_FREE_OPS = frozenset(dis.hasfree)
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_LOAD_OPS = frozenset(
    n
    for n in (
        "LOAD_FAST",
        "LOAD_FAST_CHECK",
        "LOAD_FAST_AND_CLEAR",
        "DELETE_FAST",
        "LOAD_CLOSURE",
        "LOAD_DEREF",
    )
    if n in dis.opmap
)


def live_locals(code: types.CodeType, offset: int) -> set[str]:
    """Names possibly read at or after ``offset`` (conservative: loops widen the range)."""
    instrs = list(dis.get_instructions(code))
    start = offset
    for ins in instrs:
        if (
            ins.offset >= offset
            and ins.opcode in dis.hasjrel
            and isinstance(ins.argval, int)
            and ins.argval < start
        ):
            start = ins.argval
    live = {ins.argval for ins in instrs if ins.offset >= start and ins.opname in _LOAD_OPS}
    if "__class__" in code.co_freevars and code.co_argcount:
        live.add(code.co_varnames[0])  # zero-argument super() reads it implicitly
    return live


def keeps_first_slot(code: types.CodeType, params: list[str]) -> bool:
    """Whether a continuation keeps ``code``'s first parameter as its first argument."""
    return bool(params) and code.co_argcount > 0 and params[0] == code.co_varnames[0]


def make_resume_code(
    code: types.CodeType,
    offset: int,
    stack: list[bool],
    params: list[str],
    raise_at_entry: bool = False,
    call_args: int | None = None,
) -> types.CodeType:
    """Code that continues ``code`` at ``offset``.

    ``stack`` lists the saved stack from bottom to top (False for a NULL); the new code
    takes ``__k_s<i>`` for each non-NULL entry, then ``params`` (original local names).
    With ``raise_at_entry`` it takes one more argument, an exception, and raises it as if
    the instruction at ``offset`` had: the handler covering ``offset`` (a with-statement's
    ``__exit__``, an ``except``) sees it. Generated code uses it when a graph that runs
    inside such a block raises. With ``call_args`` (a nested break, capture.py) the saved
    stack ends with a NULL, a callee's continuation and its ``call_args`` arguments: the
    prologue calls it, and the body starts with its result where the frame's CALL left it.
    """
    # the frame's own cells (its cellvars) come in as free variables, cellvars first and
    # then the frame's own free variables: the continuation function's closure holds the
    # very cells the frame's closures share (see "cells" in capture.py)
    cells = list(code.co_cellvars)
    freevars = cells + list(code.co_freevars)
    if set(params) & set(cells):
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "a cell passed as a local")
    if code.co_argcount and code.co_varnames[0] in cells and "__class__" in code.co_freevars:
        # zero-argument super() reads its first argument from the first local slot
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "resuming a method whose self is a cell")
    stack_names = [f"__k_s{i}" for i, present in enumerate(stack) if present]
    others = [n for n in code.co_varnames if n not in params and n not in cells]
    # zero-argument super() reads the first local slot: keep the first parameter there
    lead = list(params[:1]) if keeps_first_slot(code, params) else []
    varnames = lead + stack_names + [p for p in params if p not in lead]
    varnames += ["__k_exc"] if raise_at_entry else []
    varnames += others
    nlocalsplus = len(varnames) + len(freevars)
    if nlocalsplus > 255:
        raise Unsupported(breaks.UNSUPPORTED_VALUE, "too many locals to resume")
    # "localsplus": the locals, then the cells that are not arguments, then the free vars
    old_order = (
        list(code.co_varnames)
        + [c for c in cells if c not in code.co_varnames]
        + list(code.co_freevars)
    )
    new_order = varnames + freevars
    remap = {i: new_order.index(n) for i, n in enumerate(old_order)}

    raw = bytearray(code.co_code)
    i = 0
    while i < len(raw):
        op = raw[i]
        if op in _LOCAL_OPS or op in _FREE_OPS:
            if i >= 2 and raw[i - 2] == _EXTENDED_ARG:
                raise Unsupported(breaks.UNSUPPORTED_VALUE, "extended local index")
            raw[i + 1] = remap[raw[i + 1]]
        elif op == dis.opmap.get("COPY_FREE_VARS"):
            pass
        i += 2 + 2 * cache_count(op)

    prologue = bytearray()
    if freevars:
        prologue += emit("COPY_FREE_VARS", len(freevars))
    prologue += emit("RESUME", 0)
    k = 0
    for present in stack:
        if present:
            prologue += emit("LOAD_FAST", varnames.index(stack_names[k]))
            k += 1
        else:
            prologue += emit("PUSH_NULL")
    if call_args is not None:  # a nested break: the callee's continuation is called first
        if "PRECALL" in dis.opmap:
            prologue += emit("PRECALL", call_args)
        prologue += emit("CALL", call_args)
    raise_entry = []
    raise_span = (len(prologue), len(prologue))
    if raise_at_entry:
        covering = [e for e in parse_exception_table(code) if e[0] <= offset < e[1]]
        if not covering:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "no handler to raise into")
        _s, _e, target, depth, lasti = covering[-1]
        start = len(prologue)
        prologue += emit("LOAD_FAST", varnames.index("__k_exc")) + emit("RAISE_VARARGS", 1)
        raise_entry = [(start, len(prologue), target, depth, lasti)]
        raise_span = (start, len(prologue))
    # JUMP_FORWARD's argument counts code units after the jump; size depends on the arg
    for width in (2, 4, 6):
        target_units = (len(prologue) + width + offset) // 2
        delta = target_units - (len(prologue) + width) // 2
        jump = emit("JUMP_FORWARD", delta)
        if len(jump) == width:
            break
    prologue += jump
    shift = len(prologue)
    table = [(s, e, t + shift, d, lasti) for s, e, t, d, lasti in raise_entry] + [
        (s + shift, e + shift, t + shift, d, lasti)
        for s, e, t, d, lasti in parse_exception_table(code)
    ]
    flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    name = f"__kiln_{'raise' if raise_at_entry else 'resume'}_at_{offset}_{code.co_name}"
    if call_args is not None:
        name = f"__kiln_resume_at_{offset}_{code.co_name}_nested"
    return code.replace(
        co_code=bytes(prologue) + bytes(raw),
        co_varnames=tuple(varnames),
        co_cellvars=(),
        co_freevars=tuple(freevars),
        co_nlocals=len(varnames),
        co_argcount=len(stack_names) + len(params) + int(raise_at_entry),
        co_stacksize=max(code.co_stacksize, len(stack) + 1) + 1,
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_flags=flags,
        co_name=name,
        co_qualname=name,
        co_linetable=_prologue_lines(code, offset, raise_span, shift) + code.co_linetable,
        co_exceptiontable=encode_exception_table(table),
    )


def _prologue_lines(code: types.CodeType, offset: int, raise_span, shift: int) -> bytes:
    """The prologue has no location, except a raise-at-entry: it gets the line of the
    instruction at ``offset`` (tracebacks show it); the units after it move the line
    back to ``co_firstlineno``, where the original table's deltas start."""
    start, end = raise_span
    if start == end:
        return no_location_entries(shift // 2)
    line = next(
        (
            i.positions.lineno
            for i in dis.get_instructions(code)
            if i.offset >= offset and i.positions is not None and i.positions.lineno is not None
        ),
        code.co_firstlineno,
    )
    delta = line - code.co_firstlineno
    return (
        no_location_entries(start // 2)
        + line_entries((end - start) // 2, delta)
        + line_entries((shift - end) // 2, -delta)
    )
