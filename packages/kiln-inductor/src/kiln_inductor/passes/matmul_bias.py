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

The same holds where the sum is kept in memory whatever reads it: a graph output (a
forward's pre-activation saved for the backward) or an operand of a library kernel. A
pointwise kernel that adds the bias there reads the matmul's output and writes the sum
besides its own result; with ``addmm`` it reads the sum instead, and one write of the
whole output goes away (HF GPT-2's MLP: the kernel that wrote the saved ``fc(x)`` and
its GELU moved 150 MB per layer at batch 8 x 512, now 100). This second rule is skipped
where the backend fuses matmuls with their epilogues into templates (kiln-triton's
max-autotune): there the matmul's output is never written, and a saved ``addmm`` output
would keep the template away.

The add is folded when the matmul's output is read only by it, the bias is a row vector
of the output's width, and every use of the sum, through views, is a matmul, an attention
or convolution op, or a graph output; or, without templates, when some use of the sum is
one of those.
"""

from __future__ import annotations

import torch
import torch.fx

from .. import log
from .readers import has_extern_reader, is_output, only_extern_readers

aten = torch.ops.aten


def _row_bias(bias: object, out: torch.Tensor) -> bool:
    val = getattr(bias, "meta", {}).get("val") if isinstance(bias, torch.fx.Node) else None
    return (
        isinstance(val, torch.Tensor)
        and val.dtype == out.dtype
        and tuple(val.shape) in ((out.shape[1],), (1, out.shape[1]))
    )


def fold_matmul_bias(gm: torch.fx.GraphModule, templates: bool = False) -> int:
    """Rewrite ``add(mm(a, b), bias)`` as ``addmm(bias, a, b)`` where only library kernels
    read the sum, or (without ``templates``) where it is kept in memory anyway (see the
    module docstring); returns how many were folded."""
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
        if not _row_bias(bias, out):
            continue
        kept = not templates and (is_output(add) or has_extern_reader(add))
        if not (kept or only_extern_readers(add)):
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
        log.log("graphs", f"{folded} bias add(s) folded into addmm (their sums are kept in memory)")
    return folded
