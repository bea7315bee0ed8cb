"""Grad-mode contexts: no_grad, enable_grad, set_grad_enabled."""

import torch

from corpus import T, case


def _g():
    return (T(3, 3, grad=True),)


@case(args=_g)
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y + x, y.requires_grad


@case(args=_g)
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
    return a, b, a.requires_grad, b.requires_grad


@case(args=_g)
def set_grad_enabled_ctx(x):
    with torch.set_grad_enabled(False):
        y = x + 1
    return y


@case(args=_g)
def is_grad_enabled_query(x):
    with torch.no_grad():
        flag = torch.is_grad_enabled()
    return x * 2, flag


@case(args=_g)
def grad_flag_propagates(x):
    y = x.detach()
    z = y * x
    return z, z.requires_grad


@torch.no_grad()
def _decorated_no_grad(x):
    return x * 2


@case(args=_g)
def no_grad_decorator(x):
    y = _decorated_no_grad(x)
    return y + x, y.requires_grad


@case(args=_g)
def set_grad_enabled_function_call(x):
    prev = torch.is_grad_enabled()
    with torch.set_grad_enabled(not prev):
        y = x * 3
    return y, y.requires_grad


@case(args=lambda: (T(4, 4), T(4, 4)))
def autocast_region(x, w):
    y = x + 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = y @ w
    return z.float() * 2, z.dtype


@case(args=lambda: (T(4, 4, grad=True), T(4, 4)))
def autocast_nested_disabled_with_no_grad(x, w):
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        a = torch.relu(x @ w)
        with torch.autocast("cpu", enabled=False), torch.no_grad():
            b = a.float() @ w
        c = torch.softmax(a @ b.to(a.dtype), -1)
    return a, b, c, b.requires_grad


@case(graphs=2, breaks=1, args=lambda: (T(4, 4), T(4, 4)))
def autocast_break_in_region(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        n = int(a.sum().float().abs().item() > 0)
        b = a @ w * n
    return a, b, b @ b
