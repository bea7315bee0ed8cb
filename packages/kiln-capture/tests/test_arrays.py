"""numpy arrays viewing tensors of the trace (variables/arrays.py): ``x.numpy()`` and what
is done with it become torch ops in the graph, with numpy's meaning."""

import numpy as np
import pytest
import torch
from helpers import CountingBackend

import kiln_capture


def _attributes(x):
    a = x.numpy()
    return (
        a.itemsize,
        a.strides,
        a.shape,
        a.ndim,
        a.size,
        torch.from_numpy(a.T),
        torch.from_numpy(a.real),
        torch.from_numpy(a.imag),
    )


def _methods(x):
    a = (x * 2).numpy()
    return a.copy(), a.transpose(0, 1), a.transpose(), a.reshape([1, a.size]), a + a, a - a


def _reductions(x):
    a = x.numpy()
    return a.max(axis=0), a.all(axis=1), a.max()


def _same(got, expected):
    if isinstance(expected, tuple):
        assert type(got) is tuple and len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e)
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected)
    elif isinstance(expected, np.ndarray | np.generic):
        assert type(got) is type(expected) and got.dtype == expected.dtype
        assert np.array_equal(got, expected)
    else:
        assert got == expected and type(got) is type(expected)


def _numpy_functions(x):
    a = x.numpy()
    total = np.sum(np.mean(a, 1))
    return (
        torch.from_numpy(np.asarray(total)),
        np.linalg.norm(a, axis=0),
        np.fft.fftshift(a),
        np.ones_like(x, dtype=np.float64),  # of the tensor itself, as numpy reads it
        np.full_like(x, 2.5, dtype=np.dtype("float")),
        *(torch.from_numpy(g) for g in np.meshgrid(a, (x[0] * 2).numpy())),
    )


@pytest.mark.parametrize("fn", [_attributes, _methods, _reductions, _numpy_functions])
def test_array_programs(fn):
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(fn)
    x = torch.randn(3, 4)
    _same(opt(x), fn(x))
    _same(opt(x + 1), fn(x + 1))
    assert len(backend.graphs) == 1


def test_what_is_not_modeled_breaks():
    def fn(x):
        a = (x + 1).numpy()
        return np.cumsum(a, 1)  # a numpy function not modeled: the call breaks

    x = torch.randn(2, 3)
    report = kiln_capture.explain(fn)(x)
    assert report.break_count >= 1 and report.eager_frames == []
    assert np.allclose(report.result, fn(x))


def _store(a, ind, val):
    a[ind] = val
    return a


@pytest.mark.parametrize(
    "shape,ind,val_shape",
    [((4,), np.s_[...], (4,)), ((2, 2), np.s_[0, ...], (2,)), ((2, 3), np.s_[..., 1], (2,))],
)
def test_write_into_an_array_passed_in(shape, ind, val_shape):
    """``a[...] = v`` on an array argument: numpy's own write, replayed after the graph,
    into the caller's array (returned as itself)."""
    fn = kiln_capture.optimize(CountingBackend(), fullgraph=True)(_store)
    arr, val = np.random.randn(*shape), np.random.randn(*val_shape)
    ref = arr.copy()
    ref[ind] = val
    got = fn(arr, ind, val)
    assert got is arr
    np.testing.assert_array_equal(arr, ref)
    assert kiln_capture.stats()["eager_frames"] == 0


def _store_tensor_then_read(a, x):
    a[0] = (x * 2).sum()
    before = x + 1
    return before, a.sum()


def test_write_of_a_graph_value_into_an_array_then_a_read_breaks():
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(_store_tensor_then_read)
    arr, x = np.random.randn(3), torch.randn(3)
    ref_arr = arr.copy()
    got = fn(arr, x)
    want = _store_tensor_then_read(ref_arr, x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]
    np.testing.assert_array_equal(arr, ref_arr)
    report = kiln_capture.explain(_store_tensor_then_read)(np.random.randn(3), x)
    assert "after writing into it" in report.breaks[0].detail
    assert len(backend.graphs) >= 1


def _basic_indexing(x):
    a = x.numpy()
    outs = []
    for idx in ((None, None), (1, None), (1,), (slice(1, 3),), (Ellipsis, 2), (-1,)):
        assert a[idx].shape == x[idx].shape
        outs.append(a[idx])
    return outs, a[0].ndim, a[0].shape, torch.from_numpy(a[1:3]) * 2


def test_basic_indexing_of_an_array_is_a_view_in_the_graph():
    """``a[1, None]``, ``a[...]``, ``a[1:3]``: torch's indexing of the tensor, numpy's
    meaning; a full integer index is a numpy scalar (shape ``()``)."""
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend, fullgraph=True)(_basic_indexing)
    x = torch.randn(2, 5)
    got, want = fn(x), _basic_indexing(x)
    for g, w in zip(got[0], want[0]):
        assert type(g) is type(w) and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    assert got[1:3] == want[1:3]
    torch.testing.assert_close(got[3], want[3])
    assert len(backend.graphs) == 1
