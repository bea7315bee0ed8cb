"""``copy.deepcopy`` in captured code (variables/objects.py, ``deepcopy_var``): containers
are copied in the trace; a plain-data object (a config) is copied while capturing, its
state guarded, and the private copy written for real (``setattr``/``delattr``)."""

import copy

import torch
from helpers import CountingBackend, assert_same

import kiln_capture


class Config:
    def __init__(self):
        self.layers = 2
        self.scale = 0.5
        self.names = {"a": 1}
        self.decoder_layers = 3


def _use_copy(x, cfg):
    c = copy.deepcopy(cfg)
    c.scale = c.scale * 2
    del c.decoder_layers
    c.names["b"] = 2
    return x * c.scale + c.layers + len(c.names) + hasattr(c, "decoder_layers")


def test_config_copy_is_one_graph_and_leaves_the_original():
    cfg = Config()
    x = torch.randn(3)
    report = kiln_capture.explain(_use_copy)(x, cfg)
    assert (report.graph_count, report.break_count) == (1, 0), str(report)
    assert_same(report.result, _use_copy(x, Config()))
    assert vars(cfg) == vars(Config())


def test_changing_the_original_recompiles():
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(_use_copy)
    cfg = Config()
    x = torch.randn(3)
    assert_same(fn(x, cfg), _use_copy(x, cfg))
    assert_same(fn(x, cfg), _use_copy(x, cfg))
    assert len(backend.graphs) == 1
    cfg.names["z"] = 0  # a nested change: the copy would differ
    assert_same(fn(x, cfg), _use_copy(x, cfg))
    assert len(backend.graphs) == 2


def test_containers_are_copied_in_the_trace():
    def f(x, items):
        c = copy.deepcopy(items)
        c[0].append(x * 2)
        return c, items

    report = kiln_capture.explain(f)(torch.randn(2), [[1], {"k": (2, 3)}])
    assert (report.graph_count, report.break_count) == (1, 0), str(report)
    assert report.result[1] == [[1], {"k": (2, 3)}]


def test_copy_escaping_breaks_instead_of_sharing():
    def f(x, cfg):
        return x + 1, copy.deepcopy(cfg)

    fn = kiln_capture.optimize(CountingBackend())(f)
    cfg = Config()
    first = fn(torch.randn(2), cfg)[1]
    second = fn(torch.randn(2), cfg)[1]
    assert first is not second and vars(first) == vars(cfg)
    # the copy would leave captured code: the frame runs eagerly, with that reason named
    report = kiln_capture.explain(f)(torch.randn(2), cfg)
    assert any("leaving it" in e for e in report.eager_frames), report


def test_deepcopy_of_a_tensor_is_a_clone_in_the_graph():
    def f(x):
        items = [x, {"k": x}]
        c = copy.deepcopy(items)
        c[0].add_(1)  # the copy is one tensor, apart from x
        return c[1]["k"], c[0] is c[1]["k"], x

    x = torch.randn(3, 4)
    expected = f(x.clone())
    report = kiln_capture.explain(f)(x.clone())
    assert (report.graph_count, report.break_count) == (1, 0), str(report)
    assert_same(report.result, expected)


def test_deepcopy_of_tensors_that_may_share_storage_breaks():
    def f(x, y):
        a, b = copy.deepcopy((x, y))  # deepcopy keeps views of one storage sharing a copy
        a.add_(1)
        return a, b

    x = torch.randn(4)
    t = x.clone()
    expected = f(t, t[:2])
    t = x.clone()
    report = kiln_capture.explain(f)(t, t[:2])
    assert report.break_count >= 1
    assert_same(report.result, expected)


def _copy_of_a_copy(x, cfg):
    # HF Whisper: its decoder copies the config, sets num_hidden_layers, and DynamicCache's
    # get_text_config(decoder=True) copies that copy again
    first = copy.deepcopy(cfg)
    first.layers = first.decoder_layers
    second = copy.deepcopy(first)
    second.names["c"] = 3
    return x * second.layers + len(second.names) + len(first.names) + cfg.layers


def test_copy_of_a_copy_is_one_graph():
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(_copy_of_a_copy)
    x = torch.randn(3)
    report = kiln_capture.explain(_copy_of_a_copy)(x, Config())
    assert (report.graph_count, report.break_count) == (1, 0), str(report)
    cfg = Config()
    assert_same(fn(x, cfg), _copy_of_a_copy(x, Config()))
    assert vars(cfg) == vars(Config())
    cfg.decoder_layers = 5  # the original's guard covers what the second copy holds
    assert_same(fn(x, cfg), _copy_of_a_copy(x, cfg))
    assert len(backend.graphs) == 2


def test_copy_of_a_copy_holding_an_object_with_no_value_equality_breaks():
    def f(x, cfg):
        first = copy.deepcopy(cfg)
        first.hook = object()  # a copy of it would not compare equal: not plain data
        return x + len(vars(copy.deepcopy(first)))

    x = torch.randn(3)
    report = kiln_capture.explain(f)(x, Config())
    assert report.break_count >= 1
    assert_same(report.result, f(x, Config()))
