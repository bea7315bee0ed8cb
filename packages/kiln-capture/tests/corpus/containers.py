"""Tuples, lists, dicts, sets, comprehensions, unpacking, namedtuples, dataclasses."""

import collections
import dataclasses

import torch

from corpus import T, case

Pair = collections.namedtuple("Pair", ["a", "b"])


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    scale: float = 2.0


@case(args=lambda: ((T(3), T(3)),))
def tuple_input(t):
    a, b = t
    return a + b


@case(args=lambda: ([T(3), T(3), T(3)],))
def list_input(xs):
    return xs[0] * xs[1] - xs[-1]


@case(args=lambda: ({"a": T(3), "b": T(3)},))
def dict_input(d):
    return d["a"] + d["b"]


@case(args=lambda: ({"a": T(3), "b": T(3)},))
def dict_items_loop(d):
    out = 0
    for k, v in d.items():
        out = out + v * len(k)
    return out


@case(args=lambda: ({"a": T(3), "b": T(3)},))
def dict_keys_values(d):
    keys = list(d.keys())
    return sum(d.values()), keys


@case()
def build_dict_output(x):
    return {"double": x * 2, "half": x / 2, "n": 3}


@case()
def list_comprehension(x):
    return [x * i for i in range(4)]


@case()
def dict_comprehension(x):
    return {f"p{i}": x**i for i in range(3)}


@case()
def set_of_constants(x):
    s = {1, 2, 3}
    return x * len(s), (2 in s)


@case()
def nested_comprehension(x):
    return [[x * i + j for j in range(2)] for i in range(2)]


@case()
def star_unpack(x):
    first, *rest = [x, x + 1, x + 2]
    return first, rest


@case()
def star_args_call(x):
    args = (x, 1)
    return torch.add(*args)


@case()
def star_kwargs_call(x):
    kw = {"dim": 0, "keepdim": True}
    return x.sum(**kw)


@case()
def list_methods(x):
    acc = []
    acc.append(x)
    acc.extend([x * 2, x * 3])
    acc.insert(0, x - 1)
    last = acc.pop()
    return acc, last


@case()
def list_concat_and_repeat(x):
    a = [x] + [x * 2]
    b = (x,) * 2
    return a, b


@case()
def tuple_index_slice(x):
    t = (x, x + 1, x + 2, x + 3)
    return t[1:3], t[-1], t[::2]


@case(args=lambda: (Pair(T(3), T(3)),))
def namedtuple_input(p):
    return p.a * p.b


@case()
def namedtuple_output(x):
    return Pair(x, x * 2)


@case(args=lambda: (Batch(T(3), T(3)),))
def dataclass_input(b):
    return b.x * b.scale + b.y


@case()
def dataclass_output(x):
    return Batch(x, x + 1, 3.0)


@case()
def zip_enumerate(x):
    outs = []
    for i, (a, b) in enumerate(zip([x, x * 2], [x * 3, x * 4])):
        outs.append(a * b + i)
    return outs


@case()
def reversed_and_sorted(x):
    order = sorted([3, 1, 2])
    return [x * i for i in reversed(order)]


@case()
def dict_get_setdefault(x):
    d = {"a": x}
    d.setdefault("b", x * 2)
    return d.get("a") + d.get("b") + d.get("c", 0)


@case()
def dict_update_and_pop(x):
    d = {"a": x}
    d.update({"b": x + 1})
    d.update(c=x + 2)
    b = d.pop("b")
    return d, b


@case()
def min_max_constants(x):
    return x * max(2, 3) + min([4, 5, 1])


@case()
def any_all(x):
    flags = [True, False]
    return x * any(flags) + x * all(flags)


@case()
def len_of_containers(x):
    return x * len([1, 2]) + len({"a": 1}) + len((1, 2, 3)) + len(x)


@case()
def in_operator(x):
    keys = ["a", "b"]
    return x * ("a" in keys) + x * ("z" not in keys)


@case()
def map_filter(x):
    vals = list(map(lambda i: x * i, range(3)))
    odd = list(filter(lambda i: i % 2, range(5)))
    return vals, odd


@case()
def nested_structures(x):
    return {"a": [x, (x * 2, {"b": x * 3})]}


@case()
def list_of_shapes(x):
    shapes = [t.shape for t in (x, x.t())]
    return x.reshape(shapes[1][0], -1), shapes


@case()
def torch_size_ops(x):
    s = x.shape
    return x.new_zeros(s[:1] + (2,)), s[-1], tuple(s)


@case()
def swap_unpack(x):
    a, b = x, x * 2
    a, b = b, a
    return a - b


@case()
def chained_compare(x):
    n = x.shape[0]
    return x * (0 < n <= 4)


@case()
def tuple_compare(x):
    return x * (x.shape == (4, 4)), x * (tuple(x.shape) != (1,))


@case()
def string_formatting(x):
    name = f"layer_{x.shape[0]}_{x.dtype}"
    return x * len(name), name.upper()


@case()
def ternary(x):
    n = x.shape[0]
    return x * 2 if n > 2 else x * 3


@case()
def set_built_and_returned(x):
    s = {1, 2}
    s.add(3)
    s.update([4, 5])
    s.discard(1)
    return x * len(s), s, {i % 2 for i in range(4)}
