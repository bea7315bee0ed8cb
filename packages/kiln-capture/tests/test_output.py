"""Which callables the graph records as calls and which the trace inlines (output.py's
``is_torch_callable``)."""

import types

import numpy as np
import torch
from helpers import CountingBackend, assert_same

import kiln_capture


def _user_module(name: str) -> types.ModuleType:
    # a user's module whose name merely begins with "torch" (torch_utils.py, torchish.py)
    mod = types.ModuleType(name)
    exec(
        "def double(t):\n    return t * 2\ndef helper(t, fn):\n    return fn(t).sin() + 1\n",
        mod.__dict__,
    )
    return mod


def test_function_of_a_module_named_like_torch_is_inlined():
    mod = _user_module("torch_helpers_of_user")

    def fn(x):
        # recorded as one graph call, the helper would be opaque to the backend
        return mod.helper(x, mod.double) * 3

    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(fn)
    x = torch.randn(4)
    assert_same(opt(x), fn(x))
    assert len(backend.graphs) == 1
    nodes = backend.graphs[0].graph.nodes
    targets = [n.target for n in nodes if n.op in ("call_function", "call_method")]
    assert mod.helper not in targets
    assert "sin" in targets


def _with_numpy_numbers(a, info):
    return (
        a + info.max,
        a * np.int64(3),
        a - np.float32(0.5),
        a + np.finfo(np.float64).eps + np.iinfo(np.int16).max,
    )


def test_numpy_numbers_are_python_numbers_in_the_graph():
    """np.finfo(...).max read from an argument, np.int64(3) made in the trace: constants
    (guarded by value), handed to ops as the Python numbers they hold (the graph's code
    printed ``np.float64(...)``, a name it cannot resolve)."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_with_numpy_numbers)
    a = torch.randn(3)
    for info in (np.finfo(np.float16), np.finfo(np.float16), np.finfo(np.float32)):
        assert_same(opt(a, info), _with_numpy_numbers(a, info))
    assert len(backend.graphs) == 2  # a new max recompiles


def _batched(x):
    x = x.clone()
    y = torch.vmap(torch.Tensor.acos_)(x)  # in place, per row
    return torch.vmap(torch.sum)(x) * 2, y is x


def test_a_vmapped_torch_function_is_called_as_itself():
    """torch.vmap(torch.sum) is a function named like torch.sum: the graph calls it, not
    torch.sum (which summed the whole tensor: a silently wrong result)."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_batched)
    x = torch.rand(4, 3)
    assert_same(opt(x), _batched(x))
    assert len(backend.graphs) == 1


def _batched_pair(y, z):
    a, b = y.clone(), z.clone()

    def g(p, q, k=2.0):
        return p.acos_(), q * k + scale  # scale: a global read when g runs

    c, d = torch.vmap(g)(a, b)
    return c, d, a is c, b is d, c is d


scale = 1.5


def test_a_vmapped_function_defined_in_the_frame_is_one_graph():
    """torch.vmap(g) of a nested function of two arguments with no cells: the graph calls
    the transform of g; an in-place result is its input, as in eager."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_batched_pair)
    y, z = torch.rand(4, 2), torch.rand(4, 10)
    assert_same(opt(y, z), _batched_pair(y, z))
    assert_same(opt(y, y), _batched_pair(y, y))
    assert len(backend.graphs) == 2  # y, y: other sizes


def _batched_lambda(x):
    return torch.vmap(lambda row: row * 2 + row.sum())(x)


def test_a_vmapped_lambda_is_one_graph():
    """The graph names the call after the function: a lambda's "<lambda>" is no name FX
    can write (an internal error ran the frame eagerly)."""
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_batched_lambda)
    x = torch.rand(4, 3)
    assert_same(opt(x), _batched_lambda(x))
    assert len(backend.graphs) == 1


def _limits(a, kind):
    return a + np.finfo(kind).max


def test_numpy_dtypes_and_finfo_are_constants_guarded_by_dtype():
    backend = CountingBackend()
    opt = kiln_capture.optimize(backend, fullgraph=True)(_limits)
    a = torch.zeros(3, dtype=torch.float64)
    same_dtype = [np.dtype(np.float32), np.ones(1, np.float32).dtype, "float32", np.float32]
    for kind in [*same_dtype, np.finfo(np.float32)]:
        assert_same(opt(a, kind), _limits(a, kind))
    assert len(backend.graphs) == 4  # the dtype, the string, the type, the finfo
    assert_same(opt(a, np.dtype(np.float16)), _limits(a, np.dtype(np.float16)))
    assert len(backend.graphs) == 5


class _ThroughLayers(torch.autograd.Function):
    """An autograd.Function taking a list of modules and a flag beside its tensor."""

    @staticmethod
    def forward(ctx, x, layers, flag):
        for layer in layers:
            x = layer(x)
        return x * 2 if flag else x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def test_a_call_with_a_class_or_module_argument_runs_eagerly_not_into_the_graph():
    # FX spells arguments by repr: ``[Linear(...)]`` and ``<class ...>`` are not code
    layers = [torch.nn.Linear(4, 4)]

    def fn(x):
        return _ThroughLayers.apply(x.cos(), layers, True) + 1

    backend = CountingBackend()
    x = torch.randn(3, 4)
    out = kiln_capture.optimize(backend)(fn)(x)
    assert_same(out, fn(x))
    assert backend.graphs and kiln_capture.stats()["eager_frames"] == 0
    for gm in backend.graphs:
        assert "Linear(" not in gm.code and "<class" not in gm.code


def test_a_torch_query_of_global_state_is_guarded():
    # evaluated while capturing: another state must recompile, not take the old branch
    def fn(x):
        if torch.are_deterministic_algorithms_enabled():
            x = x + 1
        return x.to(torch.get_default_dtype()) * 2

    backend = CountingBackend()
    opt = kiln_capture.optimize(backend)(fn)
    x = torch.randn(4)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        for flag in (False, True, False):
            torch.use_deterministic_algorithms(flag)
            assert_same(opt(x), fn(x))
        torch.set_default_dtype(torch.float64)
        assert_same(opt(x), fn(x))
    finally:
        torch.set_default_dtype(torch.float32)
        torch.use_deterministic_algorithms(before)
    assert len(backend.graphs) == 3
    assert kiln_capture.stats()["eager_frames"] == 0
