"""Who reads an FX node's value: library kernels (which read it from memory) or kiln's
own kernels, looking through the ops that only reinterpret memory."""

from __future__ import annotations

import operator

import torch

from ..lowering.extern import ATTENTION_OPS
from ..lowering.registry import EXTERN_OPS

aten = torch.ops.aten

# ops that only reinterpret memory: the values they view go where their users go
VIEWS = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.permute.default,
    aten.transpose.int,
    aten.t.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.select.int,
    aten.slice.Tensor,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.unbind.int,
    aten.alias.default,
    operator.getitem,
}


def only_extern_readers(node: torch.fx.Node) -> bool:
    """Whether only library kernels (and the graph's output) read ``node``'s value."""
    for user in node.users:
        # read by a library kernel (mm, convolution, fused attention), never a kiln kernel
        if user.op == "output" or user.target in EXTERN_OPS or user.target in ATTENTION_OPS:
            continue
        if user.target in VIEWS and only_extern_readers(user):
            continue
        return False
    return True


def has_extern_reader(node: torch.fx.Node) -> bool:
    """Whether a library kernel reads ``node``'s value, directly or through views (it is
    then realized for that kernel whatever else reads it)."""
    for user in node.users:
        if user.op != "call_function":
            continue
        if user.target in EXTERN_OPS or user.target in ATTENTION_OPS:
            return True
        if user.target in VIEWS and has_extern_reader(user):
            return True
    return False


def is_output(node: torch.fx.Node) -> bool:
    """Whether ``node``'s value, directly or through views, is an output of the graph."""
    return any(
        user.op == "output" or (user.target in VIEWS and is_output(user)) for user in node.users
    )
