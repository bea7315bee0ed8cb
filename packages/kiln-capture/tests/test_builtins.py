"""Builtins and operators answered in the trace (variables/builtins.py): their answers are
constants baked into the graph, so each must be eager's."""

import functools
import operator
from collections.abc import MutableMapping
from typing import Any, NamedTuple

import pytest
import torch
from helpers import CountingBackend, assert_same

import kiln_capture


class _Plain:
    pass


class _WithCall:
    def __call__(self):
        return 1


def _scaled_if_callable(x, arg):
    return x * 2 if callable(arg) else x - 1


@pytest.mark.parametrize(
    "arg",
    [_Plain(), _WithCall(), 3, 2.5, [1, 2], (1,), {"a": 1}, _Plain, len, functools.partial(max)],
    ids=lambda a: type(a).__name__,
)
def test_callable_is_eagers_answer(arg):
    fn = kiln_capture.optimize(CountingBackend(), fullgraph=True)(_scaled_if_callable)
    x = torch.randn(3)
    assert_same(fn(x, arg), _scaled_if_callable(x, arg))


def test_callable_of_a_tensor_and_a_module():
    fn = kiln_capture.optimize(CountingBackend(), fullgraph=True)(_scaled_if_callable)
    x = torch.randn(3)
    assert_same(fn(x, torch.randn(2)), _scaled_if_callable(x, torch.randn(2)))
    assert_same(fn(x, torch.nn.ReLU()), _scaled_if_callable(x, torch.nn.ReLU()))


def _identities(x):
    y = x.mul_(2)  # in-place: returns x itself
    z = x.clone()
    w = z.add_(1)
    return (
        x * 1,
        y is x,
        x is y,
        w is z,
        w is x,
        x.clone() is x,
        x.float() is x,  # already float32: x itself
        x.double() is x,
        x.t() is x,
    )


def test_is_of_tensors_follows_in_place_results():
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend, fullgraph=True)(_identities)
    x = torch.randn(3, 2)
    assert_same(fn(x.clone()), _identities(x.clone()))
    assert len(backend.graphs) == 1


class _Store(MutableMapping):
    """A mapping of the user's: dict(store) reads keys() and store[k]."""

    def __init__(self, **entries):
        self._entries = dict(entries)

    def __getitem__(self, key):
        return self._entries[key]

    def __setitem__(self, key, value):
        self._entries[key] = value

    def __delitem__(self, key):
        del self._entries[key]

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)


def test_dict_of_a_user_mapping_and_its_keys_view():
    store = _Store(w=torch.randn(3), b=torch.randn(3))

    def fn(x):
        copied = dict(store)
        return x * copied["w"] + copied["b"], list(copied), len(set(store.keys()))

    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(fn)
    x = torch.randn(3)
    assert_same(opt(x), fn(x))
    assert len(backend.graphs) == 1


def test_jit_annotate_is_its_value():
    def fn(x):
        return torch.jit.annotate(Any, x + 1) * 2

    opt = kiln_capture.optimize(CountingBackend(), fullgraph=True)(fn)
    x = torch.randn(3)
    assert_same(opt(x), fn(x))


class _Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor

    def total(self):
        return self.first + self.second

    @staticmethod
    def one():
        return 1

    @classmethod
    def name(cls):
        return cls.__name__


@functools.lru_cache
def _cached_sin(x, scale):
    return torch.sin(x * scale)


def _small_programs(x):
    pair = _Pair(x, x * 2)
    return (
        sum(3 * [x]),  # list repetition with the count on the left
        operator.is_(-10, x),
        operator.is_not(x, x),
        f"{x.__class__.__name__}!",
        _cached_sin(x, 2),  # an lru_cache'd function on tensors: the function runs
        pair.total(),
        pair.one(),
        pair.name(),
    )


def test_small_programs():
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_small_programs)
    x = torch.randn(3)
    assert_same(opt(x), _small_programs(x))
    assert_same(opt(x + 1), _small_programs(x + 1))
    assert len(backend.graphs) == 1


def _array_methods(x):
    a = (x + 1).numpy()  # a break: the rest works on a numpy array
    return a.copy(), a.reshape([1, a.size]), a.transpose(0, 1)


def test_numpy_array_methods_after_a_break_do_not_crash_the_capture():
    """Deciding whether ``a.copy`` is a builtin compared the array with modules by ``==``
    (elementwise: ValueError, an internal error, the frame ran eagerly)."""
    import numpy as np

    opt = kiln_capture.optimize(CountingBackend())(_array_methods)
    x = torch.randn(2, 3)
    for got, expected in zip(opt(x), _array_methods(x)):
        assert type(got) is np.ndarray and np.array_equal(got, expected)
    assert kiln_capture.stats()["eager_frames"] == 0


@pytest.mark.parametrize(
    "cast, value, dtype",
    [
        (float, 1, torch.int64),
        (float, 2**53 + 1, torch.int64),  # rounds to nearest, as float(int) does
        (float, -7, torch.int32),
        (float, True, torch.bool),
        (int, True, torch.bool),
        (int, 3, torch.int64),
        (float, 1.5, torch.float32),
    ],
)
def test_float_and_int_of_a_one_element_tensor_are_graph_values(cast, value, dtype):
    def f(x):
        y = x + 0 if dtype != torch.bool else x.logical_not().logical_not()
        return cast(y), y

    backend = CountingBackend()
    fn = kiln_capture.optimize(backend, fullgraph=True)(f)
    x = torch.tensor([value], dtype=dtype)
    got, want = fn(x), f(x)
    assert type(got[0]) is type(want[0]) and got[0] == want[0]
    assert_same(got[1], want[1])
    assert len(backend.graphs) == 1


def _clamped(a, b):
    c = a + b
    a, b = a.sum(), b.sum()
    a = min(max(a, 0), 1)  # an int or the tensor itself, as the values say
    return max([c]), a


def test_max_of_tensors_is_one_graph_and_keeps_eagers_answer():
    """max(t, 0) returns t itself or the int 0, known only from t's value: the graph computes
    it as torch.clamp, and the value returned is eager's own (max() run on the graph's sum)."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_clamped)
    for a in (torch.full((3,), -1.0), torch.full((3,), 0.1), torch.full((3,), 2.0)):
        got, want = opt(a, torch.ones(3)), _clamped(a, torch.ones(3))
        assert type(got[1]) is type(want[1])
        assert_same(got[0], want[0])
        if isinstance(want[1], int):
            assert got[1] == want[1]
        else:
            assert_same(got[1], want[1])
    assert len(backend.graphs) == 1
    assert kiln_capture.stats()["eager_frames"] == 0


def _min_max_arithmetic(a, b):
    c = a + b
    a, b = a.sum(), b.sum()
    a = min(max(a, 0), 1)
    b = max(0, min(1, b))
    return max(a, b) - min(a, b) + c, max(c.sum() * 0.0 + 0.5, b, 0.25)


@pytest.mark.parametrize("seed", range(4))
def test_min_max_of_tensors_in_arithmetic_is_one_graph(seed):
    torch.manual_seed(seed)
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_min_max_arithmetic)
    a, b = torch.randn(10, 10), torch.randn(10, 10)
    got, want = opt(a, b), _min_max_arithmetic(a, b)
    assert_same(got[0], want[0])
    assert type(got[1]) is type(want[1]) and float(got[1]) == float(want[1])
    assert len(backend.graphs) == 1
    assert "clamp" in backend.graphs[0].code and "maximum" in backend.graphs[0].code


def _max_then_written(a):
    m = max(a.sum(), 0)
    m.add_(1)
    return m


def _max_then_method(a, b):
    m = max(a.sum(), 0)
    return m.abs() if isinstance(m, torch.Tensor) else m, max(a.sum(), b.sum()).abs()


def test_writing_into_max_of_tensors_breaks():
    """eager writes into whichever item max() picked: not a graph value."""
    report = kiln_capture.explain(_max_then_written)(torch.randn(3))
    assert report.breaks and "in-place add_()" in report.breaks[0].detail


def test_methods_of_max_of_a_tensor_and_a_number_break_and_are_right():
    """max(t, 0) may be the int 0 in eager: its methods and type are eager's to answer;
    max() of two tensors is a tensor either way."""
    opt = kiln_capture.optimize(CountingBackend())(_max_then_method)
    for value in (-1.0, 1.0):
        a, b = torch.full((3,), value), torch.randn(3)
        assert_same(opt(a, b), _max_then_method(a, b))
    report = kiln_capture.explain(_max_then_method)(torch.randn(3), torch.randn(3))
    assert "isinstance() of the result of max()" in report.breaks[0].detail


def test_max_of_a_many_element_tensor_keeps_eagers_error():
    def f(a):
        return max(a, 0)

    opt = kiln_capture.optimize(CountingBackend())(f)
    with pytest.raises(RuntimeError, match="ambiguous"):
        opt(torch.randn(3))


def _contains(x, listlike):
    x.add_(1)
    s = listlike([x])
    return 1 in s, 2 not in s, x * 2


@pytest.mark.parametrize("listlike", [list, tuple, set])
def test_constant_in_a_list_of_tensors_is_eagers_bool(listlike):
    """``1 in [t]`` is eager's ``bool(t == 1)``: a graph value read from the graph's
    outputs as a Python bool, no break (a set compares by hash: never equal)."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_contains)
    for value in (torch.randn(1), torch.zeros(1), torch.ones(1)):
        x, y = value.clone(), value.clone()
        got, want = opt(x, listlike), _contains(y, listlike)
        assert got[:2] == want[:2] and all(type(g) is bool for g in got[:2])
        assert_same(got[2], want[2])
        assert_same(x, y)
    assert len(backend.graphs) == 1


def _branch_on_contains(x):
    if 1 in [x]:
        return x + 1
    return x - 1


def test_branch_on_constant_in_a_list_of_tensors_breaks_and_is_right():
    opt = kiln_capture.optimize(CountingBackend())(_branch_on_contains)
    for value in (torch.zeros(1), torch.ones(1)):
        assert_same(opt(value), _branch_on_contains(value))
    report = kiln_capture.explain(_branch_on_contains)(torch.ones(1))
    assert report.breaks[0].kind is kiln_capture.breaks.TENSOR_BRANCH


class _NoStr:
    pass


def _described(x, given):
    made = _NoStr()
    return x + 1, str(made), repr(given), str(given)


def test_str_of_an_object_with_objects_repr_is_its_address_at_run_time():
    """str(obj) of a class without __str__/__repr__ is "<module.Class object at 0x...>":
    the generated code makes it from the object itself (made in the trace, or the
    argument), so each call's text is that call's object's."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_described)
    x, given = torch.randn(3), _NoStr()
    got, want = opt(x, given), _described(x, given)
    assert_same(got[0], want[0])
    assert got[1].split(" object at ")[0] == want[1].split(" object at ")[0]
    assert got[2] == want[2] == repr(given) and got[3] == want[3] == str(given)
    assert len(backend.graphs) == 1


class _OwnStr:
    def __init__(self, n):
        self.n = n

    def __str__(self):
        return f"own {self.n}"


class _OwnRepr:
    def __repr__(self):
        return "R"


def _described_by_the_class(x):
    return x * 2, str(_OwnStr(3)), str(_OwnRepr()), repr(_OwnRepr())


def test_str_of_an_object_made_in_the_trace_runs_its_classes_str():
    """A class's own __str__ is traced; str() of a class with __repr__ only is its text."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_described_by_the_class)
    x = torch.randn(2)
    assert opt(x)[1:] == _described_by_the_class(x)[1:] == ("own 3", "R", "R")
    assert len(backend.graphs) == 1


def _described_then_read(x):
    return x + 1, str(_NoStr()).startswith("<")


def test_reading_the_text_of_an_address_breaks():
    report = kiln_capture.explain(_described_then_read)(torch.randn(3))
    assert report.result[1] is True
    assert "address is known at run time" in report.breaks[0].detail


def test_slice_builtin_is_a_slice_of_the_trace():
    def fn(x, n):
        return x[slice(n)] + x[slice(1, n)].sum() + x[slice(None, None, 2)].mean()

    backend = CountingBackend()
    x = torch.randn(8)
    out = kiln_capture.optimize(backend, fullgraph=True)(fn)(x, 5)
    assert_same(out, fn(x, 5))
    assert len(backend.graphs) == 1


def test_a_slice_bounded_by_a_tensor_is_not_a_constant():
    # the slice is made in eager code before the compiled frame sees it
    def fn(x, s):
        return x[s] * 2

    x = torch.randn(10)
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(fn)
    for bound in (2, 5):
        s = slice(torch.tensor(bound), None)
        assert_same(opt(x, s), fn(x, s))
    assert kiln_capture.stats()["eager_frames"] == 0
