"""Generators and ``@contextlib.contextmanager`` managers in captured code: iterated
lazily (their bodies interleave with the consumer, side effects in order), ``yield
from`` with return values, ``send``; managers whose setup and teardown are traced into
the graph, nested, inside inlined functions, around grad modes; and the graph breaks
that remain (a break in the block enters the real manager in Python)."""

import contextlib
import itertools

import torch
from torch import nn

from corpus import T, case
from corpus.withs import scope


def scaled(x, n):
    for i in range(n):
        yield x * i


def logged(x, log, n):
    for i in range(n):
        log.append(("yield", i))
        yield x + i
    log.append(("done", n))


def counter():
    i = 0
    while True:
        yield i
        i += 1


def inner(x):
    got = yield x
    yield x + 1
    return got


def outer(x):
    r = yield from inner(x)
    yield x * 10
    return r


@contextlib.contextmanager
def grad_off():
    with torch.no_grad():
        yield


@contextlib.contextmanager
def offset(x, k):
    yield x + k  # setup makes a tensor the block uses


@case()
def for_over_generator(x):
    s = x
    for v in scaled(x, 3):
        s = s + v
    return s


@case()
def list_tuple_sum_of_generator(x):
    return list(scaled(x, 2)), tuple(scaled(x, 3)), sum(scaled(x, 4))


@case()
def generator_side_effects_interleave(x):
    log = []
    out = []
    for v in logged(x, log, 3):
        log.append("body")
        out.append(v * 2)
    return out, log


@case()
def endless_generator_zipped(x):
    return [x * c for _, c in zip(range(3), counter())]


@case()
def endless_generator_broken_out_of(x):
    for c in counter():
        if c == 3:
            break
        x = x + c
    return x


@case()
def next_and_default(x):
    g = scaled(x, 2)
    a = next(g)
    b = next(g)
    c = next(g, None)
    return a, b, c


@case()
def yield_from_with_return_value(x):
    def both(x):
        r = yield from outer(x)
        yield r

    return list(both(x))


@case()
def yield_from_a_list(x):
    def flat(x):
        yield from [x, x + 1]
        yield from (x * 2, x * 3)

    return list(flat(x))


@case()
def send_into_generator(x):
    def acc(x):
        total = x
        while True:
            v = yield total
            total = total + v

    g = acc(x)
    next(g)
    g.send(x * 2)
    return g.send(x * 3)


@case()
def generator_expression_and_comprehension(x):
    parts = [x * i for i in range(3)]
    return sum(p.sum() for p in parts), max(i * 2 for i in range(4))


@case()
def generator_closing_over_locals(x):
    k = 3

    def by_k(n):
        for i in range(n):
            yield x * (i + k)

    return torch.stack(list(by_k(2)))


@case()
def generator_method_of_module(x):
    return _MODULE(x)


class _Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def layers(self):
        yield self.a
        yield self.b

    def forward(self, x):
        for layer in self.layers():
            x = layer(x).relu()
        return x


_MODULE = _Layers()


@case()
def itertools_over_generator(x):
    head = list(itertools.islice(scaled(x, 5), 2))
    odd = list(itertools.islice(counter(), 1, 6, 2))
    pairs = [a * b for a, b in zip(itertools.count(1), scaled(x, 3))]
    return head, odd, pairs, list(enumerate(map(torch.sin, scaled(x, 2)), 1))


@case()
def contextmanager_traced(x):
    log = []
    y = x * 2
    with scope(log, "g") as tag:
        y = y + len(tag)
    return y * 3, log


@case()
def contextmanager_nested(x):
    log = []
    with scope(log, "outer"), scope(log, "inner") as t:
        y = x * len(t)
        with scope(log, "deep"):
            y = y + 1
    return y, log


@case(args=lambda: (T(3, 3, grad=True),))
def contextmanager_around_no_grad(x):
    with grad_off():
        y = x * 2
    return y, y.requires_grad, x * 3


@case()
def contextmanager_yielding_a_tensor(x):
    with offset(x, 2) as shifted:
        y = shifted * shifted
    return y


@case()
def contextmanager_in_inlined_function(x):
    log = []

    def helper(x):
        with scope(log, "helper"):
            return x.sin()

    return helper(x) + 1, log


@case()
def contextmanager_return_inside_block(x):
    log = []
    with scope(log, "r"):
        return x * 2, log


@case()
def contextmanager_in_loop(x):
    log = []
    for i in range(3):
        with scope(log, i):
            x = x + i
    return x, log


@case()
def contextmanager_in_module_forward(x):
    return _SCOPED(x)


class _Scoped(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        log = []
        with scope(log, "fwd"):
            h = self.lin(x)
        return h, log


_SCOPED = _Scoped()


@case()
def contextmanager_made_before_the_with(x):
    log = []
    cm = scope(log, "early")
    log.append("made")
    with cm as tag:
        y = x + len(tag)
    return y, log


@case(graphs=3, breaks=3)  # the with (entered in Python), the print, the real __exit__
def contextmanager_with_break_in_block(x):
    log = []
    y = x * 2
    with scope(log, "g"):
        y = y + 1
        print("inside a traced generator context manager")
        y = y.cos()
    return y, log


@case(graphs=2, breaks=1)
def break_inside_loop_over_generator(x):
    g = scaled(x, 3)
    a = next(g)
    print("between items")  # the rest of the generator is handed on as its items
    return a + sum(g)


@case(graphs=2, breaks=1)  # its teardown sets the state after the graph: the next rand breaks
def fork_rng_around_random_ops(x):
    y = x * 2
    with torch.random.fork_rng():
        y = y + torch.rand(4, 4)
    return y + torch.rand(4, 4)
