"""A collective in flight may read its input until its wait: the memory plan keeps that
input's storage alive until then, so no kernel in between writes over it (compiled here
for the CPU backend, not run: running needs a process group; tests/test_distributed.py of
the kiln package runs collectives on two processes)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.fx

import kiln_cpp  # noqa: F401  (registers the CPU backend)
import kiln_inductor
from kiln_inductor.testing import CountingCompiler

c10d = getattr(torch.ops, "_c10d_functional", None)
pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or c10d is None, reason="needs torch.distributed"
)
aten = torch.ops.aten


def test_a_collectives_input_is_not_reused_before_its_wait():
    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    y = g.call_function(aten.relu.default, (g.call_function(aten.mm.default, (x, w)),))
    start = g.call_function(c10d.all_gather_into_tensor.default, (y, 2, "0"))
    # work between the collective and its wait: buffers of y's size and dtype, which the
    # plan would otherwise place in y's storage once the collective was its last reader
    z = g.call_function(aten.sin.default, (g.call_function(aten.add.Tensor, (x, 1)),))
    z = g.call_function(aten.exp.default, (g.call_function(aten.mm.default, (z, w)),))
    wait = g.call_function(c10d.wait_tensor.default, (start,))
    g.output((wait, z))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    counting = CountingCompiler()
    kiln_inductor.compile_fx(gm, [torch.randn(8, 8), torch.randn(8, 8)], compile_graph=counting)
    src = counting.graphs[0].wrapper_source
    lines = src.splitlines()
    at = next(k for k, line in enumerate(lines) if "all_gather_into_tensor" in line)
    gathered = re.search(r"\((buf\d+), 2, '0'\)", lines[at]).group(1)
    wait_at = next(k for k, line in enumerate(lines) if "wait_tensor" in line)
    between = "\n".join(lines[at + 1 : wait_at])
    assert wait_at > at + 1, src  # kernels run while the gather is in flight
    assert f"= {gathered}" not in between and f"del {gathered}" not in between, src
