"""Guards: every assumption a trace made, compiled into one generated function.

A guard is a boolean Python expression over the frame's arguments (see sources.py).
All guards of one cache entry become a single generated function
``__guard(__k_fn, <args>)`` so that a cache hit costs one Python call.

Design note: "lean guard functions"
-----------------------------------
A model's guards re-read the same objects many times (``m._modules['h']._modules['0']``
appears in every guard on layer 0), so the generated function is straight-line code:
one ``if not (<guard>): return False`` per guard, in the order they were recorded, and
every read chain (attribute, constant subscript, ``getattr`` with a constant name, a
read-only call) used by more than one guard is computed once into a local just before
the first guard that needs it (``hoist_reads``; the chains are found in each
expression's text by read_chains.py, parsed by ``ast`` only where that scanner gives
up). Hoisting only moves a pure read to where an earlier guard would have evaluated it
anyway, except inside a short-circuit operand; a read that raises there fails the guard
(the hook treats an exception as a miss), so the worst case is a recompile, never a
wrong hit. The per-tensor checks
(dtype, device, sizes, strides, requires_grad, dispatch keys) run in one native call
over all tensors of the entry (``kiln_capture._tensor_guards``).

Design note: "native attribute guards"
--------------------------------------
Most guards of a model read one attribute of a module or config (or an item of a
module's globals, or a closure cell of a decorated function) and compare it with what
capture saw: a literal (``eps``, ``stride``, ``training``), a type, an identity, an
empty hook table. A ResNet-50 has ~2,500 of them; as Python lines they cost ~1 ms a
call. Each such guard also records (read, key, mode, value); ``compile`` gathers them by
the object they read and emits one ``check_attrs(obj, keys, reads, modes, values)`` call
per object (``csrc/attr_guards.cpp``) where the first of them stood. The native check
reads each value as the Python expression does (an attribute through the generic lookup,
then ``__getattr__``; an item with ``obj[key]``; a closure cell) and compares as
strictly: literals by type and value (tuples element by element, so ``1``, ``1.0`` and
``True`` differ), types and identities by identity. A guard moved earlier reads an
object that an earlier guard already read, so the design note above still holds. The
Python expression of each guard stays for ``first_failure`` and for builds without
``check_attrs``.
"""

from __future__ import annotations

import ast
import re
import types
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from kiln_capture import _C, code_cache, read_chains
from kiln_capture.gc_pause import paused
from kiln_capture.shape_guards import ShapeGuards
from kiln_capture.sources import AttrSource, ClosureSource, ItemSource, Source

CHECK_ATTRS = getattr(_C, "check_attrs", None)  # None: a build from before it existed

try:
    from kiln_capture import _tensor_guards
except ImportError:  # built without libtorch: tensors are checked in Python
    _tensor_guards = None
# built against another torch than the one running (its TensorImpl layout may differ):
# checked in Python too, until kiln-capture is rebuilt
TensorGuards = (
    _tensor_guards.TensorGuards
    if _tensor_guards is not None and _tensor_guards.built_for_torch == torch.__version__
    else None
)
ShapeBinder = getattr(_tensor_guards, "ShapeBinder", None) if TensorGuards else None

CONST_TYPES = (int, float, bool, str, bytes, type(None), complex)
# a constant's reference in a guard's text, as ``GuardSet.const`` writes it
CONST_REF = re.compile(r"__k_C\[(\d+)\]")


@dataclass(frozen=True)
class Guard:
    code: str  # boolean expression
    what: str  # readable description for explain() and the guards log
    tensor: str | None = None  # the tensor's source expression, for tensor checks
    native: bool = False  # also covered by the native tensor check (its type guard)
    # checks of values read from one object: (its expression, ((read, key, mode, value), ...))
    # read: 'a' attribute, 'k' item, 'c' closure cell (see csrc/attr_guards.cpp)
    attrs: tuple[str, tuple[tuple[str, object, str, object], ...]] | None = None


@dataclass
class GuardSet:
    guards: list[Guard] = field(default_factory=list)
    consts: list[object] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _const_index: dict[int, int] = field(default_factory=dict)  # id(const) -> its index
    native: object = field(default_factory=lambda: TensorGuards() if TensorGuards else None)
    # source expression -> the metadata its tensor guard checks (see tensor_metadata)
    tensor_meta: dict[str, tuple] = field(default_factory=dict)
    # inputs with symbolic sizes (shape_guards.py), made by the first symbolic_tensor
    shapes: ShapeGuards | None = None
    # told of every add, repeats too (call_reuse.py's recorders of module calls)
    listeners: list = field(default_factory=list)

    def const(self, value: object) -> str:
        # by identity; ``consts`` keeps each object alive, so its id stays its own
        i = self._const_index.get(id(value))
        if i is None:
            i = self._const_index[id(value)] = len(self.consts)
            self.consts.append(value)
        return f"__k_C[{i}]"

    def add(
        self,
        code: str,
        what: str,
        tensor: str | None = None,
        native: bool = False,
        attrs: tuple | None = None,
    ) -> bool:
        """Record a guard; False when the same check was recorded before."""
        if self.listeners:
            guard = Guard(code, what, tensor, native, attrs)
            for listener in self.listeners:
                listener.guard(guard)
        if code in self._seen:
            return False
        self._seen.add(code)
        self.guards.append(Guard(code, what, tensor, native, attrs))
        return True

    def _attr(self, src: Source, mode: str, value: object) -> tuple | None:
        """The native form of a check on ``src`` when it reads an attribute, a constant
        item or a closure cell of another object."""
        if isinstance(src, AttrSource):
            return (src.base.expr(), (("a", src.name, mode, value),))
        if isinstance(src, ItemSource) and type(src.key) in (str, int):
            return (src.base.expr(), (("k", src.key, mode, value),))
        if isinstance(src, ClosureSource):
            fn = src.fn.expr() if src.fn is not None else "__k_fn"
            return (fn, (("c", src.index, mode, value),))
        return None

    # -- kinds -------------------------------------------------------------------------

    def type_is(self, src: Source, value: object) -> None:
        e = src.expr()
        self.add(
            f"type({e}) is {self.const(type(value))}",
            f"type({e}) is {type(value).__qualname__}",
            attrs=self._attr(src, "t", type(value)),
        )

    def id_is(self, src: Source, value: object) -> None:
        e = src.expr()
        self.add(
            f"{e} is {self.const(value)}",
            f"{e} is the object seen at capture ({type(value).__name__})",
            attrs=self._attr(src, "i", value),
        )

    def literal(self, src: Source, value: tuple) -> bool:
        """A flat tuple of literals read as an attribute, as one check (type and value of
        the tuple and of each element); False when ``src`` is not an attribute."""
        if self._attr(src, "e", value) is None or CHECK_ATTRS is None:
            return False
        e = src.expr()
        self.add(
            f"__k_same_literal({e}, {self.const(value)})",
            f"{e} == {value!r}",
            attrs=self._attr(src, "e", value),
        )
        return True

    def const_eq(self, src: Source, value: object) -> None:
        e = src.expr()
        if value is None or isinstance(value, bool):
            self.add(f"{e} is {value!r}", f"{e} is {value!r}", attrs=self._attr(src, "e", value))
            return
        if self._attr(src, "e", value) and not (isinstance(value, float) and value != value):
            t = self.const(type(value))
            if type(value) in CONST_TYPES and value not in (float("inf"), float("-inf")):
                code = f"type({e}) is {t} and {e} == {value!r}"
            else:
                code = f"type({e}) is {t} and {e} == {self.const(value)}"
            self.add(code, f"{e} == {value!r}", attrs=self._attr(src, "e", value))
            return
        self.type_is(src, value)
        if isinstance(value, float) and value != value:
            self.add(f"{e} != {e}", f"{e} is nan")
            return
        if type(value) in CONST_TYPES and not (
            isinstance(value, float) and value in (float("inf"), float("-inf"))
        ):
            self.add(f"{e} == {value!r}", f"{e} == {value!r}")
        else:
            self.add(f"{e} == {self.const(value)}", f"{e} == {value!r}")

    def tensor(self, src: Source, t: torch.Tensor) -> None:
        e = src.expr()
        native = self.native is not None
        self.add(
            f"type({e}) is {self.const(type(t))}",
            f"type({e}) is {type(t).__qualname__}",
            native=native,
        )
        added = self.add(
            f"__k_tensor_check({e}, {self.const(t.dtype)}, {self.const(t.device)}, "
            f"{tuple(t.shape)!r}, {tuple(t.stride())!r}, {t.requires_grad!r})",
            f"{e}: {str(t.dtype)[6:]}{list(t.shape)} stride={tuple(t.stride())} on {t.device}"
            f" requires_grad={t.requires_grad}",
            tensor=e,
        )
        if added and native:
            self.native.add(t)
        if added:
            self.tensor_meta[e] = tensor_metadata(t)

    def symbolic_tensor(self, src: Source, t: torch.Tensor, size: list, stride: list) -> None:
        """An input whose sizes are the expressions ``size`` (some symbolic) of the
        trace's ShapeEnv: its type checked here, the rest by the entry's shape guard."""
        if self.shapes is None:
            raise RuntimeError("kiln: GuardSet.shapes is needed for symbolic inputs")
        e = src.expr()
        self.shapes.add(e, t, size, stride)
        shape = ", ".join(str(s) for s in size)
        self.add(
            f"type({e}) is {self.const(type(t))}",
            f"{e}: {type(t).__qualname__} {str(t.dtype)[6:]}[{shape}] "
            f"stride=({', '.join(str(s) for s in stride)}) on {t.device} "
            f"requires_grad={t.requires_grad}",
        )

    def guards_tensors(self, exprs: list[str], tensors: list[object]) -> bool:
        """Whether a tensor guard checks each of ``exprs`` against exactly the metadata of
        the matching tensor in ``tensors`` (what a backend's ``kiln_guarded_call`` may
        then assume)."""
        symbolic = {t.expr: t for t in self.shapes.tensors} if self.shapes is not None else {}

        def guarded(e: str, t: object) -> bool:
            if not isinstance(t, torch.Tensor):
                return False
            if e in symbolic:  # the shape guard checks all of it, sizes as symbols
                s = symbolic[e]
                return (s.dtype, s.device, s.requires_grad) == (t.dtype, t.device, t.requires_grad)
            return self.tensor_meta.get(e) == tensor_metadata(t)

        return len(exprs) == len(tensors) and all(guarded(e, t) for e, t in zip(exprs, tensors))

    def length(self, src: Source, n: int) -> None:
        e = src.expr()
        self.add(f"len({e}) == {n}", f"len({e}) == {n}")

    def dict_keys(self, src: Source, keys: tuple) -> None:
        e = src.expr()
        self.add(f"tuple({e}) == {keys!r}", f"keys of {e} are {keys!r}")

    def same_object(self, src: Source, other: Source) -> None:
        self.add(f"{src.expr()} is {other.expr()}", f"{src.expr()} is {other.expr()}")

    def no_hooks(self, src: Source) -> None:
        e = src.expr()
        tables = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
        self.add(
            f"not ({' or '.join(f'{e}.{t}' for t in tables)})",
            f"{e} has no hooks",
            attrs=(e, tuple(("a", t, "f", None) for t in tables)),
        )

    def no_backward_hooks(self, src: Source) -> None:
        e = src.expr()
        tables = ("_backward_hooks", "_backward_pre_hooks")
        self.add(
            f"not ({' or '.join(f'{e}.{t}' for t in tables)})",
            f"{e} has no backward hooks",
            attrs=(e, tuple(("a", t, "f", None) for t in tables)),
        )

    # -- compilation -------------------------------------------------------------------

    def compile(self, params: list[str], globals_dict: dict) -> types.FunctionType:
        if self.native is None:
            conds = self._conditions(self.guards)
        else:  # every tensor in one native call, after the other guards passed
            conds = self._conditions([g for g in self.guards if g.tensor is None and not g.native])
            tensors = [g.tensor for g in self.guards if g.tensor is not None]
            if tensors:
                conds.append(f"__k_tensors({', '.join(tensors)})")
        if self.shapes is not None and (self.shapes.tensors or self.shapes.ints):
            conds.append(self.shapes.build(self.const, self.consts))
        head = f"def __guard(__k_fn, {', '.join(params)}):\n"

        def make() -> tuple[str, types.CodeType]:
            body = "".join(f"    {line}\n" for line in hoist_reads(conds))
            src = f"{head}{body}    return True\n"
            return src, compile(src, "<kiln guard>", "exec")

        # the same expressions give the same function: kept on disk for a warm process
        # (code_cache.py, "persistent generated code")
        src, code = code_cache.cached(
            "guard", "\0".join([head, *conds]), (str, types.CodeType), make
        )
        ns = guard_namespace(self, globals_dict)
        exec(code, ns)
        fn = ns["__guard"]
        fn.__kiln_source__ = src
        return fn

    def _conditions(self, guards: list[Guard]) -> list[str]:
        """Guard expressions in order, with the attribute checks of each object gathered
        into one native call where the first of them stood (design note above)."""
        if CHECK_ATTRS is None:
            return [g.code for g in guards]
        conds: list[str | None] = []
        groups: dict[str, tuple[int, list]] = {}
        for g in guards:
            if g.attrs is None:
                conds.append(g.code)
                continue
            base, entries = g.attrs
            if base not in groups:
                groups[base] = (len(conds), [])
                conds.append(None)
            groups[base][1].extend(entries)
        for base, (i, entries) in groups.items():
            keys = self.const(tuple(k for _, k, _, _ in entries))
            reads = self.const("".join(r for r, _, _, _ in entries).encode())
            modes = self.const("".join(m for _, _, m, _ in entries).encode())
            values = self.const(tuple(v for _, _, _, v in entries))
            conds[i] = f"__k_attrs({base}, {keys}, {reads}, {modes}, {values})"
        return [c for c in conds if c is not None]

    def first_failure(
        self, fn_obj: object, params: list[str], args: tuple, globals_dict: dict
    ) -> str:
        """Describe the first guard that fails for ``args`` (for the recompiles log)."""
        ns = {
            "__k_C": self.consts,
            "__k_G": globals_dict,
            "__k_tensor_check": tensor_check,
            "__k_same_literal": same_literal,
        }
        ns.update(zip(params, args, strict=True))
        ns["__k_fn"] = fn_obj
        tensors = []
        for g in self.guards:
            try:
                ok = eval(g.code, ns)
                if g.tensor is not None:
                    tensors.append(eval(g.tensor, ns))
            except Exception:
                ok = False
            if not ok:
                return g.what
        if self.native is not None and len(tensors) == len(self.native):
            i = self.native.first_mismatch(*tensors)
            if i >= 0:  # what Python does not see: the dispatch key set
                what = [g.what for g in self.guards if g.tensor is not None][i]
                return f"{what}: dispatch keys differ"
        if self.shapes is not None and self.shapes.fn is not None:
            try:
                inputs = [eval(e, ns) for e in self.shapes.exprs()]
            except Exception as e:
                return f"reading a symbolic input raised {type(e).__name__}: {e}"
            why = self.shapes.first_failure(inputs)
            if why is not None:
                return why
        return "no single guard failed"


def guard_namespace(gs: GuardSet, globals_dict: dict) -> dict:
    """The names a guard function of ``gs`` reads (frame_store.py builds one too)."""
    return {
        "__k_C": gs.consts,
        "__k_G": globals_dict,
        "__k_tensor_check": tensor_check,
        "__k_tensors": gs.native.check if gs.native is not None else None,
        "__k_attrs": CHECK_ATTRS,
        "__k_same_literal": same_literal,
        "__k_shapes": gs.shapes.call if gs.shapes is not None else None,
    }


_SCOPES = (ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp, ast.Lambda)
_NOT_CHAINS = ("type", "len", "tuple")  # cheap, and the result is what a guard compares
_CHILDREN: dict[type, tuple[str, ...]] = {}  # node type -> its fields that hold nodes


def _children(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.iter_child_nodes`` without its per-field checks of fields that hold no node."""
    t = type(node)
    fields = _CHILDREN.get(t)
    if fields is None:
        fields = _CHILDREN[t] = tuple(f for f in t._fields if f not in ("ctx", "op", "ops"))
    for f in fields:
        v = getattr(node, f)
        if isinstance(v, ast.AST):
            yield v
        elif isinstance(v, list):
            for x in v:
                if isinstance(x, ast.AST):
                    yield x


def _scan(node: ast.AST, keys: set[str]) -> str | None:
    """The text of ``node`` when it is a read chain, else None; the text of every read
    chain below it, itself included, added to ``keys`` (a name alone is not added), and
    each node's answer kept on it as ``_k`` for ``_rewrite``. Nested scopes are not
    looked into (their names are not ours).

    A read chain is a pure read rooted at a name: ``a.b``, ``a[<const>]``,
    ``getattr(a, <const>)``, or a call of such a chain on such chains and constants
    (read-only sources). Its text is built from its parts' (a model's guards are
    thousands of chains a dozen reads deep)."""
    t = type(node)
    key = None
    if t is ast.Name:
        return node.id
    if t is ast.Constant or t in _SCOPES:
        return None
    if t is ast.Attribute:
        base = _scan(node.value, keys)
        key = None if base is None else f"{base}.{node.attr}"
    elif t is ast.Subscript:
        base = _scan(node.value, keys)
        if type(node.slice) is ast.Constant:
            key = None if base is None else f"{base}[{node.slice.value!r}]"
        else:
            _scan(node.slice, keys)
    elif t is ast.Call:
        func = _scan(node.func, keys)
        args = [repr(a.value) if type(a) is ast.Constant else _scan(a, keys) for a in node.args]
        for k in node.keywords:
            _scan(k.value, keys)
        chain = not node.keywords and func is not None and None not in args
        if chain and not (type(node.func) is ast.Name and node.func.id in _NOT_CHAINS):
            key = f"{func}({', '.join(args)})"  # type: ignore[arg-type]
    else:
        for child in _children(node):
            _scan(child, keys)
    node._k = key  # type: ignore[attr-defined]
    if key is not None:
        keys.add(key)
    return key


def _splice(text: bytes, start: int, end: int, edits: list[tuple[int, int, str]]) -> str:
    """``text[start:end]`` (UTF-8, as the parser's offsets count) with ``edits``, spans
    in order that do not overlap, replaced."""
    parts, at = [], start
    for s, e, new in edits:
        parts.append(text[at:s].decode())
        parts.append(new)
        at = e
    parts.append(text[at:end].decode())
    return "".join(parts)


class _Hoist:
    """Replaces the shared read chains of expressions by locals named ``<prefix><n>``,
    appending each local's assignment to ``lines`` at its first use. An expression's
    text is its source with spans replaced, so nothing is printed back from a tree."""

    def __init__(self, shared: set[str], lines: list[str], prefix: str) -> None:
        self.shared, self.lines, self.prefix = shared, lines, prefix
        self.names: dict[str, str] = {}

    def edits(self, node: ast.AST, text: bytes) -> list[tuple[int, int, str]]:
        """The replacements inside ``node`` (its children's first, in source order)."""
        t = type(node)
        if t is ast.Name or t is ast.Constant or t in _SCOPES:
            return []
        out: list[tuple[int, int, str]] = []
        if t is ast.Attribute:
            out = self.edits(node.value, text)
        elif t is ast.Subscript:
            out = self.edits(node.value, text) + self.edits(node.slice, text)
        else:
            for child in _children(node):
                out += self.edits(child, text)
        key = getattr(node, "_k", None)
        if key is None or key not in self.shared:
            return out
        name = self.names.get(key)
        start, end = node.col_offset, node.end_col_offset
        if name is None:
            name = self.names[key] = f"{self.prefix}{len(self.names)}"
            self.lines.append(f"{name} = {_splice(text, start, end, out)}")
        return [(start, end, name)]

    def scanned_edits(self, node: read_chains.Node, text: bytes) -> list[tuple[int, int, str]]:
        """``edits`` for a node of ``read_chains.scan``."""
        if node.parts:
            return self._chain_edits(node, len(node.parts), text)
        out: list[tuple[int, int, str]] = []
        for kid in node.kids:
            out += self.scanned_edits(kid, text)
        key = node.key
        if key is None or key not in self.shared:
            return out
        name = self.names.get(key)
        if name is None:
            name = self.names[key] = f"{self.prefix}{len(self.names)}"
            self.lines.append(f"{name} = {_splice(text, node.start, node.end, out)}")
        return [(node.start, node.end, name)]

    def _chain_edits(
        self, node: read_chains.Node, k: int, text: bytes
    ) -> list[tuple[int, int, str]]:
        """The edit of the longest shared one of a chain token's first ``k`` reads (as
        ``edits`` of the nested nodes that ``ast`` makes of them)."""
        for j in range(k - 1, -1, -1):
            end, key = node.parts[j]
            if key in self.shared:
                name = self.names.get(key)
                if name is None:
                    inner = self._chain_edits(node, j, text)
                    name = self.names[key] = f"{self.prefix}{len(self.names)}"
                    self.lines.append(f"{name} = {_splice(text, node.start, end, inner)}")
                return [(node.start, end, name)]
        return []


def _parse(exprs: list[str]) -> list[ast.expr | None]:
    """Each expression's tree, parsed together; None for one of several lines (its
    offsets would not be those of its own text: it is left as it is)."""
    one_line = [e if "\n" not in e and "\r" not in e else "None" for e in exprs]
    body = ast.parse("\n".join(f"({e})" for e in one_line)).body
    if len(body) != len(exprs):  # not an expression each: parsed alone, to say which
        for e in exprs:
            ast.parse(e, mode="eval")
        raise SyntaxError("kiln: guard expressions did not parse one a line")
    return [s.value if e is o else None for s, e, o in zip(body, exprs, one_line)]  # type: ignore[attr-defined]


def hoist_reads(guards: list[str]) -> list[str]:
    """Straight-line guard code with shared read chains computed once (design note above)."""
    with paused():  # thousands of AST nodes, none in a cycle (gc_pause.py)
        return _hoist_reads(guards)


def _hoist_reads(guards: list[str]) -> list[str]:
    lines: list[str] = []
    for cond in _hoisted(guards, "__r", lines):
        lines.append(f"if not ({cond}): return False")
    return lines


def _hoisted(exprs: list[str], prefix: str, lines: list[str]) -> Iterator[str]:
    """Each of ``exprs`` with its shared read chains replaced by locals ``<prefix><n>``,
    whose assignments are appended to ``lines`` as each expression is visited (before it
    is yielded: a caller interleaving its own lines keeps every read after the guards
    before it)."""
    counts: Counter[str] = Counter()
    # the read chains of each expression from its text (read_chains.py, "scanning read
    # chains"); the few it leaves are parsed
    scanned: list[list[read_chains.Node] | None] = []
    for e in exprs:
        keys: set[str] = set()
        nodes = read_chains.scan(e, keys)
        scanned.append(nodes)
        if nodes is not None:
            counts.update(keys)
    parsed = [i for i, nodes in enumerate(scanned) if nodes is None]
    trees: dict[int, ast.expr | None] = dict(zip(parsed, _parse([exprs[i] for i in parsed])))
    for tree in trees.values():
        if tree is not None:
            keys = set()
            _scan(tree, keys)
            counts.update(keys)
    hoist = _Hoist({k for k, n in counts.items() if n > 1}, lines, prefix)
    for i, e in enumerate(exprs):
        nodes = scanned[i]
        if nodes is not None:
            text = e.encode()
            edits = [x for node in nodes for x in hoist.scanned_edits(node, text)]
            yield _splice(text, 0, len(text), edits) if edits else e
            continue
        tree = trees[i]
        if tree is None:
            yield e
            continue
        text = f"({e})".encode()
        yield _splice(text, 1, len(text) - 1, hoist.edits(tree, text))


def hoist_args(exprs: list[str], prefix: str) -> tuple[list[str], list[str]]:
    """``(lines, exprs)``: the arguments of one call (a cache hit's graph call re-reads
    every parameter through ``self._modules[...]...``) with the read chains they share
    computed once into locals named ``<prefix><n>`` by ``lines``, run just before the
    call. Only reads of sources move, and only to just before the call whose arguments
    would read them, so nothing runs in between (the guards' design note above). Kept
    on disk like the guard function (code_cache.py)."""

    def make() -> tuple[tuple[str, ...], tuple[str, ...]]:
        lines: list[str] = []
        with paused():
            hoisted = tuple(_hoisted(exprs, prefix, lines))
        return tuple(lines), hoisted

    lines, hoisted = code_cache.cached("args", "\0".join([prefix, *exprs]), (tuple, tuple), make)
    return list(lines), list(hoisted)


_DEVICE_CONTEXT = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)


def default_device_name() -> str:
    """``str(torch.get_default_device())``, without its cost (about 10 us: it walks the
    torch-function mode stack) when no device context can be active."""
    if (
        _DEVICE_CONTEXT is not None
        and not torch._C._is_torch_function_mode_enabled()
        and getattr(_DEVICE_CONTEXT, "device_context", None) is None
    ):
        return "cpu"
    return str(torch.get_default_device())


def tensor_metadata(t: torch.Tensor) -> tuple:
    """What a tensor guard checks, as one comparable value (dispatch keys aside)."""
    return (type(t), t.dtype, t.device, tuple(t.shape), tuple(t.stride()), t.requires_grad)


def tensor_check(t, dtype, device, shape, stride, requires_grad) -> bool:
    return (
        t.dtype is dtype
        and t.device == device
        and t.shape == shape
        and t.stride() == stride
        and t.requires_grad is requires_grad
    )


def same_literal(value: object, expected: object) -> bool:
    """What ``check_attrs`` mode 'e' computes: identical, or the same type and equal,
    tuples element by element."""
    if value is expected:
        return True
    if type(value) is not type(expected):
        return False
    if type(expected) is tuple:
        return len(value) == len(expected) and all(map(same_literal, value, expected))
    return value == expected
