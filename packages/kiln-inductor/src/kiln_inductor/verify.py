"""verify_ir: checks of the lowered IR and of the schedule, between pipeline stages.

Run by ``compile_aten_graph`` after lowering and after scheduling when ``KILN_VERIFY=1``
(the test suites set it). A failure raises ``IRVerificationError`` naming the stage, the
buffer and what is wrong: a compiler bug caught where it is made, not as a wrong result.

Checked: every buffer a body loads, an extern call reads or the graph returns is defined
(an input, a constant, or a node earlier in program order); every layout has as many
strides as sizes and a non-negative offset; a computed buffer's body has the rank of its
layout; every kernel of the schedule reads only buffers computed before it (or inputs),
and every node is scheduled exactly once.

Dtypes (``_DtypeHandler`` runs each body on dtypes instead of values): the operands of an
arithmetic or comparison op have one dtype (the backends compute in the first operand's:
a lowering must convert with ``to_dtype``); a ``where``'s branches have one dtype and its
condition, like a ``masked`` load's mask, is bool; comparisons, logical ops and
``isnan``/``isinf``/``signbit`` give bool; an indirect index is an integer; the value a
pointwise or scan body returns has its buffer's dtype, a reduction's the ``src_dtype`` it
reduces, and the buffer's layout has the body's dtype.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from .config import read_config
from .errors import KilnInductorError
from .ir.nodes import (
    ComputedBuffer,
    ExternKernel,
    GraphIR,
    Layout,
    Reduction,
    Scan,
    Scatter,
    StorageView,
)
from .ir.ops import OP_NAMES, ops_handler
from .ir.symbols import index_vars
from .scheduler.access import node_access


class IRVerificationError(KilnInductorError):
    def __init__(self, stage: str, problems: list[str]):
        listed = "\n  ".join(problems[:20])
        super().__init__(
            f"the IR after {stage} is inconsistent (a kiln-inductor bug):\n  {listed}\n"
            "  fix: report it with the KILN_DEBUG_DIR dumps; the graph runs eagerly meanwhile"
        )


def enabled() -> bool:
    return read_config().verify


def _layout_problems(name: str, lay: Layout) -> list[str]:
    out = []
    if len(lay.size) != len(lay.stride):
        out.append(f"{name}: {len(lay.size)} sizes but {len(lay.stride)} strides")
    offset = getattr(lay, "offset", 0)
    if getattr(offset, "is_number", False) and int(offset) < 0:
        out.append(f"{name}: negative offset {offset}")
    return out


def _views(a: Any) -> list[str]:
    if isinstance(a, StorageView):
        return [a.buffer.name]
    if isinstance(a, (list, tuple)):
        return [n for x in a for n in _views(x)]
    return []


_BOOL_UNARY = frozenset({"isnan", "isinf", "signbit", "logical_not"})
_BOOL_BINARY = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
_LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor"})  # any operands, bool result


class _DtypeHandler:
    """Runs a body on dtypes (None where unknown) and records where they break the rules
    (see the module docstring)."""

    def __init__(self, dtypes: dict[str, torch.dtype], site: str, problems: list[str]):
        self.dtypes, self.site, self.problems = dtypes, site, problems

    def _bad(self, what: str) -> None:
        self.problems.append(f"{self.site}: {what}")

    def load(self, name: str, index: Any) -> torch.dtype | None:
        return self.dtypes.get(name)

    def constant(self, value: Any, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def index_expr(self, expr: Any, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def to_dtype(self, x: Any, dtype: torch.dtype, src_dtype: Any = None) -> torch.dtype:
        return dtype

    def where(self, c: Any, a: Any, b: Any) -> torch.dtype | None:
        if c is not None and c != torch.bool:
            self._bad(f"where() on a {c} condition (a bool is needed)")
        self._same("where", a, b)
        return a if a is not None else b

    def masked(self, mask: Any, body: Any, other: Any) -> torch.dtype | None:
        if mask is not None and mask != torch.bool:
            self._bad(f"masked() with a {mask} mask (a bool is needed)")
        return body()

    def indirect_indexing(self, value: Any, size: Any, check: Any = None) -> sympy.Symbol:
        if value is not None and (value.is_floating_point or value == torch.bool):
            self._bad(f"an indirect index of dtype {value}")
        return sympy.Symbol("indirect", integer=True, nonnegative=True)

    def _same(self, name: str, a: Any, b: Any) -> None:
        if a is not None and b is not None and a != b:
            self._bad(f"{name}() of a {a} and a {b} operand (convert one with to_dtype)")

    def __getattr__(self, name: str) -> Any:
        if name not in OP_NAMES:
            raise AttributeError(name)

        def op(a: Any, b: Any = _UNARY) -> torch.dtype | None:
            if b is _UNARY:
                return torch.bool if name in _BOOL_UNARY else a
            if name in _LOGICAL:
                return torch.bool
            self._same(name, a, b)
            return torch.bool if name in _BOOL_BINARY else a

        return op


_UNARY = object()


def _body_dtype_problems(node: ComputedBuffer, dtypes: dict[str, torch.dtype]) -> list[str]:
    problems: list[str] = []
    body = node.body
    where = f"{node.name} ({node.origin or type(body).__name__})"
    if body.dtype != node.layout.dtype:
        problems.append(f"{where}: a {body.dtype} body stored as {node.layout.dtype}")
    handler = _DtypeHandler(dtypes, where, problems)
    with ops_handler(handler):
        if isinstance(body, Reduction):
            got = body.inner_fn(
                index_vars("q", len(body.size)), index_vars("r", len(body.reduction_ranges))
            )
            want, what = body.src_dtype, "reduces"
        elif isinstance(body, Scatter):
            target, got = body.inner_fn(index_vars("q", len(body.ranges)))
            want, what = body.dtype, "scatters"
            if len(target) != len(body.size):
                problems.append(
                    f"{where}: a target of rank {len(target)} in a tensor of rank {len(body.size)}"
                )
            if dtypes.get(body.base) != body.dtype:
                problems.append(f"{where}: updates its base {body.base} of another dtype")
        else:
            got = body.inner_fn(index_vars("q", len(body.size)))
            want, what = body.dtype, "stores"
    if isinstance(got, torch.dtype) and got != want:
        problems.append(f"{where}: its body makes a {got} value and {what} a {want}")
    return problems


def verify_ir(ir: GraphIR, stage: str = "lowering") -> None:
    """Check the lowered graph (see the module docstring)."""
    problems: list[str] = []
    defined = {b.name for b in ir.inputs if b is not None} | {c.name for c in ir.constants}
    dtypes = {name: buf.layout.dtype for name, buf in ir.buffers.items()}
    for name, buf in ir.buffers.items():
        problems += _layout_problems(name, buf.layout)
    for node in ir.nodes:
        if isinstance(node, ComputedBuffer):
            body = node.body
            if body is None:
                problems.append(f"{node.name}: a computed buffer without a body")
                continue
            rank = len(body.size)
            if not isinstance(body, Scan) and rank != len(node.layout.size):
                problems.append(
                    f"{node.name}: body of rank {rank} stored into a layout of rank "
                    f"{len(node.layout.size)}"
                )
            for load, _ in node_access(node).loads:
                if load not in defined:
                    problems.append(f"{node.name} loads {load}, not defined before it")
            problems += _body_dtype_problems(node, dtypes)
            defined.add(node.name)
        elif isinstance(node, ExternKernel):
            for name in node.input_buffers():
                if name not in defined:
                    problems.append(f"{node.name} ({node.op}) reads {name}, not defined before it")
            defined.update(o.name for o in node.outputs)
            defined.add(node.name)
    for name in _views(ir.outputs):
        if name not in defined:
            problems.append(f"the graph returns {name}, which nothing defines")
    if problems:
        raise IRVerificationError(stage, problems)


def verify_schedule(ir: GraphIR, steps: list[Any], stage: str = "scheduling") -> None:
    """Every node scheduled once; each kernel reads only what is computed before it."""
    problems: list[str] = []
    ready = {b.name for b in ir.inputs if b is not None} | {c.name for c in ir.constants}
    seen: dict[str, int] = {}
    for step in steps:
        if isinstance(step, ExternKernel):
            for name in step.input_buffers():
                if name not in ready:
                    problems.append(f"{step.name} reads {name} before it is computed")
            ready.update(o.name for o in step.outputs)
            seen[step.name] = seen.get(step.name, 0) + 1
            continue
        extern = getattr(step, "extern", None)  # a matmul template: its extern inside it
        if isinstance(extern, ExternKernel):
            seen[extern.name] = seen.get(extern.name, 0) + 1
            ready.update(o.name for o in extern.outputs)
        for name in getattr(step, "inputs", ()):
            if name not in ready:
                problems.append(f"kernel {step.name} reads {name} before it is computed")
        for block in getattr(step, "blocks", ()):
            for node in block.nodes:
                seen[node.name] = seen.get(node.name, 0) + 1
        ready.update(getattr(step, "outputs", ()))
        for block in getattr(step, "blocks", ()):
            ready.update(n.name for n in block.nodes)
    for node in ir.nodes:
        n = seen.get(node.name, 0)
        if n != 1:
            problems.append(f"{node.name} is scheduled {n} times")
    if problems:
        raise IRVerificationError(stage, problems)
