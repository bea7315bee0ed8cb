"""Side effects replayed after the graph: input lists/dicts, object attributes, globals."""

from corpus import T, case

COUNTER = 0
CACHE = {}


class State:
    def __init__(self):
        self.value = None
        self.calls = 0


@case(args=lambda: (T(3), []))
def append_to_input_list(x, out):
    out.append(x * 2)
    out.append(x + 1)
    return x


@case(args=lambda: (T(3), {}))
def store_into_input_dict(x, d):
    d["double"] = x * 2
    d["n"] = 3
    return x


@case(args=lambda: (T(3), State()))
def set_object_attribute(x, s):
    s.value = x * 2
    s.calls = s.calls + 1
    return s.value + 1


@case()
def write_global(x):
    global COUNTER
    COUNTER = COUNTER + 1
    return x * COUNTER


@case()
def mutate_global_dict(x):
    CACHE["last"] = x + 1
    return x


@case(args=lambda: (T(3), [1, 2]))
def list_in_place_ops(x, lst):
    lst[0] = 10
    lst.pop()
    return x * sum(lst)


@case(graphs=2, breaks=1, args=lambda: (T(3), []))
def side_effect_before_break(x, out):
    out.append(x * 2)
    print("break")
    out.append(x * 3)
    return x


@case(args=lambda: (T(3),))
def tensor_inplace_on_input(x):
    x.mul_(2)
    return x + 1


@case(args=lambda: (T(3), T(3)))
def copy_into_input(x, dst):
    dst.copy_(x * 3)
    return dst


@case(args=lambda: (T(3), State()))
def read_after_write_attribute(x, s):
    s.value = x + 1
    return s.value * 2


@case(graphs=1, breaks=1, args=lambda: (T(3), [T(3), T(3)]))
def pop_then_break(x, lst):
    first = lst.pop(0)
    print("break")
    return first * x, lst


@case(graphs=0, args=lambda: (T(3), [T(3)]))
def return_old_item_of_mutated_list(x, lst):
    old = lst[0]
    lst[0] = x
    return old, lst


@case(args=lambda: (T(3), {"k": T(3)}))
def dict_value_moved_between_keys(x, d):
    d["j"] = d.pop("k")
    d["k"] = x * 2
    return d
