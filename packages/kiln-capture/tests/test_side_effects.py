"""Side effects replayed after the graph: attribute stores made through
``object.__setattr__`` (a frozen dataclass's ``__init__``) are replayed the same way."""

import dataclasses

import torch
from helpers import CountingBackend, assert_same

import kiln_capture


@dataclasses.dataclass(frozen=True)
class Frozen:
    k: int
    name: str = "f"


def test_frozen_dataclass_init_frame_replays_raw_stores():
    def f(x):
        a = Frozen(2)
        if a == Frozen(2):  # not captured: the frame runs eagerly, Frozen.__init__ is captured
            return x * a.k
        return x

    fn = kiln_capture.optimize(CountingBackend())(f)
    x = torch.randn(3)
    for _ in range(3):
        assert_same(fn(x), f(x))
