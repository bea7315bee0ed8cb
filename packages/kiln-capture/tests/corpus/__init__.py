"""The capture corpus: small programs with their expected graph and break counts.

Each program is registered with ``@case(graphs=, breaks=, args=)``; test_corpus.py runs
every one eagerly and captured (a backend that runs the graph as given) and compares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

CASES: list[Case] = []


@dataclass
class Case:
    fn: Callable
    args: Callable[[], tuple]
    graphs: int
    breaks: int
    name: str

    def __repr__(self) -> str:
        return self.name


def T(*shape, dtype=torch.float32, grad=False):
    t = (
        torch.randn(*shape, dtype=dtype)
        if dtype.is_floating_point
        else torch.randint(0, 5, shape, dtype=dtype)
    )
    return t.requires_grad_(grad) if grad else t


def case(graphs: int = 1, breaks: int = 0, args: Callable[[], tuple] | None = None):
    def register(fn):
        make = args if args is not None else (lambda: (T(4, 4),))
        CASES.append(
            Case(fn, make, graphs, breaks, f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}")
        )
        return fn

    return register
