"""Sets and frozensets made in the trace (containers.py: ``SetVar``): constants and objects
the trace knows (modules, classes, functions) as members, ``set()`` / ``frozenset()`` /
displays / comprehensions, every method, ``in``, ``len``, iteration in Python's own
order, and sets returned from the frame. Each program runs eagerly and captured on random
inputs: results and raised exceptions equal, one graph, no break, no frame run eagerly.
The module programs are what ``Module.named_children()`` / ``named_modules()`` do with
their ``memo = set()`` (timm's RegNet iterates ``self.children()`` in forward: 66 graphs
and 6 breaks before sets held modules).

PYTEST_DONT_REWRITE"""

import pytest
import torch
from helpers import CountingBackend, assert_same, clone_args

import kiln_capture

PROGRAMS = []


def program(make=None):
    def register(fn):
        args = make or (lambda: (torch.randn(4, 4),))
        PROGRAMS.append(pytest.param(fn, args, id=fn.__name__))
        return fn

    return register


@program()
def set_of_constants(x):
    s = set()
    s.add(3)
    s.add(1)
    s.add(3)
    s.update([7, 1], (9,))
    s.discard(42)
    t = {1, 2, *range(3, 5)}
    both = s & t
    return x * len(s), sorted(s), sorted(both), sorted(s | t), sorted(s - t), 3 in s, 5 in s


@program()
def set_methods_and_comparisons(x):
    a = {i % 4 for i in range(10)}
    b = frozenset([2, 3, 4])
    c = a.copy()
    c.difference_update({0})
    d = set(b)
    d.symmetric_difference_update({4, 5})
    return (
        x + len(a),
        sorted(a.union(b)),
        sorted(a.intersection(b, {3})),
        sorted(c),
        sorted(d),
        a.issuperset({1, 2}),
        b.issubset(a),
        a.isdisjoint({9}),
        type(b) is frozenset,
        isinstance(a, set),
    )


@program()
def set_iterated_in_python_order(x):
    s = {"k", "a", "z", "q"}
    out = x
    names = []
    for name in s:
        names.append(name)
        out = out + len(name)
    return out, names, sorted(s)


@program()
def set_returned_and_popped(x):
    s = {5, 6}
    s.add(7)
    first = s.pop()
    return x * first, s, frozenset({1, 2})


@program()
def removing_a_missing_member_raises_key_error(x):
    s = {1}
    try:
        s.remove(2)
    except KeyError as e:
        return x + 1, e.args
    return x


@program()
def frozenset_has_no_add(x):
    f = frozenset({1})
    try:
        f.add(2)
    except AttributeError:
        return x - 1
    return x


@program()
def unhashable_member_raises_type_error(x):
    try:
        made = {[1, 2]}
        return made
    except TypeError:
        return x * 3
    return x


class Stage(torch.nn.Module):
    """timm RegNet's RegStage: the blocks are the stage's children, run in order."""

    def __init__(self) -> None:
        super().__init__()
        self.b1 = torch.nn.Linear(4, 4)
        self.act = torch.nn.ReLU()
        self.b2 = torch.nn.Linear(4, 4)
        self.shared = self.b1  # the same module twice: children() yields it once

    def forward(self, x):
        for block in self.children():
            x = block(x)
        return x


def _stage_args():
    torch.manual_seed(0)
    return (Stage(), torch.randn(3, 4))


@program(_stage_args)
def children_of_a_module(stage, x):
    return stage(x)


@program(_stage_args)
def modules_in_a_set(stage, x):
    seen = set()
    for m in stage.modules():
        seen.add(m)
    linear = [m for m in seen if isinstance(m, torch.nn.Linear)]
    return x * len(seen), len(linear), stage.b1 in seen, stage.shared in seen


@program()
def tensors_in_a_set(x):
    y = x.add_(1)  # x itself: the set keeps one member
    s = {x}
    s.add(y)
    t = frozenset(set(s))  # copies hold the same tensors
    z = x * 2
    return len(s), len(t), x in t, z in s, len(s | {z}), x


def _two_sets():
    return (torch.randn(3), {1, 2}, frozenset({"a", "b"}))


@program(_two_sets)
def sets_read_from_the_frame(x, s, f):
    s.add(5)  # written back to the caller's set
    s.discard(1)
    return x * len(s), 2 in s, sorted(f | {"c"}), len(f), sorted(s)


@pytest.mark.parametrize("fn,make", PROGRAMS)
def test_program(fn, make):
    torch.manual_seed(0)
    args = make()
    eager_args, captured_args = clone_args(args), clone_args(args)
    expected = fn(*eager_args)
    report = kiln_capture.explain(fn)(*captured_args)
    assert_same(report.result, expected)
    assert (report.graph_count, report.break_count) == (1, 0), str(report)
    assert report.eager_frames == []
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(fn)
    compiled(*clone_args(args))
    n = len(backend.graphs)
    assert n == 1
    assert_same(compiled(*clone_args(args)), expected)
    assert len(backend.graphs) == n
    assert kiln_capture.stats()["eager_frames"] == 0


def _sizes_in_a_set(x):
    st = set()
    for n in (x.size(0), x.size(0) + 1, x.size(0) + 2):
        st.add(n % 2)
    return x * len(st), st, 1 in st


def test_a_symbolic_size_in_a_set_is_specialized():
    """A set member is a Python int: a symbolic size added to a set takes its value (a
    shape guard keeps it), as a dict key does, instead of breaking the graph."""
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(_sizes_in_a_set)
    for n in (4, 6, 5):
        x = torch.randn(n, 2)
        assert_same(compiled(x), _sizes_in_a_set(x))
    stats = kiln_capture.stats()
    assert stats["breaks"] == 0 and stats["eager_frames"] == 0
    assert len(backend.graphs) == 2  # even sizes, odd sizes


def test_a_changed_child_is_seen():
    """The set's members are the modules themselves: replacing a child recompiles or
    follows it, never runs the old one."""
    torch.manual_seed(0)
    stage, x = _stage_args()
    compiled = kiln_capture.optimize(CountingBackend())(children_of_a_module)
    assert_same(compiled(stage, x), stage(x))
    stage.b2 = torch.nn.Linear(4, 4)
    assert_same(compiled(stage, x), stage(x))
