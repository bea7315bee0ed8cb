"""verify_ir: checks of the lowered IR and of the schedule, between pipeline stages.

Run by ``compile_aten_graph`` after lowering and after scheduling when ``KILN_VERIFY=1``
(the test suites set it). A failure raises ``IRVerificationError`` naming the stage, the
buffer and what is wrong: a compiler bug caught where it is made, not as a wrong result.

Checked: every buffer a body loads, an extern call reads or the graph returns is defined
(an input, a constant, or a node earlier in program order); every layout has as many
strides as sizes and a non-negative offset; a computed buffer's body has the rank of its
layout; every kernel of the schedule reads only buffers computed before it (or inputs),
and every node is scheduled exactly once.
"""

from __future__ import annotations

from typing import Any

from .config import read_config
from .errors import KilnInductorError
from .ir.nodes import ComputedBuffer, ExternKernel, GraphIR, Layout, Scan, StorageView
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


def verify_ir(ir: GraphIR, stage: str = "lowering") -> None:
    """Check the lowered graph (see the module docstring)."""
    problems: list[str] = []
    defined = {b.name for b in ir.inputs if b is not None} | {c.name for c in ir.constants}
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
