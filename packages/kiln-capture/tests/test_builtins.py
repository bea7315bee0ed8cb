"""Builtins and operators answered in the trace (variables/builtins.py): their answers are
constants baked into the graph, so each must be eager's."""

import functools

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
