"""Adversarial programs for live views and iterators (containers.py: ``ListIteratorVar``,
``DictIteratorVar``, ``DictViewVar``) and ``Tensor.type`` in every form: iterators see
what the loop body does to their container as CPython's do (appended items are visited,
a dict that changes size raises RuntimeError), views compare and combine as sets.
Each program runs eagerly and captured, on random inputs: results, arguments and raised
exceptions equal, with the graphs and breaks expected and no frame run eagerly.

PYTEST_DONT_REWRITE"""

import collections

import pytest
import torch
from helpers import CountingBackend, assert_same, clone_args

import kiln_capture

PROGRAMS = []


def program(graphs=1, breaks=0):
    def register(fn):
        PROGRAMS.append(pytest.param(fn, graphs, breaks, id=fn.__name__))
        return fn

    return register


@kiln_capture.disable
def _eager_step(t):
    return t + 1


# -- dicts changing while iterated ---------------------------------------------------------


@program()
def dict_grows_in_loop_caught(x):
    d = {"a": x}
    try:
        for k in d:
            d[k + "b"] = x * 2
    except RuntimeError as e:
        return x + len(d), str(e)
    return x, ""


@program()
def dict_shrinks_in_loop_caught(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    seen = []
    try:
        for k, _v in d.items():
            seen.append(k)
            del d["c"]
    except RuntimeError as e:
        return x * len(seen), str(e), list(d)
    return x, "", list(d)


@program()
def dict_values_replaced_in_loop(x):
    # same size, same keys: no error, and later values are read as they are now
    d = {"a": x, "b": x + 1}
    out = []
    for k in d:
        d["b"] = d["b"] * 3
        out.append(d[k])
    return out


@program()
def dict_view_iterated_while_growing(x):
    d = {"a": x}
    try:
        for v in d.values():
            d["z"] = v
    except RuntimeError as e:
        return x - 1, str(e)
    return x, ""


@program()
def ordered_dict_grows_in_loop(x):
    od = collections.OrderedDict(a=x)
    try:
        for k in od:
            od[k * 2] = x  # after the last key: CPython's OrderedDict iterator just stops
        for k in od:
            od.move_to_end(k)
    except RuntimeError as e:
        return x + 1, str(e), list(od)
    return x * 2, "", list(od)


@program()
def defaultdict_read_in_loop_grows(x):
    dd = collections.defaultdict(int, a=1)
    try:
        for k in dd:
            x = x + dd[k + "!"]  # a missing key's read inserts it
    except RuntimeError as e:
        return x, str(e)
    return x, ""


@program()
def dict_iterator_exhausted_stays_exhausted(x):
    d = {"a": 1}
    it = iter(d)
    first = list(it)
    d["b"] = 2
    return x + len(first), list(it)


# -- lists changing while iterated ---------------------------------------------------------


@program()
def list_loop_sees_appended_items(x):
    items = [x]
    out = []
    for t in items:
        out.append(t * 2)
        if len(items) < 4:
            items.append(t + 1)
    return out, len(items)


@program()
def enumerate_list_sees_appended_items(x):
    items = [x, x * 2]
    total = x
    for i, t in enumerate(items):
        total = total + t * i
        if i == 0:
            items.append(x - 1)
    return total, len(items)


@program()
def iterator_made_before_append(x):
    items = [x]
    it = iter(items)
    items.append(x + 1)
    items.insert(0, x + 2)
    return list(it)


@program()
def list_iterator_after_removal(x):
    items = [x, x + 1, x + 2, x + 3]
    out = []
    for t in items:
        out.append(t)
        if len(out) == 1:
            items.pop(0)  # the iterator skips what moved under it, as CPython's does
    return out


@program()
def exhausted_list_iterator_stays_exhausted(x):
    items = [x]
    it = iter(items)
    a = next(it)
    b = next(it, None)
    items.append(x + 1)
    return a, b is None, next(it, "done")


@program()
def input_list_grows_in_loop(x, items):
    for t in items:
        if len(items) < 3:
            items.append(t * 2)
    return x + len(items)


@program(graphs=1, breaks=2)  # the loop head and the break; the rest is one graph
def list_loop_sees_appends_across_a_break(x):
    items = [x]
    out = []
    for t in items:
        if len(items) == 1:
            t = _eager_step(t)  # a graph break inside the loop
        out.append(t)
        if len(items) < 3:
            items.append(t * 2)
    return out


@program(graphs=3, breaks=6)
def enumerate_list_changed_across_a_break(x):
    items = [1, 2, 3, 4]
    out = []
    for i, v in enumerate(items, start=10):
        out.append(_eager_step(x) * v + i)  # a break each iteration
        if v == 2:
            items.remove(3)  # the enumerate reads the list as it is now
    return out, items


@program()
def reversed_list_shrinking_in_loop(x):
    items = [x, x + 1, x + 2, x + 3, x + 4]
    out = []
    for t in reversed(items):
        out.append(t)
        del items[-2:]  # the reverse iterator's index is past the end: it stops
    return out, len(items)


@program(graphs=4, breaks=8)
def reversed_list_changed_across_a_break(x):
    items = [1, 2, 3, 4]
    out = []
    for v in reversed(items):
        out.append(_eager_step(x) * v)
        if len(items) > 2:
            items.pop()
    return out, items


@program(graphs=3, breaks=6)
def dict_loop_with_a_break(x):
    d = {"a": 1, "b": 2, "c": 3}
    out = []
    for k, v in d.items():  # handed on as its remaining items, read by the continuation
        out.append(_eager_step(x) * v)
        d[k] = v * 10  # same size: no error, as in eager code
    return out, d


@program(graphs=2, breaks=4)
def zip_of_lists_growing_across_a_break(x):
    a, b = [x], [1.0]
    out = []
    for t, k in zip(a, b):
        out.append(_eager_step(t) * k)
        if len(a) < 2:
            a.append(t * 2)
            b.append(3.0)
    return out


@program(graphs=3, breaks=6)
def input_dict_grows_then_loop_breaks(x, d):
    # written back after each graph: the iterator handed on must not see that as a change
    d["new"] = 5
    out = []
    for k in d:
        out.append(_eager_step(x) * d[k])
    return out


# -- views as sets --------------------------------------------------------------------------


@program()
def views_compare_with_sets(x):
    d = {"a": 1, "b": 2}
    checks = [
        d.items() == {("a", 1), ("b", 2)},
        d.items() != {("a", 1)},
        d.keys() == {"a", "b"},
        d.keys() == ["a", "b"],  # not a set: unequal
        {"a", "b"} == d.keys(),
        d.keys() <= {"a", "b", "c"},
        d.values() == d.values(),  # values views compare by identity
    ]
    return x + sum(checks), checks


@program()
def views_set_operations(x):
    d = {"a": 1, "b": 2}
    e = {"b": 3, "c": 4}
    both = d.keys() & e.keys()
    either = d.keys() | ["z"]
    only = d.items() - {("a", 1)}
    return x * len(both), sorted(either), sorted(only), sorted(d.keys() ^ e.keys())


@program()
def view_sees_later_insertions(x):
    d = {"a": 1}
    keys, items = d.keys(), d.items()
    d["b"] = 2
    return x + len(keys), "b" in keys, [k for k, _ in items], items == {("a", 1), ("b", 2)}


# -- Tensor.type ----------------------------------------------------------------------------


@program()
def tensor_type_forms(x):
    return (
        x.type(),
        x.type(torch.float16),
        x.type("torch.DoubleTensor"),
        x.type(torch.HalfTensor),
        x.type(dtype=torch.int32),
        x.double().type(),
        x.type(torch.float32) is x,  # the same type: the tensor itself, as eager
    )


@program()
def tensor_type_in_branch(x):
    if x.type() == "torch.FloatTensor":
        return x.type(torch.DoubleTensor) * 2
    return x


def _args(fn):
    x = torch.randn(4, 4)
    if fn is input_list_grows_in_loop:
        return (x, [1, 2])
    if fn is input_dict_grows_then_loop_breaks:
        return (x, {"a": 1, "b": 2})
    return (x,)


@pytest.mark.parametrize("fn,graphs,breaks", PROGRAMS)
def test_program(fn, graphs, breaks):
    torch.manual_seed(0)
    args = _args(fn)
    eager_args, captured_args = clone_args(args), clone_args(args)
    expected = fn(*eager_args)
    report = kiln_capture.explain(fn)(*captured_args)
    assert_same(report.result, expected)
    assert_same(captured_args, eager_args, "args")
    assert (report.graph_count, report.break_count) == (graphs, breaks), str(report)
    assert report.eager_frames == []
    # warm: a cache hit gives the same answer
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(fn)
    compiled(*clone_args(args))
    n = len(backend.graphs)
    warm_args = clone_args(args)
    assert_same(compiled(*warm_args), expected)
    assert_same(warm_args, eager_args, "args")
    assert len(backend.graphs) == n
    assert kiln_capture.stats()["eager_frames"] == 0


def dict_grows_uncaught(x):
    d = {"a": x}
    for k in d:
        d[k + "!"] = x
    return x


def test_dict_growing_in_loop_raises_as_eager():
    x = torch.randn(3)
    with pytest.raises(RuntimeError) as eager:
        dict_grows_uncaught(x)
    compiled = kiln_capture.optimize(CountingBackend())(dict_grows_uncaught)
    for _ in range(2):  # cold and warm
        with pytest.raises(RuntimeError) as got:
            compiled(x)
        assert str(got.value) == str(eager.value)
    assert kiln_capture.stats()["eager_frames"] == 0
