"""Graphs with symbolic sizes, made as kiln-capture makes them, for the tests: placeholders
whose ``meta["val"]`` has symbolic sizes of a ``kiln_shapes.ShapeEnv`` (the example inputs
stay real tensors); and a ``compile_graph`` that counts the ATen graphs compiled."""

from __future__ import annotations

import torch
import torch.fx
from kiln_shapes import ShapeEnv

import kiln_inductor


def symbolic_graph(fn, examples, dynamic, ranges=None):
    """``fn`` as an FX graph whose inputs have the dims in ``dynamic[i]`` symbolic (with
    the declared ``ranges[i]``: ``{dim: (min, max)}``, if given)."""
    gm = torch.fx.symbolic_trace(fn)
    env = ShapeEnv()
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (ph, x) in enumerate(zip(phs, examples)):
        declared = ranges[i] if ranges else None
        ph.meta["val"] = env.symbolic_tensor(x, f"L['arg{i}']", dynamic[i], declared)
    gm.meta["shape_env"] = env
    return gm, env


class Counting:
    """Counts compiled ATen graphs, checks that none fell back to eager ops."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, inputs):
        compiled = kiln_inductor.compile_aten_graph(gm, inputs)
        assert compiled.stats["fallbacks"] == [], compiled.stats["fallbacks"]
        assert compiled.stats["kernels"] >= 1
        self.graphs.append(compiled)
        return compiled


def recording(backend):
    """Make ``backend`` keep every KernelSource it generates in ``backend.sources``."""
    backend.sources = []
    generate = backend.codegen_kernel

    def codegen_kernel(group, buffers):
        src = generate(group, buffers)
        backend.sources.append(src)
        return src

    backend.codegen_kernel = codegen_kernel
    return backend


def launchers(compiled) -> list:
    """The kernel launchers of a compiled ATen graph (its wrapper's globals)."""
    names = compiled._call.__globals__
    return [v for k, v in names.items() if k.startswith("kernel_")]
