"""``CompiledGraph.call_stealing``: inputs handed over in a list are freed at their last
use in the graph (kiln-aot's backward passes saved activations this way), not when the
call returns; a tuple or a plain call keeps the caller's references, and results are the
same either way."""

from __future__ import annotations

import weakref

import torch

import kiln_cpp  # noqa: F401  (registers the CPU backend)
from kiln_inductor.compile import compile_aten_graph
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten
_ALIVE: list[bool] = []
_WATCHED: list[weakref.ref] = []

# a library op the graph calls after the input's last use: it records whether the input
# is still alive at that point
_lib = torch.library.Library("kiln_test_steal", "DEF")
_lib.define("probe(Tensor x) -> Tensor")


def _probe(x: torch.Tensor) -> torch.Tensor:
    _ALIVE.append(all(r() is not None for r in _WATCHED))
    return x * 3


_lib.impl("probe", _probe, "CPU")
_lib.impl("probe", lambda x: torch.empty_like(x), "Meta")


def _graph(a, b):
    y = aten.mul.Tensor(a, 2.0)
    z = torch.ops.kiln_test_steal.probe(y)
    return (aten.add.Tensor(z, b),)


def _compiled():
    inputs = [torch.randn(64, 64), torch.randn(64, 64)]
    return compile_aten_graph(aten_graph(_graph, inputs), inputs)


def test_a_stolen_input_is_freed_at_its_last_use():
    compiled = _compiled()
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    want = _graph(a, b)[0]
    _WATCHED[:] = [weakref.ref(a)]
    args = [a, b]
    del a
    _ALIVE.clear()
    (out,) = compiled.call_stealing(args)
    assert args == []
    assert _ALIVE == [False]  # `a` was gone before the probe ran
    torch.testing.assert_close(out, want)
    assert compiled.stats["kernels"] >= 1


def test_a_plain_call_keeps_the_callers_inputs():
    compiled = _compiled()
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    _WATCHED[:] = [weakref.ref(a)]
    args = [a, b]
    _ALIVE.clear()
    (out,) = compiled(*args)
    assert len(args) == 2 and _ALIVE == [True]
    torch.testing.assert_close(out, _graph(a, b)[0])
    (again,) = compiled(args)  # a list as the single argument is the caller's: not emptied
    assert len(args) == 2
    torch.testing.assert_close(again, out)


def test_stealing_restrides_an_input_in_the_list():
    compiled = _compiled()
    a, b = torch.randn(64, 64).t(), torch.randn(64, 64)  # transposed: copied to the layout
    want = _graph(a, b)[0]
    _WATCHED[:] = []
    args = [a, b]
    (out,) = compiled.call_stealing(args)
    assert args == []
    torch.testing.assert_close(out, want)
