"""Objects whose class overrides ``__getattribute__`` (transformers' configs map aliases
through ``attribute_map`` and read through ``super().__getattribute__``): reads of missing
attributes raise the trace's AttributeError, guarded absent (variables/objects.py,
``_DefaultGetattributeVar`` and ``ObjectVar._real_getattr``)."""

import warnings

import pytest
import torch
from helpers import CountingBackend, assert_same

import kiln_capture


class Config:
    attribute_map = {"n": "layers"}

    def __init__(self):
        self.layers = 2

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def _with_default(x, cfg):
    return x + getattr(cfg, "output_cross_attentions", 3) + cfg.n


def test_getattr_default_is_guarded_absent():
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(_with_default)
    cfg, x = Config(), torch.randn(2)
    assert_same(fn(x, cfg), _with_default(x, cfg))
    assert_same(fn(x, cfg), _with_default(x, cfg))
    assert len(backend.graphs) == 1
    cfg.output_cross_attentions = 10  # now present: the compiled default would be wrong
    assert_same(fn(x, cfg), _with_default(x, cfg))
    assert len(backend.graphs) == 2


def test_missing_attribute_of_the_override_frame_raises_as_eager():
    # HF: the config's __getattribute__ called from eager code (a frame of its own) for a
    # name the config lacks; it was an internal error and ran eagerly
    kiln_capture.reset()
    fn = kiln_capture.optimize(CountingBackend())(Config.__getattribute__)
    cfg = Config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs eagerly" warning
        for _ in range(2):
            with pytest.raises(AttributeError, match="'Config' object has no attribute 'nope'"):
                fn(cfg, "nope")
        assert fn(cfg, "n") == 2
    assert kiln_capture.stats()["eager_frames"] == 0
    cfg.nope = 5
    assert fn(cfg, "nope") == 5
