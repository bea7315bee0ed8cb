"""Python objects the trace models (variables/objects.py)."""

import collections
import functools
import operator

import pytest
import torch
from helpers import CountingBackend, assert_same

import kiln_capture


def _add_sin(a, b):
    return torch.sin(a) + b


@pytest.mark.parametrize(
    "attr",
    [
        "func",
        "args",
        "keywords",
        "__call__",
        "__doc__",
        "__eq__",
        "__dict__",
        "__name__",
        "__code__",
        "__defaults__",
        "__wrapped__",
    ],
)
def test_hasattr_of_a_partial_made_in_the_trace(attr):
    def fn(t):
        p = functools.partial(_add_sin, b=t)
        return p(t) if hasattr(p, attr) else torch.zeros_like(t)

    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(fn)
    t = torch.randn(3)
    assert_same(opt(t), fn(t))
    assert len(backend.graphs) == 1


def test_partial_fields_read_in_the_trace():
    def fn(t):
        p = functools.partial(_add_sin, t, b=2.0)
        return p.func(*p.args, **p.keywords) + len(p.keywords), p.__call__()

    opt = kiln_capture.optimize(CountingBackend(), fullgraph=True)(fn)
    t = torch.randn(3)
    assert_same(opt(t), fn(t))


class _Entries(collections.OrderedDict):  # adds nothing to OrderedDict
    pass


def test_plain_dict_subclass_made_in_the_trace():
    def fn(x):
        d = _Entries(sample=x + 1, other=2)
        d["late"] = x * 2
        return d, type(d) is _Entries, list(d)

    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(fn)
    x = torch.randn(3)
    assert_same(opt(x), fn(x))
    assert len(backend.graphs) == 1


def _tf32_branch(x):
    if torch.backends.cuda.matmul.allow_tf32:  # a __getattr__ of torch.backends
        return x.sin() + 1
    return x.cos() - 1


def test_backend_flag_is_read_and_guarded():
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_tf32_branch)
    x = torch.randn(3)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for flag in (False, True, False):
            torch.backends.cuda.matmul.allow_tf32 = flag
            assert_same(opt(x), _tf32_branch(x))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert len(backend.graphs) == 2


class _CGetter:  # a property whose getter is a C callable (as pybind11 classes have)
    flag = property(operator.attrgetter("_flag"))

    def __init__(self, flag):
        self._flag = flag


def _by_flag(x, holder):
    return torch.cos(x) if holder.flag else torch.sin(x)


def test_property_with_a_c_getter_is_read_and_guarded():
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_by_flag)
    x = torch.randn(3)
    for flag in (True, False, True):
        assert_same(opt(x, _CGetter(flag)), _by_flag(x, _CGetter(flag)))
    assert len(backend.graphs) == 2


def _normal_log_prob(x):
    normal = torch.distributions.Normal(x, torch.tensor(1))
    independent = torch.distributions.Independent(normal, 1)
    return independent.log_prob(x)


def test_distribution_objects_are_traced_and_their_validation_flag_guarded():
    """torch.distributions is traced as Python over tensor ops; the class flag
    Distribution._validate_args, read through the new object, is guarded: turned on, the
    code recompiles and raises eager's ValueError on invalid parameters."""
    Distribution = torch.distributions.Distribution
    before = Distribution._validate_args
    try:
        Distribution.set_default_validate_args(False)
        backend = CountingBackend()
        opt = kiln_capture.optimize(backend, fullgraph=True)(_normal_log_prob)
        x = torch.randn(4, 10)
        assert_same(opt(x), _normal_log_prob(x))
        assert len(backend.graphs) == 1
        Distribution.set_default_validate_args(True)
        lenient = kiln_capture.optimize(CountingBackend())(_normal_log_prob)
        with pytest.raises(ValueError, match="Expected parameter loc"):
            lenient(torch.full((2, 3), float("nan")))
    finally:
        Distribution.set_default_validate_args(before)


class _Flagged:
    scale = 2

    def __init__(self, x):
        self.x = x


def _scaled_by_class_flag(x):
    return x * _Flagged(x).scale


def test_class_constant_read_through_a_new_object_is_guarded():
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_scaled_by_class_flag)
    x = torch.randn(3)
    try:
        assert_same(opt(x), _scaled_by_class_flag(x))
        _Flagged.scale = 5
        assert_same(opt(x), _scaled_by_class_flag(x))
        assert len(backend.graphs) == 2
    finally:
        _Flagged.scale = 2


class _Output(collections.OrderedDict):
    """A dict subclass reading itself through items() and keys() (transformers' ModelOutput)."""

    def __getitem__(self, k):
        if isinstance(k, str):
            return {key: v for key, v in self.items()}[k]
        return self.to_tuple()[k]

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


def test_views_of_a_dict_subclass_are_read_in_the_trace_and_their_keys_guarded():
    def fn(out):
        total = out["a"] * out[1]
        for k, v in out.items():
            total = total + v.sum() * len(k)
        return total + sum(v.mean() for v in out.values())

    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(fn)
    first = _Output(a=torch.randn(4), bb=torch.randn(4))
    assert_same(opt(first), fn(first))
    other = _Output(a=torch.randn(4), bb=torch.randn(4))
    assert_same(opt(other), fn(other))
    assert len(backend.graphs) == 1
    third = _Output(a=torch.randn(4), ccc=torch.randn(4), bb=torch.randn(4))
    assert_same(opt(third), fn(third))  # other keys: the guard fails, a new graph
    assert len(backend.graphs) == 2


class _Reordered(collections.OrderedDict):
    def keys(self):  # overridden: values() and items() stay OrderedDict's own
        return super().keys()


def test_views_of_an_ordered_dict_subclass_follow_its_own_order():
    def fn(x, d):
        y = x * 0
        for i, v in enumerate(d.values()):
            y = y + (x * v).sin() * (i + 1)
        return y + sum(k * v for k, v in d.items())

    d = _Reordered()
    d[2], d[3] = 4.0, 5.0
    d.move_to_end(2)  # OrderedDict's order only: dict.keys(d) still says (2, 3)
    x = torch.randn(4)
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(fn)
    assert_same(opt(x, d), fn(x, d))
    d.move_to_end(3)
    assert_same(opt(x, d), fn(x, d))
    assert len(backend.graphs) == 2


class _Config(dict):
    """A dict subclass used as a config (attribute access on top)."""

    __getattr__ = dict.get


def test_iteration_len_and_get_of_a_dict_subclass_passed_in():
    cfg = _Config(scale=2.0, shift=1.0)

    def fn(x):
        for key in cfg:
            x = x * len(key)
        return x * cfg.get("scale", 3.0) + cfg.get("bias", 0.5) + len(cfg) + cfg.shift

    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(fn)
    x = torch.randn(4)
    assert_same(opt(x), fn(x))
    cfg["bias"] = -1.0  # a new key: the guards fail, a new graph
    assert_same(opt(x), fn(x))
    assert len(backend.graphs) == 2
