"""Symbolic evaluation of CPython 3.11 and 3.12 bytecode.

Design note: "one interpreter, two bytecodes"
---------------------------------------------
Instructions come from ``dis.get_instructions`` of the running interpreter, so jump
targets, names and constants arrive already decoded for either version; handlers are
keyed by opname and the few that differ (3.11's PRECALL, LOAD_METHOD, JUMP_IF_*_OR_POP
and direction-specific POP_JUMPs; 3.12's RETURN_CONST, LOAD_SUPER_ATTR, BINARY_SLICE,
END_FOR, LOAD_FAST_AND_CLEAR, CALL_INTRINSIC_1 and the method bit of LOAD_ATTR) each get
their own handler. Calls of user functions are inlined by running a child Frame over
the callee's bytecode; values live on the stack as Vars (see variables/).

Exceptions the captured code raises and handles run through the code's exception table
as in CPython (see variables/exceptions.py, "exceptions as control flow").

A step the evaluator cannot model raises Unsupported. The root frame turns it into a
graph break at its own current instruction (see capture.py); the innermost source line
is recorded for the report.
"""

from __future__ import annotations

import dis
import inspect
import linecache
import operator
import sys
import types

import torch

from kiln_capture import breaks
from kiln_capture.bytecode.rewrite import parse_exception_table
from kiln_capture.errors import Raised, Unsupported
from kiln_capture.output import OutputGraph
from kiln_capture.sources import AttrSource, GlobalSource, ItemSource
from kiln_capture.variables.base import NULL, CellObjectVar, CellVar, NullVar, Var
from kiln_capture.variables.builtins import (
    BINARY_OPS,
    COMPARE_OPS,
    binary,
    contains_value,
    identical,
    unary,
)
from kiln_capture.variables.constants import ConstVar
from kiln_capture.variables.containers import (
    CounterVar,
    DequeVar,
    DictVar,
    ListVar,
    SetVar,
    SliceVar,
    TupleVar,
    key_of,
    known_index,
    make_set,
)
from kiln_capture.variables.contexts import ContextVar
from kiln_capture.variables.exceptions import (
    ExcVar,
    RaisingVar,
    Reraise,
    as_exception,
    attribute_error,
    exception_matches,
    raised,
    stop_iteration_error,
    wrap_reraise,
)
from kiln_capture.variables.functions import NestedFunctionVar
from kiln_capture.variables.generators import GeneratorVar, Yield
from kiln_capture.variables.iterators import (
    IteratorVar,
    iterate,
)
from kiln_capture.variables.modules import ModuleVar
from kiln_capture.variables.objects import SuperVar
from kiln_capture.variables.sizes import SymIntVar

PY312 = sys.version_info >= (3, 12)
MAX_INLINE_DEPTH = 40
_UNSUPPORTED_CODE_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class _Unbound(Var):
    """What LOAD_FAST_AND_CLEAR pushes for a local that was not bound."""


UNBOUND = _Unbound()


class NestedStop(BaseException):
    """Raised where a nested break stops the trace: at ``frame``'s instruction (a frame
    the root frame called), before it runs (capture.py, "nested breaks")."""

    def __init__(self, frame) -> None:
        self.frame = frame


class Return(Exception):
    def __init__(self, value: Var) -> None:
        self.value = value


class LazyCell(CellVar):
    """A cell of a real closure; its contents are wrapped (and guarded) on first read."""

    def __init__(self, loader) -> None:
        super().__init__(None)
        self.loader = loader
        self.external = True

    def get(self) -> Var:
        if self.contents is None:
            self.contents = self.loader()
        return self.contents


def cell_get(cell: CellVar) -> Var:
    if isinstance(cell, LazyCell):
        return cell.get()
    if cell.contents is None:
        raise Unsupported(breaks.EXCEPTION, "free variable referenced before assignment")
    return cell.contents


# code object id -> (the code, its instructions, the index of each offset); the code is
# held so that its id is not reused while the entry lives
_DECODED: dict[int, tuple[types.CodeType, tuple[dis.Instruction, ...], dict[int, int]]] = {}


# (code, line, function name) -> that frame's part of a node's stack trace
_TRACE_LINES: dict[tuple[types.CodeType, int, str], str] = {}


def decoded(code: types.CodeType) -> tuple[tuple[dis.Instruction, ...], dict[int, int]]:
    """``code``'s instructions and the index of each offset, decoded once per code object
    (read-only: frames share them). Every inlined call decoded its function again: the
    24 layers of a transformer decode the same few forwards hundreds of times: over a
    third of capturing HF GPT-2's CPU time."""
    hit = _DECODED.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1], hit[2]
    instructions = tuple(dis.get_instructions(code))
    index_of = {ins.offset: i for i, ins in enumerate(instructions)}
    if len(_DECODED) >= 4096:  # bounded: code objects of long-gone functions go too
        _DECODED.clear()
    _DECODED[id(code)] = (code, instructions, index_of)
    return instructions, index_of


class Frame:
    # set on a root frame: (offset of its CALL, callee code, callee offset) where a nested
    # break stops the trace (capture.py, "nested breaks")
    nested_stop: tuple | None = None
    calling: Var | None = None  # what a root frame's latest call called

    def __init__(
        self,
        out: OutputGraph,
        code: types.CodeType,
        globals_dict: dict,
        local_vars: dict[str, Var],
        cells: dict[str, CellVar],
        name: str,
        parent: Frame | None = None,
    ) -> None:
        if code.co_flags & _UNSUPPORTED_CODE_FLAGS:
            raise Unsupported(breaks.UNSUPPORTED_BYTECODE, f"coroutine {name}")
        self.out = out
        self.code = code
        out.traced_code.add((code.co_filename, code.co_name))
        self.globals = globals_dict
        self.locals: dict[str, Var] = dict(local_vars)
        self.cells: dict[str, CellVar] = dict(cells)
        self.name = name
        self.parent = parent
        self.depth = parent.depth + 1 if parent else 0
        self.instructions, self.index_of = decoded(code)
        self.stack: list[Var] = []
        self.ip = 0
        self.kw_names: tuple[str, ...] = ()
        self.contexts: list[ContextVar] = []
        # (offset, exit, manager type, line) of each BEFORE_WITH on a context manager the
        # trace does not model: a graph break inside its block moves to that instruction
        self.generic_withs: list[tuple[int, Var, type, tuple[str, int, str]]] = []
        self.current: dis.Instruction | None = None
        self.lineno = code.co_firstlineno
        # the exception being handled (sys.exc_info()), shared by the trace's frames
        self.exc_state: list[Var] = parent.exc_state if parent else [ConstVar(None)]
        self._exc_table: list | None = None

    # -- running -------------------------------------------------------------------------

    def run(self) -> Var:
        try:
            while True:
                self.step()
        except Return as r:
            return r.value

    # -- generators (see variables/generators.py, "suspended frames") ---------------------

    def RETURN_GENERATOR(self, ins):
        self.push(ConstVar(None))

    def YIELD_VALUE(self, ins):
        if not self.code.co_flags & inspect.CO_GENERATOR:
            raise Unsupported(breaks.UNSUPPORTED_BYTECODE, "yield outside a generator")
        raise Yield(self.pop())  # GeneratorVar.send pushes the sent value on resuming

    def GET_YIELD_FROM_ITER(self, ins):
        self.stack[-1] = iterate(self, self.stack[-1])

    def SEND(self, ins):
        value = self.pop()
        receiver = self.stack[-1]
        if isinstance(receiver, GeneratorVar):
            item = receiver.send(value)
            result = receiver.result
        elif isinstance(receiver, IteratorVar) and value.is_const() and value.as_const() is None:
            item, result = receiver.next(), ConstVar(None)
        else:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"yield from {receiver!r}")
        if item is not None:
            self.push(item)
            return
        if PY312:  # (receiver, value -- receiver, retval); END_SEND drops the receiver
            self.push(result)
        else:
            self.stack[-1] = result
        self.jump(ins)

    def END_SEND(self, ins):
        value = self.pop()
        self.stack[-1] = value

    def step(self) -> None:
        ins = self.instructions[self.ip]
        if self.depth == 1 and self.parent.nested_stop is not None:
            stop = self.parent.nested_stop
            if stop == (self.parent.current.offset, self.code, ins.offset):
                raise NestedStop(self)
        self.current = ins
        self.out.frame = self
        if ins.positions is not None and ins.positions.lineno is not None:
            self.lineno = ins.positions.lineno
        self.ip += 1
        handler = getattr(self, ins.opname, None)
        try:
            if handler is None:
                raise Unsupported(breaks.UNSUPPORTED_BYTECODE, f"bytecode {ins.opname}")
            handler(ins)
        except Raised as e:
            if self.unwind(ins.offset, e.exc):
                return
            if e.where is None:
                e.where = self.location()
            e.chain.append(f"{self.name} ({self.code.co_filename}:{self.lineno})")
            raise
        except Unsupported as e:
            if e.where is None:
                e.where = self.location()
            e.chain.append(f"{self.name} ({self.code.co_filename}:{self.lineno})")
            if not hasattr(e, "frames"):
                e.frames = []
            e.frames.append((self.code, ins.offset))
            raise
        except (Return, KeyboardInterrupt, NestedStop):
            raise
        except RecursionError as e:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "recursion too deep while capturing") from e

    def unwind(self, offset: int, exc: Var) -> bool:
        """Hand ``exc``, raised at ``offset``, to the handler covering it, as CPython
        does: the stack cut to the handler's depth, the offset (where the handler re-raises
        with it) and the exception pushed. False where no handler covers ``offset``."""
        if self._exc_table is None:
            self._exc_table = parse_exception_table(self.code)
        for start, end, target, depth, lasti in self._exc_table:
            if start <= offset < end:
                del self.stack[depth:]
                if lasti:
                    self.push(ConstVar(offset))
                self.push(exc)
                self.ip = self.index_of[target]
                self.kw_names = ()
                return True
        return False

    def stack_trace(self) -> str:
        """The user's call stack at this instruction, innermost last, in traceback form
        (an FX node's ``meta["stack_trace"]``, which compilers quote in their errors)."""
        frames = []
        f: Frame | None = self
        while f is not None:
            key = (f.code, f.lineno, f.name)
            entry = _TRACE_LINES.get(key)
            if entry is None:  # each line read and formatted once (a node per op)
                if len(_TRACE_LINES) >= 65536:
                    _TRACE_LINES.clear()
                line = linecache.getline(f.code.co_filename, f.lineno).strip()
                entry = _TRACE_LINES[key] = (
                    f'  File "{f.code.co_filename}", line {f.lineno}, in {f.name}\n    {line}\n'
                )
            frames.append(entry)
            f = f.parent
        return "".join(reversed(frames))

    def location(self) -> tuple[str, int, str]:
        line = linecache.getline(self.code.co_filename, self.lineno)
        return (self.code.co_filename, self.lineno, line)

    def jump(self, ins: dis.Instruction) -> None:
        self.ip = self.index_of[ins.argval]

    def push(self, v: Var) -> None:
        self.stack.append(v)

    def pop(self) -> Var:
        return self.stack.pop()

    def popn(self, n: int) -> list[Var]:
        if n == 0:
            return []
        out = self.stack[-n:]
        del self.stack[-n:]
        return out

    def inline(self, code, globals_dict, bound, cells, name) -> Var:
        if self.depth >= MAX_INLINE_DEPTH:
            raise Unsupported(
                breaks.UNSUPPORTED_VALUE, f"inlining deeper than {MAX_INLINE_DEPTH} calls"
            )
        frame = Frame(self.out, code, globals_dict, bound, cells, name, parent=self)
        if code.co_flags & inspect.CO_GENERATOR:
            return GeneratorVar(frame)  # none of its body runs until it is iterated
        try:
            return frame.run()
        finally:
            self.out.frame = self

    def zero_arg_super(self):
        cls = cell_get(self.cells["__class__"]).as_const()
        first = self.code.co_varnames[0]
        obj = self.locals.get(first)
        if obj is None and first in self.cells:
            obj = cell_get(self.cells[first])
        return cls, obj

    # -- loads and stores ----------------------------------------------------------------

    def NOP(self, ins):
        pass

    RESUME = PRECALL = CACHE = EXTENDED_ARG = NOP

    def POP_TOP(self, ins):
        self.pop()

    def PUSH_NULL(self, ins):
        self.push(NULL)

    def COPY(self, ins):
        self.push(self.stack[-ins.arg])

    def SWAP(self, ins):
        i = ins.arg
        self.stack[-1], self.stack[-i] = self.stack[-i], self.stack[-1]

    def LOAD_CONST(self, ins):
        self.push(ConstVar(ins.argval))

    def RETURN_CONST(self, ins):
        raise Return(ConstVar(ins.argval))

    def RETURN_VALUE(self, ins):
        raise Return(self.pop())

    def LOAD_FAST(self, ins):
        v = self.locals.get(ins.argval)
        if v is None:
            raise Unsupported(breaks.EXCEPTION, f"UnboundLocalError: {ins.argval}")
        self.push(v)

    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_AND_CLEAR(self, ins):
        self.push(self.locals.pop(ins.argval, UNBOUND))

    def STORE_FAST(self, ins):
        v = self.pop()
        if v is UNBOUND:
            self.locals.pop(ins.argval, None)
        else:
            self.locals[ins.argval] = v

    def DELETE_FAST(self, ins):
        self.locals.pop(ins.argval, None)

    def MAKE_CELL(self, ins):
        self.cells[ins.argval] = CellVar(self.locals.pop(ins.argval, None))

    def COPY_FREE_VARS(self, ins):
        pass

    def LOAD_CLOSURE(self, ins):
        self.push(self.cells[ins.argval])

    def LOAD_DEREF(self, ins):
        self.push(cell_get(self.cells[ins.argval]))

    def STORE_DEREF(self, ins):
        cell = self.cells[ins.argval]
        if getattr(cell, "external", False):
            target = getattr(cell, "cell_object", None)
            if target is None:
                raise Unsupported(
                    breaks.UNSUPPORTED_VALUE, f"nonlocal write to {ins.argval} of an outer closure"
                )
            # a cell of the frame's function (a continuation's own cells come in this
            # way): the trace reads the new value, the write is replayed after the graph
            value = self.pop()
            cell.contents = value
            self.out.side_effects.store_attr(target, "cell_contents", value)
            return
        cell.contents = self.pop()

    def LOAD_GLOBAL(self, ins):
        name = ins.argval
        if ins.arg & 1:
            self.push(NULL)
        self.push(self.load_global(name))

    def load_global(self, name: str) -> Var:
        if self.globals is self.out.globals:
            pending = self.out.side_effects.global_stores.get(name)
            if pending is not None:
                for r in self.out.recorders:  # a replay would read the real global
                    r.fail(f"reads global {name}, which the trace set")
                return pending
        if name in self.globals:
            if self.globals is self.out.globals:
                return self.out.wrap(self.globals[name], GlobalSource(name))
            return self.out.wrap(
                self.globals[name], ItemSource(self.out.const_ref(self.globals), name)
            )
        builtins_dict = self.globals.get("__builtins__", __builtins__)
        if isinstance(builtins_dict, types.ModuleType):
            builtins_dict = builtins_dict.__dict__
        if name not in builtins_dict:
            # eager raises NameError here (an ``except NameError`` may catch it): guarded
            # to stay undefined in the module (a builtin is not removed in practice)
            where = (
                "__k_G"
                if self.globals is self.out.globals
                else self.out.const_ref(self.globals).expr()
            )
            self.out.guards.add(f"{name!r} not in {where}", f"global {name} is not defined")
            from kiln_capture.variables.exceptions import raised

            raise raised(NameError, f"name {name!r} is not defined")
        return self.out.wrap_value(builtins_dict[name])

    def STORE_GLOBAL(self, ins):
        if self.globals is not self.out.globals:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "global store into another module")
        self.out.side_effects.store_global(ins.argval, self.pop())

    def LOAD_ATTR(self, ins):
        obj = self.pop()
        method = PY312 and bool(ins.arg & 1)
        attr = self.getattr(obj, ins.argval)
        if method:
            self.push(NULL)
        self.push(attr)

    def LOAD_METHOD(self, ins):
        obj = self.pop()
        attr = self.getattr(obj, ins.argval)
        self.push(NULL)
        self.push(attr)

    def getattr(self, obj: Var, name: str) -> Var:
        try:
            return obj.getattr(self, name)
        except AttributeError as e:
            raise attribute_error(obj, name) from e

    def LOAD_SUPER_ATTR(self, ins):
        global_super, cls, obj = self.popn(3)
        sup = SuperVar(cls.as_const(), obj) if ins.arg & 2 or True else None
        attr = self.getattr(sup, ins.argval)
        if ins.arg & 1:
            self.push(NULL)
        self.push(attr)

    def STORE_ATTR(self, ins):
        obj = self.pop()
        value = self.pop()
        obj.setattr(self, ins.argval, value)

    def DELETE_ATTR(self, ins):
        obj = self.pop()
        method = getattr(obj, "delattr", None)
        if method is None:
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"del {obj!r}.{ins.argval}")
        method(self, ins.argval)

    def IMPORT_NAME(self, ins):
        level, fromlist = self.popn(2)
        module = __import__(ins.argval, self.globals, None, fromlist.as_const(), level.as_const())
        self.push(self.out.wrap_value(module))

    def IMPORT_FROM(self, ins):
        self.push(self.getattr(self.stack[-1], ins.argval))

    # -- subscripts, slices, operators ---------------------------------------------------

    def BINARY_SUBSCR(self, ins):
        key = self.pop()
        container = self.pop()
        if container.is_const() and isinstance(container.as_const(), tuple | str | range):
            index = known_index(key)  # a sequence reads a tensor key through __index__
            if index is not None:
                key = ConstVar(index)
        self.push(container.getitem(self, key))

    def STORE_SUBSCR(self, ins):
        key = self.pop()
        container = self.pop()
        value = self.pop()
        container.setitem(self, key, value)

    def DELETE_SUBSCR(self, ins):
        key = self.pop()
        container = self.pop()
        if (
            isinstance(container, ListVar) and key.is_const() and isinstance(key.as_const(), slice)
        ):  # del lst[i:j]
            del container.items[key.as_const()]
            self.out.side_effects.mutated(container)
            return
        if isinstance(container, CounterVar | DequeVar):  # their own __delitem__
            container.call_method(self, "__delitem__", [key], {})
            return
        if isinstance(container, DictVar | ListVar):
            container.call_method(self, "pop", [key], {})
            return
        raise Unsupported(breaks.UNSUPPORTED_VALUE, f"del {container!r}[...]")

    def BUILD_SLICE(self, ins):
        parts = self.popn(ins.arg)
        if len(parts) == 2:
            parts.append(ConstVar(None))
        self.push(SliceVar(*parts))

    def BINARY_SLICE(self, ins):
        start, stop = self.popn(2)
        container = self.pop()
        self.push(container.getitem(self, SliceVar(start, stop, ConstVar(None))))

    def STORE_SLICE(self, ins):
        start, stop = self.popn(2)
        container = self.pop()
        value = self.pop()
        container.setitem(self, SliceVar(start, stop, ConstVar(None)), value)

    def BINARY_OP(self, ins):
        b = self.pop()
        a = self.pop()
        self.push(binary(self, BINARY_OPS[ins.argrepr], a, b))

    def COMPARE_OP(self, ins):
        b = self.pop()
        a = self.pop()
        op = dis.cmp_op[ins.arg >> 4] if PY312 else dis.cmp_op[ins.arg]
        self.push(binary(self, COMPARE_OPS[op], a, b))

    def IS_OP(self, ins):
        b = self.pop()
        a = self.pop()
        self.push(ConstVar(identical(self, a, b) != bool(ins.arg)))

    def CONTAINS_OP(self, ins):
        b = self.pop()
        a = self.pop()
        self.push(contains_value(self, a, b, negate=bool(ins.arg)))

    def UNARY_NEGATIVE(self, ins):
        self.push(unary(self, operator.neg, self.pop()))

    def UNARY_POSITIVE(self, ins):
        self.push(unary(self, operator.pos, self.pop()))

    def UNARY_INVERT(self, ins):
        self.push(unary(self, operator.invert, self.pop()))

    def UNARY_NOT(self, ins):
        self.push(ConstVar(not self.pop().truth(self)))

    def CALL_INTRINSIC_1(self, ins):
        if ins.arg == 5:  # INTRINSIC_UNARY_POSITIVE
            self.UNARY_POSITIVE(ins)
        elif ins.arg == 6:  # INTRINSIC_LIST_TO_TUPLE
            self.push(TupleVar(self.pop().unpack(self)))
        elif ins.arg == 3:  # INTRINSIC_STOPITERATION_ERROR: 3.12 generators' own handler
            self.push(stop_iteration_error(self.pop()))
        else:
            raise Unsupported(breaks.UNSUPPORTED_BYTECODE, f"CALL_INTRINSIC_1 {ins.argrepr}")

    # -- building and unpacking ----------------------------------------------------------

    def BUILD_TUPLE(self, ins):
        self.push(TupleVar(self.popn(ins.arg)))

    def BUILD_LIST(self, ins):
        self.push(ListVar(self.popn(ins.arg)))

    def BUILD_SET(self, ins):
        self.push(make_set(self, self.popn(ins.arg)))

    def BUILD_MAP(self, ins):
        flat = self.popn(2 * ins.arg)
        self.push(DictVar({key_of(self, flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}))

    def BUILD_CONST_KEY_MAP(self, ins):
        keys = self.pop().as_const()
        values = self.popn(ins.arg)
        self.push(DictVar(dict(zip(keys, values))))

    def BUILD_STRING(self, ins):
        parts = self.popn(ins.arg)
        self.push(ConstVar("".join(p.as_const() for p in parts)))

    def FORMAT_VALUE(self, ins):
        spec = self.pop().as_const() if ins.arg & 4 else ""
        v = self.pop()
        if isinstance(v, SymIntVar):  # a size formatted into a string: specialized
            v = ConstVar(v.as_const())
        if not v.is_const():
            raise Unsupported(
                breaks.TENSOR_TO_PYTHON
                if type(v).__name__ == "TensorVar"
                else breaks.UNSUPPORTED_VALUE,
                f"formatting {v!r} into a string",
            )
        value = v.as_const()
        conv = ins.arg & 3
        value = {0: value, 1: str(value), 2: repr(value), 3: ascii(value)}[conv]
        self.push(ConstVar(format(value, spec)))

    # A comprehension's container is made in the trace, except where a break inside a 3.12
    # comprehension (inlined, PEP 709) handed it to a continuation: a real list read from
    # the stack, whose writes are side effects replayed after the graph (they were lost)

    def LIST_APPEND(self, ins):
        v = self.pop()
        self.stack[-ins.arg].items.append(v)
        self.out.side_effects.mutated(self.stack[-ins.arg])

    def SET_ADD(self, ins):
        v = self.pop()
        self.stack[-ins.arg].add(self, v)
        self.out.side_effects.mutated(self.stack[-ins.arg])

    def MAP_ADD(self, ins):
        value = self.pop()
        key = self.pop()
        self.stack[-ins.arg].items[key_of(self, key)] = value
        self.out.side_effects.mutated(self.stack[-ins.arg])

    def LIST_EXTEND(self, ins):
        v = self.pop()
        self.stack[-ins.arg].items.extend(v.unpack(self))
        self.out.side_effects.mutated(self.stack[-ins.arg])

    def SET_UPDATE(self, ins):
        v = self.pop()
        target = self.stack[-ins.arg]
        if (
            isinstance(target, SetVar)
            and v.is_const()
            and isinstance(v.as_const(), set | frozenset)
        ):  # a display's constant frozenset: merged as CPython merges it, in its slot order
            target.values.update(v.as_const())
            return
        for x in v.unpack(self):
            target.add(self, x)

    def DICT_UPDATE(self, ins):
        v = self.pop()
        target = self.stack[-ins.arg]
        if isinstance(v, DictVar):
            target.items.update(v.items)
        else:
            for k in v.unpack(self):
                target.items[key_of(self, k)] = v.getitem(self, k)

    DICT_MERGE = DICT_UPDATE

    def LIST_TO_TUPLE(self, ins):
        self.push(TupleVar(self.pop().unpack(self)))

    def UNPACK_SEQUENCE(self, ins):
        items = self.pop().unpack(self)
        if len(items) != ins.arg:
            raise Unsupported(
                breaks.EXCEPTION,
                f"ValueError: expected {ins.arg} values to unpack, got {len(items)}",
            )
        self.stack.extend(reversed(items))

    def UNPACK_EX(self, ins):
        before, after = ins.arg & 0xFF, ins.arg >> 8
        items = self.pop().unpack(self)
        if len(items) < before + after:
            raise Unsupported(breaks.EXCEPTION, "ValueError: not enough values to unpack")
        middle = ListVar(items[before : len(items) - after])
        out = items[:before] + [middle] + items[len(items) - after :]
        self.stack.extend(reversed(out))

    # -- calls and functions -------------------------------------------------------------

    def KW_NAMES(self, ins):
        self.kw_names = self.code.co_consts[ins.arg]

    def CALL(self, ins):
        argc = ins.arg
        args = self.popn(argc)
        second = self.pop()
        first = self.pop()
        if isinstance(first, NullVar):
            fn = second
        else:
            fn = first
            args = [second, *args]
        kwargs = {}
        if self.kw_names:
            n = len(self.kw_names)
            kwargs = dict(zip(self.kw_names, args[-n:]))
            args = args[:-n]
            self.kw_names = ()
        self.push(self.call(fn, args, kwargs))

    def call(self, fn: Var, args: list[Var], kwargs: dict[str, Var]) -> Var:
        inner = self._compiled_inside(fn)
        if self.depth == 0:
            self.calling = inner or fn  # a nested break's callee (capture.py)
        return (inner or fn).call(self, args, kwargs)

    def _compiled_inside(self, fn: Var) -> Var | None:
        """A compiled function or module called inside captured code (``kiln.compile``'d
        block in a compiled model, a compiled helper): the code it wraps is traced into this
        graph, as torch.compile does, instead of breaking at the wrapper's own machinery.
        The wrapper names what it wraps with ``__kiln_inline__``: the attribute holding it
        (on a module's class, or on a function object)."""
        value = fn.value if isinstance(fn, ModuleVar) else getattr(fn, "fn", None)
        if value is None:
            return None
        holder = type(value) if isinstance(value, torch.nn.Module) else value
        name = getattr(holder, "__kiln_inline__", None)
        if not isinstance(name, str):
            return None
        target = getattr(value, name)
        if fn.source is None:
            return self.out.wrap_value(target)
        return self.out.wrap(target, AttrSource(fn.source, name))

    def CALL_FUNCTION_EX(self, ins):
        kwargs = self.pop() if ins.arg & 1 else DictVar({})
        args = self.pop()
        fn = self.pop()
        null = self.pop()
        if not isinstance(null, NullVar):  # 3.11/3.12 both keep a NULL below the callable
            self.push(null)
        if not isinstance(kwargs, DictVar):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, "**kwargs from a non-dict")
        self.push(self.call(fn, args.unpack(self), {k: v for k, v in kwargs.items.items()}))

    def MAKE_FUNCTION(self, ins):
        code = self.pop().as_const()
        closure = self.pop().unpack(self) if ins.arg & 0x08 else []
        annotations = self.pop() if ins.arg & 0x04 else None
        kwdefaults = self.pop().items if ins.arg & 0x02 else {}
        defaults = self.pop().unpack(self) if ins.arg & 0x01 else []
        fn = NestedFunctionVar(code, self.globals, defaults, kwdefaults, closure, code.co_qualname)
        fn.annotations = annotations
        self.push(fn)

    # -- control flow --------------------------------------------------------------------

    def JUMP_FORWARD(self, ins):
        self.jump(ins)

    JUMP_BACKWARD = JUMP_BACKWARD_NO_INTERRUPT = JUMP = JUMP_NO_INTERRUPT = JUMP_FORWARD

    def _pop_jump(self, ins, when: bool):
        v = self.pop()
        if v.truth(self) is when:
            self.jump(ins)

    def POP_JUMP_IF_TRUE(self, ins):
        self._pop_jump(ins, True)

    def POP_JUMP_IF_FALSE(self, ins):
        self._pop_jump(ins, False)

    POP_JUMP_FORWARD_IF_TRUE = POP_JUMP_BACKWARD_IF_TRUE = POP_JUMP_IF_TRUE
    POP_JUMP_FORWARD_IF_FALSE = POP_JUMP_BACKWARD_IF_FALSE = POP_JUMP_IF_FALSE

    def _is_none(self, v: Var) -> bool:
        return v.is_const() and v.as_const() is None

    def POP_JUMP_IF_NONE(self, ins):
        if self._is_none(self.pop()):
            self.jump(ins)

    def POP_JUMP_IF_NOT_NONE(self, ins):
        if not self._is_none(self.pop()):
            self.jump(ins)

    POP_JUMP_FORWARD_IF_NONE = POP_JUMP_BACKWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_FORWARD_IF_NOT_NONE = POP_JUMP_BACKWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE

    def JUMP_IF_TRUE_OR_POP(self, ins):
        if self.stack[-1].truth(self):
            self.jump(ins)
        else:
            self.pop()

    def JUMP_IF_FALSE_OR_POP(self, ins):
        if not self.stack[-1].truth(self):
            self.jump(ins)
        else:
            self.pop()

    def GET_ITER(self, ins):
        self.push(iterate(self, self.pop()))

    def FOR_ITER(self, ins):
        it = self.stack[-1]
        if isinstance(it, RaisingVar):  # a re-raising continuation's first step
            raise it.raised()
        if not isinstance(it, IteratorVar):
            raise Unsupported(breaks.UNSUPPORTED_VALUE, f"iteration over {it!r}")
        v = it.next()
        if v is not None:
            self.push(v)
            return
        self.pop()
        self.jump(ins)
        if self.instructions[self.ip].opname == "END_FOR":
            self.ip += 1

    def END_FOR(self, ins):
        self.popn(2)

    def BEFORE_WITH(self, ins):
        ctx = self.pop()
        if isinstance(ctx, ContextVar):
            self.push(ctx.getattr(self, "__exit__"))
            self.push(ctx.enter(self))
            return
        exit_fn = self.getattr(ctx, "__exit__")
        try:
            cls = ctx.python_type()
        except Unsupported:
            cls = object
        self.generic_withs.append((ins.offset, exit_fn, cls, self.location()))
        entered = self.getattr(ctx, "__enter__").call(self, [], {})
        self.push(exit_fn)
        self.push(entered)

    # -- exceptions (variables/exceptions.py) ---------------------------------------------

    def RAISE_VARARGS(self, ins):
        cause = self.pop() if ins.arg == 2 else None
        if ins.arg == 0:  # a bare `raise`: the exception being handled
            exc = self.exc_state[0]
            if not isinstance(exc, ExcVar):
                raise raised(RuntimeError, "No active exception to reraise")
            raise Raised(exc, exc.message())
        exc = as_exception(self, self.pop())
        if cause is not None:
            if not (cause.is_const() and cause.as_const() is None):
                cause = as_exception(self, cause)
            exc.attrs["__cause__"] = cause
            exc.attrs["__suppress_context__"] = ConstVar(True)
        self.raise_exc(exc)

    def raise_exc(self, exc: ExcVar):
        context = self.exc_state[0]
        if isinstance(context, ExcVar) and context is not exc:
            exc.attrs.setdefault("__context__", context)
        raise Raised(exc, exc.message())

    def LOAD_ASSERTION_ERROR(self, ins):
        self.push(self.out.wrap_value(AssertionError))

    def PUSH_EXC_INFO(self, ins):
        exc = self.pop()
        self.push(self.exc_state[0])
        self.exc_state[0] = exc
        self.push(exc)

    def POP_EXCEPT(self, ins):
        self.exc_state[0] = self.pop()

    def CHECK_EXC_MATCH(self, ins):
        classes = self.pop()
        self.push(ConstVar(exception_matches(self, self.stack[-1], classes)))

    def RERAISE(self, ins):
        exc = self.pop()
        if not isinstance(exc, ExcVar):
            raise Unsupported(breaks.EXCEPTION, f"re-raising {exc!r}")
        raise Raised(exc, exc.message())

    def WITH_EXCEPT_START(self, ins):
        # (exit, lasti, previous exception, exception): exit(type, exception, traceback)
        exit_fn, exc = self.stack[-4], self.stack[-1]
        kind = self.out.wrap_value(exc.python_type())
        self.push(self.call(exit_fn, [kind, exc, ConstVar(None)], {}))


class RootFrame(Frame):
    """The frame the hook handed over: arguments are wrapped from their local sources."""

    def __init__(
        self,
        out: OutputGraph,
        code: types.CodeType,
        func,
        args: tuple,
        break_at: set[int],
        sizes: frozenset[str] = frozenset(),
    ) -> None:
        """``sizes``: names of arguments that held symbolic sizes where the frame this
        continuation resumes broke; they are wrapped last, as symbolic ints, so that one
        equal to a tensor argument's symbolic size shares its symbol."""
        from kiln_capture.sources import CellSource, ClosureSource, LocalSource

        names = code.co_varnames[: len(args)]
        # a continuation's functions were rebuilt by the generated code (new objects on
        # each call): guarded by what they are made of, not by identity
        rebuilt = code.co_name.startswith(("__kiln_resume_at_", "__kiln_raise_at_"))
        local_vars = {
            n: wrap_reraise(out, a, LocalSource(n))
            if type(a) is Reraise
            else out.wrap_rebuilt_function(a, LocalSource(n))
            if rebuilt and type(a) is types.FunctionType
            else out.wrap(a, LocalSource(n))
            for n, a in zip(names, args)
            if n not in sizes
        }
        for n, a in zip(names, args):
            if n in sizes:
                local_vars[n] = out.wrap_size(a, LocalSource(n))
        local_vars = {n: local_vars[n] for n in names}
        cells: dict[str, CellVar] = {}
        closure = getattr(func, "__closure__", None) or ()
        for i, name in enumerate(code.co_freevars):
            cell = closure[i]

            def loader(cell=cell, i=i):
                try:
                    contents = cell.cell_contents
                except ValueError:
                    raise Unsupported(
                        breaks.EXCEPTION, "free variable referenced before assignment"
                    ) from None
                return out.wrap(contents, ClosureSource(None, i))

            def make(loader=loader, i=i) -> LazyCell:
                made = LazyCell(loader)
                made.cell_object = CellObjectVar(CellSource(None, i))
                return made

            cells[name] = out.real_cell(cell, make)
        super().__init__(out, code, func.__globals__, local_vars, cells, code.co_qualname)
        self.break_at = break_at
        self.param_names = list(names)
        self.func, self.args = func, args  # the live values (call_reuse.py reads through them)
        out.root_frame = self


__all__ = ["UNBOUND", "Frame", "Return", "RootFrame"]
