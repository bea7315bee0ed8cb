"""Calls: user functions, keyword/default/varargs, closures, lambdas, methods, classes."""

import functools

import torch

from corpus import case


def helper(x, y=2.0):
    return x * y


def varargs_helper(*xs, scale=1.0, **extra):
    total = sum(xs)
    for _k, v in extra.items():
        total = total + v
    return total * scale


def recursive_helper(x, n):
    if n == 0:
        return x
    return x + 1


def make_adder(k):
    def add(x):
        return x + k

    return add


ADD3 = make_adder(3.0)


class Scaler:
    def __init__(self, s):
        self.s = s

    def __call__(self, x):
        return x * self.s

    def apply(self, x):
        return self.twice(x) + self.s

    def twice(self, x):
        return x * 2

    @property
    def double_s(self):
        return self.s * 2

    @staticmethod
    def static_fn(x):
        return x - 1

    @classmethod
    def cls_fn(cls, x):
        return x + len(cls.__name__)


SCALER = Scaler(1.5)


class Point:
    def __init__(self, a, b):
        self.a = a
        self.b = b

    def total(self):
        return self.a + self.b


class Base:
    def f(self, x):
        return x + 1


class Child(Base):
    def f(self, x):
        return super().f(x) * 2


CHILD = Child()


@case()
def call_helper(x):
    return helper(x) + helper(x, 3.0) + helper(x, y=4.0)


@case()
def call_varargs(x):
    return varargs_helper(x, x, scale=2.0, extra=x)


@case()
def call_closure_global(x):
    return ADD3(x)


@case()
def local_closure(x):
    k = 2.0

    def inner(y):
        return y * k

    return inner(x)


@case()
def lambda_local(x):
    f = lambda y: y + 1
    return f(x) * 2


@case()
def nested_closure_mutating_cell(x):
    total = [x]

    def push(v):
        total.append(v)

    push(x * 2)
    return total


@case()
def callable_object(x):
    return SCALER(x)


@case()
def object_methods(x):
    return SCALER.apply(x) + SCALER.double_s + Scaler.static_fn(x) + Scaler.cls_fn(x)


@case()
def construct_plain_object(x):
    p = Point(x, x * 2)
    return p.total()


@case()
def super_call(x):
    return CHILD.f(x)


@case()
def partial_call(x):
    return functools.reduce(lambda a, b: a + b, [x, x, x])


@case(graphs=0)
def recursion_base_case(x):
    return recursive_helper(x, 0)


@case()
def deep_inline(x):
    def a(v):
        return b(v) + 1

    def b(v):
        return c(v) * 2

    def c(v):
        return v - 3

    return a(x)


@case()
def kwargs_only(x):
    def f(*, alpha, beta=1.0):
        return x * alpha + beta

    return f(alpha=2.0)


@case()
def default_tensor_free_args(x):
    def f(v, dims=(0,), keep=False):
        return v.sum(dim=dims, keepdim=keep)

    return f(x), f(x, (1,), True)


@case()
def method_on_tensor_via_class(x):
    return torch.Tensor.add(x, 1)


@case()
def generator_expression_sum(x):
    return sum(x * i for i in range(3))


@case()
def getattr_dynamic_name(x):
    name = "relu"
    return getattr(torch, name)(x)


@case()
def builtin_type_checks(x):
    return x * (int is int) + x * callable(len)


@case()
def nonlocal_counter(x):
    count = 0

    def inc():
        nonlocal count
        count += 1

    inc()
    inc()
    return x * count


class SuperAfterBreak(Base):
    def f(self, x):
        y = x * 2
        print("break before a zero-argument super()")
        return super().f(y)


_SAB = SuperAfterBreak()


@case(graphs=2, breaks=2)
def zero_arg_super_after_break(x):
    return _SAB.f(x)
