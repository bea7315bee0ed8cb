"""The cyclic collector is off while a frame is captured and compiled (gc_pause.py), back
as it was afterwards, and left alone with KILN_CAPTURE_GC_PAUSE=0."""

import gc
import threading

import torch
from helpers import CountingBackend

import kiln_capture
from kiln_capture import gc_pause
from kiln_capture.config import config


class SeesCollector(CountingBackend):
    """Records whether automatic collection was on when each graph was compiled."""

    def __init__(self) -> None:
        super().__init__()
        self.enabled: list[bool] = []

    def __call__(self, gm, example_inputs):
        self.enabled.append(gc.isenabled())
        return super().__call__(gm, example_inputs)


def _add_one(x):
    return torch.sin(x) + 1


def _compiled_once(backend) -> None:
    kiln_capture.reset()
    f = kiln_capture.optimize(backend)(_add_one)
    x = torch.randn(3)
    torch.testing.assert_close(f(x), _add_one(x))


def test_collector_off_while_capturing_and_back_on_after():
    assert gc.isenabled()
    b = SeesCollector()
    _compiled_once(b)
    assert b.enabled == [False]
    assert gc.isenabled()


def test_switch_off_leaves_the_collector_alone(monkeypatch):
    monkeypatch.setattr(config, "gc_pause", False)
    b = SeesCollector()
    _compiled_once(b)
    assert b.enabled == [True]
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off():
    gc.disable()
    try:
        _compiled_once(SeesCollector())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_nested_and_concurrent_pauses_restore_once_the_last_ends():
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with gc_pause.paused():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with gc_pause.paused():
        t.start()
        entered.wait(10)
        with gc_pause.paused():
            assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread's pause still runs
    release.set()
    t.join(10)
    assert gc.isenabled()
