"""print_ir: the lowered graph as readable, deterministic text (the ``ir`` dump)."""

from __future__ import annotations

from typing import Any

from .nodes import (
    ComputedBuffer,
    ExternKernel,
    GraphIR,
    Layout,
    Reduction,
    Scan,
    Scatter,
    StorageView,
)
from .ops import ops_handler
from .symbols import index_vars


class _PrintHandler:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def _emit(self, text: str) -> str:
        name = f"t{len(self.lines)}"
        self.lines.append(f"{name} = {text}")
        return name

    def load(self, name: str, index: Any) -> str:
        return self._emit(f"load({name}, {index})")

    def indirect_indexing(self, value: Any, size: Any, check: Any = None) -> Any:
        import sympy

        return sympy.Symbol(f"indirect({value})")

    def masked(self, mask: Any, body: Any, other: Any) -> str:
        return self._emit(f"masked({mask}, {body()}, {other})")

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self._emit(f"{name}({', '.join(map(str, args))})")


def format_layout(layout: Layout) -> str:
    size = ", ".join(map(str, layout.size))
    stride = ", ".join(map(str, layout.stride))
    off = f", offset={layout.offset}" if layout.offset != 0 else ""
    return f"{str(layout.dtype).replace('torch.', '')}[{size}] stride=({stride}){off}"


def print_node(node: ComputedBuffer | ExternKernel) -> str:
    if isinstance(node, ExternKernel):
        outs = ", ".join(o.name for o in node.outputs)
        return f"{outs} = {node.kind} {node.op}({len(node.args)} args)"
    body = node.body
    h = _PrintHandler()
    idx = index_vars("i", len(body.size))
    result: Any
    with ops_handler(h):
        if isinstance(body, Reduction):
            rv = index_vars("r", len(body.reduction_ranges))
            result = body.inner_fn(idx, rv)
            head = f"{node.name}: {format_layout(node.layout)} = {body.reduction_type} over r in {list(body.reduction_ranges)}"
        elif isinstance(body, Scatter):
            target, value = body.inner_fn(index_vars("u", len(body.ranges)))
            op = "+=" if body.mode == "add" else "="
            result = f"{node.name}[{', '.join(str(t) for t in target)}] {op} {value}"
            serial = [f"u{d}" for d in body.serial]
            head = f"{node.name}: {format_layout(node.layout)} = {body.base} updated in place, over u in {list(body.ranges)} (in order along {serial})"
        elif isinstance(body, Scan):
            result = body.inner_fn(idx)
            head = f"{node.name}: {format_layout(node.layout)} = cumulative {body.scan_type} of i{body.axis} over i in {list(body.size)}"
        else:
            result = body.inner_fn(idx)
            head = (
                f"{node.name}: {format_layout(node.layout)} = pointwise over i in {list(body.size)}"
            )
    last = result if isinstance(body, Scatter) else f"return {result}"
    lines = [head + f"  # {node.origin}"] + [f"    {ln}" for ln in h.lines] + [f"    {last}"]
    return "\n".join(lines)


def print_ir(ir: GraphIR) -> str:
    parts = [f"input {b.name}: {format_layout(b.layout)}" for b in ir.inputs if b is not None]
    parts += [print_node(n) for n in ir.nodes]
    outs = [o.buffer.name if isinstance(o, StorageView) else repr(o) for o in ir.outputs]
    parts.append(f"return ({', '.join(outs)})")
    return "\n".join(parts) + "\n"
