"""MatmulTemplateKernel: a Triton matmul whose tiles flow straight into an epilogue.

For a kiln-inductor ``TemplateGroup`` (an ``mm``/``addmm``/``bmm`` and the pointwise kernel
that consumes its product): each program computes a ``[BLOCK_M, BLOCK_N]`` tile of the
product with ``tl.dot`` over ``BLOCK_K`` slices (float32 accumulation; programs ordered in
groups of ``GROUP_M`` rows so neighbours share operand tiles in L2), adds ``addmm``'s bias,
rounds to the product's dtype exactly where the ATen call would, and then runs the epilogue
on the tile as a 2-D pointwise kernel: ``xindex`` is the tile's flat index into the
product, so the epilogue's own index arithmetic, loads and stores apply unchanged, and its
loads of the product are the tile itself (``forward``).

Operands are read through their views' sizes, strides and offsets (a transposed weight is
read in place). float32 operands use IEEE products unless ``torch.backends.cuda.matmul.
allow_tf32`` is set, as cuBLAS does.
"""

from __future__ import annotations

from typing import Any

import torch

from kiln_inductor.ir.nodes import Buffer, StorageView
from kiln_inductor.ir.ops import ops_handler
from kiln_inductor.scheduler.templates import TemplateGroup, op_name

from ..errors import TritonCodegenError
from ..runtime.launcher import interpreting
from .kernel import HEADER, TritonKernel, _int
from .triton_ops import TritonValue, tl_type


def matmul_shape(group: TemplateGroup) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of the template's product."""
    ext = group.extern
    assert ext is not None
    a, b = (ext.args[1], ext.args[2]) if op_name(ext.op) == "addmm" else ext.args[:2]
    asz = [_int(s, "matmul") for s in a.layout.size]
    bsz = [_int(s, "matmul") for s in b.layout.size]
    if op_name(ext.op) == "bmm":
        return asz[0], asz[1], bsz[2], asz[2]
    return 1, asz[0], bsz[1], asz[1]


class MatmulTemplateKernel(TritonKernel):
    def __init__(self, group: TemplateGroup, buffers: dict[str, Buffer], persistent_max: int):
        super().__init__(group, buffers, persistent_max)
        self.template = group
        self.batch, self.m, self.n, self.k = matmul_shape(group)
        self.kind = "pointwise"

    def _operand(self, view: StorageView, dims: tuple[str, ...]) -> str:
        """The element offset of ``view`` at the tile indices named by ``dims``."""
        ptr, _ = self.ptrs[view.buffer.name]
        terms = [str(_int(view.layout.offset, "operand offset"))]
        for d, size, stride in zip(dims, view.layout.size, view.layout.stride):
            if _int(size, "operand size") != 1 and _int(stride, "operand stride") != 0:
                terms.append(f"{d} * {_int(stride, 'operand stride')}")
        return f"{ptr} + ({' + '.join(terms)})"

    def generate(self) -> str:
        params = [
            *(p for p, _ in self.ptrs.values()),
            "BLOCK_M: tl.constexpr",
            "BLOCK_N: tl.constexpr",
            "BLOCK_K: tl.constexpr",
            "GROUP_M: tl.constexpr",
        ]
        with ops_handler(self.h):
            self.matmul()
            for k, block in enumerate(self.group.blocks):
                self.block(k, block)
        head = f"@triton.jit\ndef kernel({', '.join(params)}):\n"
        return HEADER + head + "\n".join(self.lines) + "\n"

    def matmul(self) -> None:
        g, ext = self.template, self.template.extern
        assert ext is not None
        name = op_name(ext.op)
        batched = name == "bmm"
        a, b = (ext.args[1], ext.args[2]) if name == "addmm" else ext.args[:2]
        if not all(isinstance(v, StorageView) for v in (a, b)):
            raise TritonCodegenError(f"aten.{name}", "operands are not tensors", "report it")
        M, N, K = self.m, self.n, self.k
        e = self.emit
        e("pid = tl.program_id(0)")
        e("bz = tl.program_id(1)" if batched else "bz = 0")
        e(f"num_pid_m = tl.cdiv({M}, BLOCK_M)")
        e(f"num_pid_n = tl.cdiv({N}, BLOCK_N)")
        e("width = GROUP_M * num_pid_n")
        e("first_m = (pid // width) * GROUP_M")
        e("group_m = tl.minimum(num_pid_m - first_m, GROUP_M)")
        e("pid_m = first_m + (pid % width) % group_m")
        e("pid_n = (pid % width) // group_m")
        e("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        e("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
        e("rk = tl.arange(0, BLOCK_K)")
        e("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
        precision = ""
        if a.dtype == torch.float32:
            tf32 = torch.backends.cuda.matmul.allow_tf32
            precision = f", input_precision={'tf32' if tf32 else 'ieee'!r}"
        adims = ("bz", "rm[:, None]", "kk[None, :]") if batched else ("rm[:, None]", "kk[None, :]")
        bdims = ("bz", "kk[:, None]", "rn[None, :]") if batched else ("kk[:, None]", "rn[None, :]")
        self.emit(f"for k in range(0, {K}, BLOCK_K):")
        self.depth += 1
        e("kk = k + rk")
        e(
            f"a = tl.load({self._operand(a, adims)}, "
            f"(rm[:, None] < {M}) & (kk[None, :] < {K}), other=0.0)"
        )
        e(
            f"b = tl.load({self._operand(b, bdims)}, "
            f"(kk[:, None] < {K}) & (rn[None, :] < {N}), other=0.0)"
        )
        if a.dtype == torch.bfloat16 and interpreting():
            # Triton's interpreter multiplies bfloat16 tiles wrongly (3.9); bfloat16 products
            # are exact in float32, so this computes the same sums
            e("a = a.to(tl.float32)")
            e("b = b.to(tl.float32)")
            precision = ", input_precision='ieee'"
        e(f"acc += tl.dot(a, b{precision})")
        self.depth -= 1
        e(f"xmask = (rm[:, None] < {M}) & (rn[None, :] < {N})")
        if name == "addmm":
            bias = ext.args[0]
            beta = float(ext.kwargs.get("beta", 1))
            alpha = float(ext.kwargs.get("alpha", 1))
            dims = ("rm[:, None]", "rn[None, :]")[-len(bias.layout.size) :]
            e(f"bias = tl.load({self._operand(bias, dims)}, xmask, other=0.0).to(tl.float32)")
            e(f"acc = acc * {alpha!r} + bias * {beta!r}")
        prod = self.buffers[g.product]
        e(f"tile = acc.to({tl_type(prod.dtype)})")
        e(f"xindex = bz * {M * N} + rm[:, None] * {N} + rn[None, :]")
        e("xzero = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)")
        flat = self.define_outer_vars()
        self.forward[(g.product, self._canonical(flat))] = TritonValue("tile", prod.dtype)


def template_meta(group: TemplateGroup) -> dict[str, Any]:
    batch, m, n, k = matmul_shape(group)
    return {"kind": "mm_template", "batch": batch, "M": m, "N": n, "K": k, "xnumel": batch * m * n}
