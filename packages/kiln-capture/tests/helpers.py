"""Test helpers: a backend that runs graphs as given and counts them; deep comparison."""

from __future__ import annotations

import copy
import dataclasses

import torch


class CountingBackend:
    """The backend protocol, running each captured graph eagerly as given."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        self.example_inputs.append(example_inputs)
        return gm.forward


def clone_args(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            c = a.detach().clone().requires_grad_(a.requires_grad)
            out.append(c)
        elif isinstance(a, torch.nn.Module):
            out.append(a)
        else:
            out.append(copy.deepcopy(a))
    return tuple(out)


def assert_same(actual, expected, path="out"):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual)}"
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
            f"{path}: {actual.shape} {actual.dtype} vs {expected.shape} {expected.dtype}"
        )
        assert actual.requires_grad == expected.requires_grad, f"{path}: requires_grad"
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), (
            f"{path}: {actual!r}"
        )
        for k in expected:
            assert_same(actual[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, list | tuple):
        assert type(actual) is type(expected) and len(actual) == len(expected), (
            f"{path}: {type(actual)} {actual!r}"
        )
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]")
    elif dataclasses.is_dataclass(expected):
        assert type(actual) is type(expected)
        for f in dataclasses.fields(expected):
            assert_same(getattr(actual, f.name), getattr(expected, f.name), f"{path}.{f.name}")
    elif (
        hasattr(expected, "__dict__")
        and not isinstance(expected, type)
        and type(expected).__module__ not in ("builtins", "torch")
    ):
        assert type(actual) is type(expected)
        assert_same(vars(actual), vars(expected), path)
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
