"""kiln_cpp.compile_fx: kiln-inductor's compile_fx with the C++ backend registered."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.fx

import kiln_inductor


def compile_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """Compile a torch-level or ATen-level FX graph of CPU tensors into a callable
    (DESIGN.md contract 1: usable as ``torch.compile(fn, backend=kiln_cpp.compile_fx)``)."""
    return kiln_inductor.compile_fx(gm, example_inputs)
