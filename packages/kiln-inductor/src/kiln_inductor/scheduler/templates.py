"""fuse_templates: a matmul and the pointwise kernel that consumes it, as one template.

Before: the steps of ``fuse_nodes``. After: the same steps, except that where a backend
accepts it, an extern ``mm``/``addmm``/``bmm`` whose output only one pointwise kernel
reads (its *epilogue*) is removed and that kernel becomes a ``TemplateGroup``: the backend
generates one kernel that computes the product tile by tile and applies the epilogue to
each tile while it is still in registers, so the product is never written to memory.

A backend opts in with ``template_accepts(extern, epilogue, buffers) -> bool`` (kiln-triton
does, under ``mode="max-autotune"``). The epilogue must be a pointwise kernel over exactly
the product's elements that reads the product only at the element it writes (bias, GELU,
residual adds, casts; not a transpose or a reduction); the product must be read by nothing
else and must not be a graph output.

The template takes the epilogue's place in the schedule (its other inputs exist by then,
and so do the matmul's, which nothing in between may overwrite: memory is planned after
this pass and sees the template read them). The matmul's operands are read at arbitrary
indices, so they go in ``opaque_reads``, which keeps memory planning from writing an
output over them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from ..ir.nodes import Buffer, ExternKernel, GraphIR, StorageView
from ..ir.symbols import contiguous_strides, product
from .fuse import FusedGroup, Step

TEMPLATE_OPS = ("mm", "addmm", "bmm")

Accepts = Callable[[ExternKernel, FusedGroup, dict[str, Buffer]], bool]


@dataclass
class TemplateGroup(FusedGroup):
    extern: ExternKernel | None = None  # the matmul
    product: str = ""  # its output buffer, which stays in registers
    epilogue: FusedGroup | None = None  # the consumer as fuse_nodes planned it


def op_name(op: object) -> str:
    packet = getattr(op, "overloadpacket", op)
    return getattr(packet, "__name__", str(packet))


def _reads_product_elementwise(group: FusedGroup, product_buf: Buffer) -> bool:
    if any(b.kind != "pointwise" or b.inner for b in group.blocks):
        return False
    lay = product_buf.layout
    if not lay.is_contiguous() or sympy.simplify(product(group.outer) - lay.numel) != 0:
        return False
    flat = sum(
        (v * st for v, st in zip(group.outer_vars, contiguous_strides(group.outer))),
        sympy.Integer(0),
    )
    for node in group.nodes:
        for name, index in group.bound[node.name][3]:
            if name == product_buf.name and sympy.expand(index - flat) != 0:
                return False
    return True


def fuse_templates(steps: list[Step], ir: GraphIR, accepts: Accepts) -> list[Step]:
    readers: dict[str, list[int]] = {}
    for k, step in enumerate(steps):
        names = step.input_buffers() if isinstance(step, ExternKernel) else step.inputs
        for b in set(names):
            readers.setdefault(b, []).append(k)
    graph_outputs = {o.buffer.name for o in ir.outputs if isinstance(o, StorageView)}
    out = list(steps)
    removed: set[int] = set()
    for k, step in enumerate(steps):
        if (
            not isinstance(step, ExternKernel)
            or step.kind != "extern"
            or op_name(step.op) not in TEMPLATE_OPS
            or len(step.outputs) != 1
            or step.outputs[0].name in graph_outputs
        ):
            continue
        prod = step.outputs[0]
        users = readers.get(prod.name, [])
        if len(users) != 1 or users[0] <= k:
            continue
        group = out[users[0]]
        if (
            not isinstance(group, FusedGroup)
            or isinstance(group, TemplateGroup)
            or not _reads_product_elementwise(group, prod)
            or not accepts(step, group, ir.buffers)
        ):
            continue
        operands = list(dict.fromkeys(step.input_buffers()))
        rest = [b for b in group.inputs if b != prod.name and b not in operands]
        out[users[0]] = TemplateGroup(
            name=group.name,
            nodes=group.nodes,
            outer=group.outer,
            outer_vars=group.outer_vars,
            blocks=group.blocks,
            bound=group.bound,
            local=set(group.local),
            inputs=[*operands, *rest],
            outputs=list(group.outputs),
            aliases=set(group.aliases),
            extern=step,
            product=prod.name,
            epilogue=group,
            opaque_reads=set(operands),
        )
        removed.add(k)
    return [s for k, s in enumerate(out) if k not in removed]
