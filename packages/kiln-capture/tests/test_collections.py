"""``collections.Counter``, ``collections.deque`` and lists indexed by a tensor of known
value (containers.py: ``CounterVar``, ``DequeVar``, ``known_index``), made in the trace or
passed in: each program runs eagerly and captured on random inputs; results, the
arguments (a container passed in and changed is written back, as the caller sees it)
and raised exceptions equal, one graph, no break, no frame run eagerly.

PYTEST_DONT_REWRITE"""

import collections

import pytest
import torch
from helpers import CountingBackend, assert_same, clone_args

import kiln_capture

PROGRAMS = []


def program(make=None, graphs=1, breaks=0):
    def register(fn):
        args = make or (lambda: (torch.randn(4, 4),))
        PROGRAMS.append(pytest.param(fn, args, graphs, breaks, id=fn.__name__))
        return fn

    return register


# -- Counter --------------------------------------------------------------------------------


@program()
def counter_counts_and_missing_keys(x):
    c = collections.Counter("mississippi")
    missing = c["z"]  # 0, and not added
    c["s"] += 1
    del c["nope"]  # Counter's del ignores a missing key
    return x * c["s"] + missing, len(c), "z" in c, c.most_common(2), sorted(c.elements())


@program()
def counter_update_subtract_and_ties(x):
    c = collections.Counter(a=2, b=2)
    c.update(["c", "c", "a"])
    c.update({"b": 1})
    c.subtract(["a"] * 5)
    return x + c.total(), c.most_common(), dict(c)


@program()
def counter_arithmetic(x):
    p = collections.Counter(a=3, b=1, c=0)
    q = collections.Counter(a=1, b=2, d=4)
    n = collections.Counter(a=-2, b=4)
    return (
        x * len(p + q),
        p + q,
        p - q,
        p | q,
        p & q,
        p == collections.Counter(a=3, b=1),
        +n,
        -n,
    )


@program()
def counter_iteration_and_views(x):
    c = collections.Counter(["x", "y", "x"])
    out = x
    for k, n in c.items():
        out = out + n * len(k)
    return out, list(c), list(c.values())


@program(make=lambda: (torch.randn(3), collections.Counter(a=1, b=5)))
def counter_passed_in_is_updated(x, c):
    c["a"] += 2
    c.update("bcc")
    return x * c["b"]


@program()
def counter_of_tensors_updated(x):
    c = collections.Counter(w=x)
    c.update({"w": x * 2, "v": x})  # counts are added in the graph
    c.subtract(w=x)
    return c["w"], c["v"], list(c)


@program()
def counter_of_tensors_as_values(x):
    c = collections.Counter({"w": x})  # a mapping's values are taken as they are
    return c["w"] * 2, c["none"]


# -- deque ----------------------------------------------------------------------------------


@program()
def deque_both_ends(x):
    d = collections.deque([x, x + 1])
    d.append(x + 2)
    d.appendleft(x - 1)
    d.extend([x * 2, x * 3])
    d.extendleft([x * 4])
    first, last = d.popleft(), d.pop()
    d.rotate(2)
    return first + last, len(d), list(d), d[0], d[-1]


@program()
def deque_maxlen_evicts(x):
    d = collections.deque(maxlen=3)
    for i in range(5):
        d.append(x * i)
    d.appendleft(x - 1)
    return list(d), d.maxlen, len(d)


@program()
def deque_index_count_remove(x):
    d = collections.deque([1, 2, 3, 2])
    n = d.count(2) + d.index(3)
    d.remove(2)
    d[0] = 7
    del d[1]
    d.insert(1, 9)
    return x + n, list(d), 9 in d


@program()
def deque_mutated_while_iterated(x):
    d = collections.deque([x, x + 1])
    try:
        for t in d:
            d.append(t)
    except RuntimeError as e:
        return x + len(d), str(e)
    return x, ""


@program()
def deque_pop_empty_caught(x):
    d = collections.deque()
    try:
        d.pop()
    except IndexError as e:
        return x - 1, str(e)
    return x, ""


@program(make=lambda: (torch.randn(3), collections.deque([1, 2], maxlen=3)))
def deque_passed_in_is_changed(x, d):
    d.append(3)
    d.append(4)  # evicts 1
    d.appendleft(0)  # evicts 4
    return x * d[-1] + len(d)


@kiln_capture.disable
def _eager_step(t):
    return t + 1


# the loop's head breaks too (next() in Python); the body's continuation is compiled for
# v = 1, v = 2, then with v symbolic: later iterations reuse it
@program(make=lambda: (torch.randn(3), collections.deque([1, 2])), graphs=3, breaks=6)
def deque_passed_in_then_loop_breaks(x, d):
    d.append(3)  # written back after each graph: not a mutation the iterator sees
    out = []
    for v in d:
        out.append(_eager_step(x) * v)
    return out


# -- lists indexed by a tensor of known value -----------------------------------------------


@program()
def list_index_by_constant_tensors(x):
    items = [x, x + 1, x + 2]
    i, j = torch.as_tensor(1), torch.tensor([2])
    return items[i], items[j], (10, 20, 30)[torch.tensor(-1)], i * x


def _index_after_inplace(x):
    items = [x, x + 1, x + 2]
    i = torch.as_tensor(0)
    i.add_(2)  # the recorded value no longer holds: no index is assumed
    return items[i]


def _index_by_input(x, i):
    return [x, x * 2][i]


# -- dicts keyed by tensors, defaultdicts passed in, fromkeys, update ----------------------


@program()
def dict_keyed_by_tensors(x):
    w = x * 2
    d = {"a": 1, x: w, w: 3}
    d[x] = d[x] + 1  # the same key
    y = x.mul_(1)  # x itself
    return d[y], d[w], x in d, (x + 1) in d, len(d), [k is x for k in d]


@program()
def fromkeys_and_update_with_pairs(x):
    d = dict.fromkeys(["a", "b"], x)
    od = collections.OrderedDict.fromkeys(("c",), 2)
    dd = collections.defaultdict.fromkeys("ab")
    d.update([("c", x + 1), ["a", 3]])
    d.update(zip("de", [x, x * 2]), f=4)
    return d, od, dict(dd), dd.default_factory is None


@pytest.mark.parametrize("fn,make,graphs,breaks", PROGRAMS)
def test_program(fn, make, graphs, breaks):
    torch.manual_seed(0)
    args = make()
    eager_args, captured_args = clone_args(args), clone_args(args)
    expected = fn(*eager_args)
    report = kiln_capture.explain(fn)(*captured_args)
    assert_same(report.result, expected)
    assert_same(captured_args, eager_args, "args")
    assert (report.graph_count, report.break_count) == (graphs, breaks), str(report)
    assert report.eager_frames == []
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(fn)
    compiled(*clone_args(args))
    n = len(backend.graphs)
    warm_args = clone_args(args)
    assert_same(compiled(*warm_args), expected)
    assert_same(warm_args, eager_args, "args")
    assert len(backend.graphs) == n
    assert kiln_capture.stats()["eager_frames"] == 0


@pytest.mark.parametrize(
    "fn,args",
    [
        (_index_after_inplace, lambda: (torch.randn(3),)),
        (_index_by_input, lambda: (torch.randn(3), torch.tensor(1))),
    ],
)
def test_unknown_index_values_break_and_stay_right(fn, args):
    """A tensor whose value the trace does not know is read eagerly: a break, never a
    wrong index."""
    a = args()
    report = kiln_capture.explain(fn)(*clone_args(a))
    assert_same(report.result, fn(*clone_args(a)))
    assert report.break_count >= 1


def test_deque_passed_in_changes_reach_the_caller_each_call():
    compiled = kiln_capture.optimize(CountingBackend())(deque_passed_in_is_changed)
    for _ in range(2):
        x = torch.randn(3)
        mine, theirs = collections.deque([1, 2], maxlen=3), collections.deque([1, 2], maxlen=3)
        assert_same(compiled(x, mine), deque_passed_in_is_changed(x, theirs))
        assert mine == theirs and mine.maxlen == theirs.maxlen


class _Tracker:
    def __init__(self):
        self.counts = collections.Counter()


def _count_calls(x, tracker):
    tracker.counts["calls"] += 1
    tracker.counts.update(["x", "y"])
    return x + tracker.counts["calls"]


def test_counter_on_an_object_counts_every_call():
    """Counts that change each call become symbolic sizes after a recompile: update and
    subtract still run in the trace (no break), the object's counter ends as eager's."""
    mine, theirs = _Tracker(), _Tracker()
    compiled = kiln_capture.optimize(CountingBackend())(_count_calls)
    for _ in range(4):
        x = torch.randn(2)
        assert_same(compiled(x, mine), _count_calls(x, theirs))
        assert mine.counts == theirs.counts and list(mine.counts) == list(theirs.counts)
    assert kiln_capture.stats()["breaks"] == 0
    assert kiln_capture.stats()["eager_frames"] == 0


def _update_keyed_by_weight(x, dd, weight):
    dd["new"] = x + 1
    dd[weight] = dd[weight] + 10  # written back under the same key object
    return dd["missing"], x * dd[weight], len(dd)


def test_defaultdict_passed_in_with_a_tensor_key():
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(2, 2))
    x = torch.randn(2, 2)
    eager_dd = collections.defaultdict(list, {"seen": 1, weight: 2})
    dd = collections.defaultdict(list, {"seen": 1, weight: 2})
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend, fullgraph=True)(_update_keyed_by_weight)
    for _ in range(3):  # the second call sees new keys (a recompile), the third hits
        assert_same(compiled(x, dd, weight), _update_keyed_by_weight(x, eager_dd, weight))
        assert [k is weight for k in dd] == [k is weight for k in eager_dd]
        assert_same(list(dd.values()), list(eager_dd.values()))
    assert len(backend.graphs) == 2
