"""torch.utils._pytree is traced as user code (issue #17): tree_flatten, tree_unflatten,
tree_map and tree_leaves over lists, tuples, dicts, namedtuples and None, with TreeSpec
objects read from the frame or built in the trace; no break, results equal eager."""

import collections

import torch
from helpers import CountingBackend, assert_same
from torch.utils import _pytree as pytree

import kiln_capture

Pair = collections.namedtuple("Pair", "a b")


def _run(f, *args, graphs=1):
    report = kiln_capture.explain(f)(*args)
    assert report.break_count == 0, report
    assert report.graph_count == graphs, report
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(f)
    for _ in range(2):
        assert_same(fn(*args), f(*args))
    assert len(backend.graphs) == graphs


def test_tree_unflatten_of_a_spec_read_from_the_frame():
    # the OpInfo sweep's case function: tensors put back into a flattened sample
    x, y = torch.randn(3), torch.randn(3)
    leaves, spec = pytree.tree_flatten((x, (y, 0.5), {"alpha": 2}))

    def f(a, b):
        values = list(leaves)
        values[0], values[1] = a, b
        inp, args, kwargs = pytree.tree_unflatten(values, spec)
        return torch.add(inp, args[0], **kwargs) * args[1]

    _run(f, x, y)


def test_tree_flatten_map_and_leaves_build_specs_in_the_trace():
    def f(x, y):
        leaves, spec = pytree.tree_flatten({"a": [x, (y, None)], "b": Pair(x, 2)})
        tree = pytree.tree_unflatten(leaves, spec)
        out = pytree.tree_map(lambda t: t * 2 if isinstance(t, torch.Tensor) else t, tree)
        return out["a"][0] + out["b"].a, len(leaves), pytree.tree_leaves(out), out["b"]

    _run(f, torch.randn(3), torch.randn(3))
