"""Guards: every assumption a trace made, compiled into one generated function.

A guard is a boolean Python expression over the frame's arguments (see sources.py).
All guards of one cache entry are joined with ``and`` into a single generated function
``__guard(__k_fn, <args>)`` so that a cache hit costs one Python call.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch

from kiln_capture.sources import Source

CONST_TYPES = (int, float, bool, str, bytes, type(None), complex)


@dataclass(frozen=True)
class Guard:
    code: str  # boolean expression
    what: str  # readable description for explain() and the guards log


@dataclass
class GuardSet:
    guards: list[Guard] = field(default_factory=list)
    consts: list[object] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)

    def const(self, value: object) -> str:
        for i, c in enumerate(self.consts):
            if c is value:
                return f"__k_C[{i}]"
        self.consts.append(value)
        return f"__k_C[{len(self.consts) - 1}]"

    def add(self, code: str, what: str) -> None:
        if code not in self._seen:
            self._seen.add(code)
            self.guards.append(Guard(code, what))

    # -- kinds -------------------------------------------------------------------------

    def type_is(self, src: Source, value: object) -> None:
        e = src.expr()
        self.add(
            f"type({e}) is {self.const(type(value))}", f"type({e}) is {type(value).__qualname__}"
        )

    def id_is(self, src: Source, value: object) -> None:
        e = src.expr()
        self.add(
            f"{e} is {self.const(value)}",
            f"{e} is the object seen at capture ({type(value).__name__})",
        )

    def const_eq(self, src: Source, value: object) -> None:
        e = src.expr()
        if value is None or isinstance(value, bool):
            self.add(f"{e} is {value!r}", f"{e} is {value!r}")
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
        self.type_is(src, t)
        self.add(
            f"__k_tensor_check({e}, {self.const(t.dtype)}, {self.const(t.device)}, "
            f"{tuple(t.shape)!r}, {tuple(t.stride())!r}, {t.requires_grad!r})",
            f"{e}: {str(t.dtype)[6:]}{list(t.shape)} stride={tuple(t.stride())} on {t.device}"
            f" requires_grad={t.requires_grad}",
        )

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
        self.add(
            f"not ({e}._forward_hooks or {e}._forward_pre_hooks)",
            f"{e} has no forward hooks",
        )

    # -- compilation -------------------------------------------------------------------

    def compile(self, params: list[str], globals_dict: dict) -> types.FunctionType:
        body = " and\n        ".join(g.code for g in self.guards) or "True"
        src = f"def __guard(__k_fn, {', '.join(params)}):\n    return (\n        {body}\n    )\n"
        ns = {
            "__k_C": self.consts,
            "__k_G": globals_dict,
            "__k_tensor_check": tensor_check,
        }
        exec(compile(src, "<kiln guard>", "exec"), ns)
        fn = ns["__guard"]
        fn.__kiln_source__ = src
        return fn

    def first_failure(
        self, fn_obj: object, params: list[str], args: tuple, globals_dict: dict
    ) -> str:
        """Describe the first guard that fails for ``args`` (for the recompiles log)."""
        for g in self.guards:
            ns = {"__k_C": self.consts, "__k_G": globals_dict, "__k_tensor_check": tensor_check}
            ns.update(zip(params, args, strict=True))
            ns["__k_fn"] = fn_obj
            try:
                ok = eval(g.code, ns)
            except Exception:
                ok = False
            if not ok:
                return g.what
        return "no single guard failed"


def tensor_check(t, dtype, device, shape, stride, requires_grad) -> bool:
    return (
        t.dtype is dtype
        and t.device == device
        and t.shape == shape
        and t.stride() == stride
        and t.requires_grad is requires_grad
    )
