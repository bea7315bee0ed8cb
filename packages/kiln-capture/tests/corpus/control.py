"""Loops, branches on Python values and shapes, while loops, early returns."""

import torch

from corpus import T, case

FLAG = True
N_LAYERS = 3


@case()
def for_range(x):
    for i in range(3):
        x = x * 2 + i
    return x


@case()
def for_list_of_tensors(x):
    ws = [x, x + 1, x + 2]
    out = torch.zeros_like(x)
    for w in ws:
        out = out + w
    return out


@case()
def while_loop(x):
    i = 0
    while i < 3:
        x = x + 1
        i += 1
    return x


@case()
def break_continue(x):
    for i in range(10):
        if i == 1:
            continue
        if i > 3:
            break
        x = x * (i + 1)
    return x


@case()
def if_on_global_flag(x):
    if FLAG:
        return x + 1
    return x - 1


@case()
def if_on_shape(x):
    if x.shape[0] > 2:
        x = x[:2]
    return x * 2


@case()
def if_on_dtype(x):
    if x.dtype == torch.float32:
        return x.double()
    return x


@case()
def if_none_arg(x, bias=None):
    if bias is not None:
        x = x + bias
    return x * 2


@case(args=lambda: (T(4, 4), T(4)))
def if_not_none_arg(x, bias=None):
    if bias is None:
        return x
    return x + bias


@case()
def isinstance_checks(x):
    out = x
    if isinstance(x, torch.Tensor):
        out = out + 1
    if isinstance(3, (int, float)):
        out = out * 2
    if isinstance(x, list):
        out = out * 100
    return out


@case()
def and_or_shortcircuit(x):
    n = x.shape[0]
    a = n > 2 and n < 10
    b = n < 2 or n == 4
    return x * a + x * b


@case()
def nested_loops(x):
    for i in range(2):
        for j in range(2):
            x = x + i * j
    return x


@case()
def loop_over_layers_global(x):
    for _ in range(N_LAYERS):
        x = torch.tanh(x)
    return x


@case()
def for_else(x):
    for i in range(3):
        if i == 10:
            break
    else:
        x = x * 5
    return x


@case()
def early_return_in_loop(x):
    for i in range(5):
        if i == 2:
            return x * i
    return x


@case()
def not_operator(x):
    empty = []
    if not empty:
        x = x + 1
    return x


@case()
def hasattr_getattr(x):
    if hasattr(x, "shape"):
        x = x * x.ndim
    return x + getattr(x, "missing", 0)


@case()
def assert_true(x):
    assert x.shape[0] == 4, "bad shape"
    return x + 1


@case()
def try_no_exception(x):
    try:
        y = x * 2
    finally:
        y = y + 1
    return y


@case()
def range_step_negative(x):
    for i in range(6, 0, -2):
        x = x + i
    return x


@case()
def while_on_shape(x):
    while x.shape[0] > 1:
        x = x[: x.shape[0] // 2]
    return x
