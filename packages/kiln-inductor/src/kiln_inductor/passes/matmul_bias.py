"""Bias adds that no kernel would absorb go back into the matmul (a graph pass before
lowering).

kiln-aot writes ``addmm`` as ``mm`` + ``add`` so that the bias add fuses into whatever
pointwise kernel reads the matmul's output (an activation, a residual add, a norm). Where
nothing pointwise reads it, the add becomes a kernel of its own that reads and writes the
whole output: a transformer's qkv projection, whose output is only viewed, split and
permuted into the query, key and value of fused attention, or a projection that goes
straight into another matmul. There the pass writes ``addmm(bias, a, b)`` again, which
cuBLAS (and oneDNN on the CPU) computes with the bias in the matmul's epilogue, as eager
does, and the views are taken of its output: one kernel fewer per such projection.

The add is folded when the matmul's output is read only by it, the bias is a row vector
of the output's width, and every use of the sum, through views, is a matmul, an attention
or convolution op, or a graph output.
"""

from __future__ import annotations

import torch
import torch.fx

from .. import log
from .readers import only_extern_readers

aten = torch.ops.aten


def _row_bias(bias: object, out: torch.Tensor) -> bool:
    val = getattr(bias, "meta", {}).get("val") if isinstance(bias, torch.fx.Node) else None
    return (
        isinstance(val, torch.Tensor)
        and val.dtype == out.dtype
        and tuple(val.shape) in ((out.shape[1],), (1, out.shape[1]))
    )


def fold_matmul_bias(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``add(mm(a, b), bias)`` as ``addmm(bias, a, b)`` where only library kernels
    read the sum (see the module docstring); returns how many were folded."""
    folded = 0
    for add in list(gm.graph.nodes):
        if add.target is not aten.add.Tensor or add.kwargs or len(add.args) != 2:
            continue
        mm = next(
            (a for a in add.args if isinstance(a, torch.fx.Node) and a.target is aten.mm.default),
            None,
        )
        if mm is None or len(mm.users) != 1:
            continue
        bias = add.args[1] if add.args[0] is mm else add.args[0]
        out, mm_val = add.meta.get("val"), mm.meta.get("val")
        if not isinstance(out, torch.Tensor) or not isinstance(mm_val, torch.Tensor):
            continue
        if out.dim() != 2 or out.shape != mm_val.shape or out.dtype != mm_val.dtype:
            continue
        if not _row_bias(bias, out) or not only_extern_readers(add):
            continue
        with gm.graph.inserting_before(add):
            fused = gm.graph.call_function(aten.addmm.default, (bias, *mm.args))
        fused.meta = dict(add.meta)
        add.replace_all_uses_with(fused)
        gm.graph.erase_node(add)
        gm.graph.erase_node(mm)
        folded += 1
    if folded:
        gm.graph.lint()
        gm.recompile()
        log.log(
            "graphs", f"{folded} bias add(s) folded into addmm (only library kernels read them)"
        )
    return folded
