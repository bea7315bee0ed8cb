"""Writes to a ModelOutput-style record passed in (variables/objects.py, ``RecordVar``):
its class's ``__setattr__``/``__setitem__`` run in the trace, ``super().__setitem__`` (a
dict's C method) and ``object.__setattr__`` are replayed on the caller's object after the
graph. HF runs these methods as frames of their own when their caller runs eagerly."""

import warnings

import pytest
import torch
from helpers import CountingBackend, assert_same

import kiln_capture

transformers = pytest.importorskip("transformers")
from transformers.modeling_outputs import BaseModelOutput  # noqa: E402


def _state(o):
    return dict(o), {k: v for k, v in vars(o).items() if not k.startswith("_")}


def _check(fn, *args):
    kiln_capture.reset()
    x = torch.randn(2, 3)
    got, want = BaseModelOutput(last_hidden_state=x), BaseModelOutput(last_hidden_state=x)
    compiled = kiln_capture.optimize(CountingBackend())(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no frame runs eagerly
        for _ in range(2):
            assert_same(compiled(got, *args), fn(want, *args))
    assert_same(_state(got), _state(want))
    stats = kiln_capture.stats()
    assert (stats["breaks"], stats["eager_frames"]) == (0, 0), stats


def test_model_output_setitem_frame():
    _check(BaseModelOutput.__setitem__, "hidden_states", (torch.ones(2),))


def test_model_output_setattr_frame():
    _check(BaseModelOutput.__setattr__, "attentions", (torch.ones(2),))


def test_model_output_setattr_none_sets_the_attribute_only():
    _check(BaseModelOutput.__setattr__, "attentions", None)


def test_user_writes_to_a_record_passed_in():
    def f(o, y):
        o.hidden_states = (y * 2,)
        o["attentions"] = (y + 1,)
        return o.last_hidden_state + o[0].sum()

    _check(f, torch.randn(3))
