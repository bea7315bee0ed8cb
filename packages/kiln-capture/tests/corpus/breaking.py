"""Graph breaks: print, tensor-dependent branches, .tolist(), unknown callables, disabled
functions; capture resumes after each. (.item(), nonzero, boolean masks and unique are
graph values sized by unbacked symbols, no break.)"""

import torch
from torch import nn

from corpus import T, case
from kiln_capture import disable


@case(graphs=2, breaks=1)
def print_in_middle(x):
    y = x + 1
    print("shape", y.shape)
    return y * 2


@case(graphs=1, breaks=1)
def print_at_start(x):
    print("start")
    return x * 2


@case(graphs=2, breaks=1)
def tensor_if(x):
    y = x.sum(1)
    if y.sum() > 0:
        return y * 2
    return y - 1


@case(graphs=2, breaks=1, args=lambda: (T(4, 4),))
def tensor_if_both_branches_keep_locals(x):
    a = x * 2
    b = x + 3
    if (a > 100).any():
        c = a
    else:
        c = b
    return c * a


@case(graphs=1, breaks=0)  # data-dependent values are graph values
def item_straight_line(x):
    s = x.sum()
    v = s.item()
    return x * v


@case(graphs=2, breaks=1)
def tolist_then_python(x):
    vals = x[0].tolist()
    return x * len(vals)


@case(graphs=1, breaks=0)  # data-dependent values are graph values
def nonzero_break(x):
    y = x * 2
    idx = torch.nonzero(y > 0)
    return idx.shape[0] * y


@case(graphs=1, breaks=0)  # data-dependent values are graph values
def boolean_mask(x):
    y = x + 1
    picked = y[y > 1]
    return picked * 2


@case(graphs=1, breaks=0)  # data-dependent values are graph values
def unique_break(x):
    y = (x * 3).round()
    u = torch.unique(y)
    return u + 1


@disable
def eager_only(x):
    return x + 100


@case(graphs=2, breaks=1)
def disabled_call(x):
    y = x * 2
    z = eager_only(y)
    return z - 1


@case(graphs=2, breaks=2)
def two_prints(x):
    y = x + 1
    print("a")
    print("b")
    return y * 2


@case(graphs=2, breaks=1)  # a nested break: the callee and this frame resume together
def break_with_live_stack_values(x):
    return x * 2 + helper_print(x)


def helper_print(v):
    print("inside helper")
    return v + 1


@case(graphs=2, breaks=1)  # a nested break: the callee and this frame resume together
def break_in_inlined_function_resumes_in_callee(x):
    y = x * 3
    z = helper_print(y)
    return z * y


@case(graphs=4, breaks=6)
def break_inside_loop_resumes_in_the_loop(x):
    x = x * 2
    for i in range(3):
        x = x + i
        print(i)  # each iteration: a graph before, a continuation re-entering the loop
    return x


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))

    def forward(self, x):
        norms = []
        for i, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            norms.append(x.norm().tolist())  # .tolist() feeding Python, mid-loop
            x = x * (i + 1)
        return x, norms


_STACK = _Stack()


@case(graphs=6, breaks=7, args=lambda: (T(2, 6),))  # the call, each layer, the loop heads
def break_inside_module_list_loop(x):
    return _STACK(x)


@case(graphs=5, breaks=4, args=lambda: ([T(3), T(3)], T(3)))
def break_inside_zip_loop(xs, y):
    out = {}
    for k, (a, b) in enumerate(zip(xs, [y, y * 2])):
        c = a * b
        print(k)
        out[k] = c + 1
    return out, y - 1


@case(graphs=4, breaks=6)  # each iteration starts a continuation (i = 0, 1 specialized)
def break_inside_while_loop(x):
    i = 0
    while i < 3:
        x = x * 1.5
        if x.sum() > 1e9:  # a tensor-dependent branch inside the loop
            x = x / 2
        i += 1
    return x - 1


@case(graphs=6, breaks=7)
def break_inside_inner_loop(x):
    for i in range(2):
        for name in ("a", "b"):
            x = x + i
            if name == "b":
                print(name)
        x = x * 2
    return x


@case(graphs=2, breaks=2, args=lambda: (T(4, 4, grad=True),))
def break_inside_loop_inside_no_grad(x):
    with torch.no_grad():
        for i in range(2):
            x = x * 2
            print(i)
    return x, x.requires_grad


@case(graphs=2, breaks=2)
def break_in_loop_then_loop_exits_early(x):
    for i in range(10):
        x = x + 1
        if i == 1:
            break
        print(i)
    return x * 3


@case(graphs=1, breaks=1, args=lambda: (T(4, 4, grad=True),))
def break_inside_no_grad_block_resumes(x):
    with torch.no_grad():
        y = x * 2
        print("inside no_grad")
    return y


class ItemInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        scale = y.abs().max().tolist()  # a Python float: a break
        return y / scale


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = ItemInForward()
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        h = x * 2
        h = self.inner(h)
        return self.out(h)


_OUTER = Outer().eval()


@case(graphs=4, breaks=3)
def item_in_inlined_submodule_forward(x):
    return _OUTER(x)


@case(graphs=2, breaks=1)
def tensor_while_condition(x):
    y = x * 2
    if y.max() > 1000:
        y = y / 2
    return y + 1


@case(graphs=1, breaks=0)  # float(t) of a float tensor is t.item(): a graph value
def float_of_tensor(x):
    s = float(x.sum())
    return x * s


@case(graphs=2, breaks=1)
def fstring_of_tensor(x):
    msg = f"{x.sum()}"
    return x * len(msg)


@case(graphs=2, breaks=1)
def new_list_shared_by_stack_and_local(x):
    acc = [x * 2]
    acc.append(len(str(print("mutates the list built in the graph"))))
    return acc, x + 1


@case(graphs=2, breaks=1)
def new_dict_alias_survives_break(x):
    d = {"a": x + 1}
    alias = d
    print("break")
    alias["b"] = x * 3
    return d


@case(graphs=2, breaks=1, args=lambda: (T(4, 4, grad=True),))
def break_inside_nested_grad_blocks(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
            print("inside enable_grad inside no_grad")
            c = b + a
        d = c * 2
    return a, b, c, d, x + 1, [t.requires_grad for t in (a, b, c, d)]


@case(graphs=2, breaks=1)
def break_inside_try_block_resumes(x):
    try:
        y = x * 2
        print("inside try")
        y = y + 1
    except ValueError:
        y = x
    finally:
        y = y * 3
    return y


class _AutocastStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(6, 6) for _ in range(2))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for layer in self.layers:
                x = torch.relu(layer(x))
                if x.float().mean() > 100:  # a tensor-dependent branch, each iteration
                    x = x / 2
        return x.float().softmax(-1)


_AC_STACK = _AutocastStack()


@case(graphs=3, breaks=3, args=lambda: (T(3, 6),))
def break_in_loop_inside_autocast(x):
    return _AC_STACK(x)
