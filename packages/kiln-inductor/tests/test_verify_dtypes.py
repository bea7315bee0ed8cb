"""The IR verifier's dtype rules (verify.py): bodies are run on dtypes; an operand of
another dtype, a non-bool condition, a float index or a stored value of the wrong dtype is
reported as a kiln-inductor bug, before any code is generated."""

from __future__ import annotations

import pytest
import torch

from kiln_inductor.ir.nodes import ComputedBuffer, GraphIR, InputBuffer, Layout, Pointwise
from kiln_inductor.ir.ops import ops
from kiln_inductor.verify import IRVerificationError, verify_ir


def _graph(inner, dtype=torch.float32) -> GraphIR:
    cpu = torch.device("cpu")
    ir = GraphIR()
    for name, dt in (("x", torch.float32), ("i", torch.int64), ("m", torch.bool)):
        buf = InputBuffer(name, Layout.contiguous(cpu, dt, (4,)))
        ir.inputs.append(buf)
        ir.buffers[name] = buf
    body = Pointwise(cpu, dtype, (4,), inner)
    node = ComputedBuffer("buf0", Layout.contiguous(cpu, dtype, (4,)), body)
    ir.nodes.append(node)
    ir.buffers[node.name] = node
    return ir


def _x(index):
    return ops.load("x", index[0])


def test_well_typed_bodies_pass():
    verify_ir(_graph(lambda q: ops.add(_x(q), ops.to_dtype(ops.load("i", q[0]), torch.float32))))
    verify_ir(
        _graph(lambda q: ops.where(ops.load("m", q[0]), _x(q), ops.constant(0.0, torch.float32)))
    )
    verify_ir(_graph(lambda q: ops.lt(_x(q), ops.constant(1.0, torch.float32)), torch.bool))


@pytest.mark.parametrize(
    "inner, dtype, message",
    [
        (lambda q: ops.add(_x(q), ops.load("i", q[0])), torch.float32, "add() of a torch.float32 and a torch.int64"),
        (lambda q: ops.where(_x(q), _x(q), _x(q)), torch.float32, "where() on a torch.float32 condition"),
        (lambda q: ops.lt(_x(q), ops.constant(1.0, torch.float32)), torch.float32, "makes a torch.bool value"),
        (lambda q: ops.load("x", ops.indirect_indexing(_x(q), 4)), torch.float32, "indirect index of dtype torch.float32"),
    ],
)  # fmt: skip
def test_dtype_rule_violations_are_reported(inner, dtype, message):
    with pytest.raises(IRVerificationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        verify_ir(_graph(inner, dtype))
