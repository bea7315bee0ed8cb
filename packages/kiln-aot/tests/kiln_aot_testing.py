"""Helpers shared by kiln-aot's tests (imported by name; conftest puts this folder on sys.path)."""

from __future__ import annotations

import torch

import kiln_aot


class RecordingCompiler:
    """fw/bw compiler that verifies each graph against the contract and runs it eagerly."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list):
        kiln_aot.verify_graph(gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        assert len(placeholders) == len(example_inputs)
        self.graphs.append(gm)
        return gm


def assert_close(actual, expected, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def grads_of(tensors) -> list:
    return [None if t.grad is None else t.grad.clone() for t in tensors]
