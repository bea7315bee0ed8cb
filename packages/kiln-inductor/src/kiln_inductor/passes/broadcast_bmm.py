"""Batched matmuls whose right operand is one matrix broadcast over the batch become one
``mm`` (a graph pass before lowering).

ATen's ``matmul`` folds a 3-D-or-more left operand into rows of one ``mm`` only when its
strides allow a view; otherwise (a permuted activation, HF ConvNeXt's ``Linear`` over an
(N, H, W, C) permute of an NCHW convolution output, as traced) it expands the weight over
the batch (stride 0) and calls ``bmm``: 64 small (32, 96) @ (96, 384) products instead of
one (2048, 96) @ (96, 384), at a fraction of the library's throughput (ConvNeXt on CPU:
38 ms of bmm per call where the same products as mm take 16 ms). kiln lays the operand out
itself (a computed value is realized contiguous), so nothing keeps it from folding.

    bmm(a, b)  with b of shape (B, K, N) and batch stride 0
      -> view(mm(reshape(a, [B*M, K]), select(b, 0, 0)), [B, M, N])

Before: ``bmm`` nodes, some with a batch-broadcast right operand. After: those are ``mm``
on the batch folded into rows, read through a ``view`` of the batched shape; values,
dtypes and output strides are unchanged (both give a contiguous (B, M, N)).
"""

from __future__ import annotations

import torch
import torch.fx

from .node_builder import NodeBuilder, finish_pass, traced_tensor

aten = torch.ops.aten


def _foldable(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (
        a is not None
        and b is not None
        and a.dim() == 3
        and b.dim() == 3
        and a.shape[0] > 1
        and b.stride(0) == 0
        and a.dtype == b.dtype
    )


def fold_broadcast_bmm(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``bmm`` with a batch-broadcast right operand as one ``mm`` (module docstring);
    returns how many were folded."""
    folded = 0
    graph = gm.graph
    for bmm in list(graph.nodes):
        if bmm.op != "call_function" or bmm.target is not aten.bmm.default or bmm.kwargs:
            continue
        a, b = bmm.args
        av, bv, out = traced_tensor(a), traced_tensor(b), traced_tensor(bmm)
        if out is None or not _foldable(av, bv):
            continue
        batch, m, k = av.shape
        add = NodeBuilder(graph, bmm)
        rows = add(aten.reshape.default, a, [batch * m, k])
        mm = add(aten.mm.default, rows, add(aten.select.int, b, 0, 0))
        view = add(aten.view.default, mm, list(out.shape))
        if view.meta["val"].stride() != out.stride():  # never expected: keep the bmm
            add.undo()
            continue
        bmm.replace_all_uses_with(view)
        graph.erase_node(bmm)
        folded += 1
    return finish_pass(gm, folded, f"{folded} bmm(s) with a broadcast operand folded into mm")
