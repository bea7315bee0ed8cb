"""Which callables the graph records as calls and which the trace inlines (output.py's
``is_torch_callable``)."""

import types

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
