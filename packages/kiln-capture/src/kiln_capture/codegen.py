"""Generated Python for one cache entry: the function that runs on a cache hit.

It calls the compiled graph with the inputs re-read from their sources, replays side
effects, rebuilds the Python values that leave the graph (the return value, or the
stack and live locals at a graph break) and, at a break, runs the unsupported step
eagerly and calls the continuation function.
"""

from __future__ import annotations

import math
import types

import torch
from torch import fx

from kiln_capture import code_cache
from kiln_capture.output import OutputGraph
from kiln_capture.variables.base import Var
from kiln_capture.variables.sizes import SymIntVar
from kiln_capture.variables.tensors import TensorVar

_SAFE_LITERALS = (int, bool, str, type(None), bytes)
_MUTABLE_NEW = frozenset(
    {
        "ListVar",
        "DictVar",
        "SetVar",
        "NewObjectVar",
        "RecordVar",
        "IteratorVar",
        "ListIteratorVar",
        "DictIteratorVar",
        "CounterVar",
        "DequeVar",
        "DequeIteratorVar",
        "ListReverseIteratorVar",
        "EnumerateVar",
        "ZipVar",
        "GeneratorVar",
        "GeneratorCMVar",  # a manager made in the trace: one object for the step and locals
        "PullIteratorVar",
    }
)


def _new_object(cls: type, attrs: dict) -> object:
    obj = cls.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


class CodeGen:
    def __init__(self, out: OutputGraph) -> None:
        self.out = out
        self.outputs: list[TensorVar] = []
        self.preamble: list[str] = []  # temporaries for mutable values built once
        self._built: dict[int, str] = {}
        self._contexts: dict[int, str] = {}
        self._output_index: dict[fx.Node, int] = {}
        self._symbols: set[str] = set()  # symbols bound in the preamble (sym_expr)
        # the frame's own cells at a break (id of the CellVar -> the generated cell's name):
        # closures rebuilt there share them with the continuation (capture.py, "cells")
        self.frame_cells: dict[int, str] = {}

    def const(self, value: object) -> str:
        if type(value) in _SAFE_LITERALS or (
            type(value) is float and value == value and value not in (float("inf"), float("-inf"))
        ):
            return repr(value)
        return self.out.guards.const(value)

    def rebuild(self, var: Var) -> str:
        """An expression for ``var``. A mutable value made during the trace (list, dict,
        set, object) is built once into a temporary, so that every reference to it in
        generated code (stack, locals, side effects) is the same object."""
        if var.source is not None or type(var).__name__ not in _MUTABLE_NEW:
            return var.reconstruct(self)
        name = self._built.get(id(var))
        if name is None:
            expr = var.reconstruct(self)
            name = f"__k_v{len(self._built)}"
            self._built[id(var)] = name
            self.preamble.append(f"{name} = {expr}")
        return name

    def context_name(self, ctx: object, create: bool = False) -> str | None:
        if create:
            self._contexts[id(ctx)] = f"__k_ctx{len(self._contexts)}"
        return self._contexts.get(id(ctx))

    def sym_expr(self, value) -> str:
        """A symbolic int (or float) as Python over the inputs' sizes it comes from
        (each symbol read from its first source, ``x.size(1)``)."""
        from kiln_capture.variables.sizes import python_source

        env = self.out.shape_env

        def bind(symbol) -> str:
            name = f"__k_sym_{symbol}"  # not __k_s<i>: a continuation's stack values
            if name not in self._symbols:
                self._symbols.add(name)
                self.preamble.append(f"{name} = {env.symbols[symbol].sources[0]}")
            return name

        return python_source(value, bind)

    def tensor(self, var: TensorVar) -> str:
        """A graph output (a tensor, or a number only the data gives), or an input."""
        if var.node.op == "placeholder":
            return self.out.input_sources[var.node].expr()
        return f"__k_out[{self._output_index[var.node]}]"

    def collect(self, roots: list[Var]) -> None:
        """Register every graph-computed tensor reachable from ``roots`` as an output."""
        seen: set[int] = set()

        def visit(v: Var) -> None:
            if id(v) in seen:
                return
            seen.add(id(v))
            if getattr(v, "picked_by", None) is not None:  # max(t, 0): rebuilt from its items
                for c in v.children():
                    visit(c)
                return
            if isinstance(v, TensorVar) or (isinstance(v, SymIntVar) and v.is_unbacked()):
                if v.node.op != "placeholder" and v.node not in self._output_index:
                    self._output_index[v.node] = len(self.outputs)
                    self.outputs.append(v)
                return
            for c in v.children():
                visit(c)
            if hasattr(v, "contents") and v.contents is not None:
                visit(v.contents)

        for r in roots:
            visit(r)

    def namespace(self, compiled, extra: dict) -> dict:
        return namespace_of(self.out.guards.consts, self.out.globals, compiled, extra)


def namespace_of(consts: list, globals_dict: dict, compiled, extra: dict) -> dict:
    """The names a run function reads (frame_store.py builds one for a kept capture)."""
    from kiln_capture import _C

    ns = {
        "__k_C": consts,
        "__k_G": globals_dict,
        "__k_graph": compiled,
        "__k_new_object": _new_object,
        "__k_MethodType": types.MethodType,
        "__k_FunctionType": types.FunctionType,
        "__k_enable": _C.set_enabled,
        "__k_cell": types.CellType,
        "torch": torch,
        "math": math,
    }
    ns.update(extra)
    return ns


def build_function(name: str, params: list[str], body: list[str], ns: dict) -> types.FunctionType:
    src = f"def {name}(__k_fn, {', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    return code_cache.compiled_function("run", name, src, f"<kiln {name}>", ns)
