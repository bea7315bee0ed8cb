"""TritonBackend: kiln-inductor's kernel backend protocol (DESIGN.md contract 4) for
CUDA tensors (and, in tests, CPU tensors through Triton's interpreter).

Beyond the protocol it offers matmul templates (``template_accepts``): under
``mode="max-autotune"`` an ``mm``/``addmm``/``bmm`` and its pointwise consumer become one
Triton kernel, or stay cuBLAS plus the consumer's kernel if that measures faster."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln_inductor.backend import KernelSource
from kiln_inductor.ir.nodes import (
    Buffer,
    ComputedBuffer,
    ConstantBuffer,
    ExternKernel,
    StorageView,
)
from kiln_inductor.scheduler.access import node_access
from kiln_inductor.scheduler.fuse import FusedGroup
from kiln_inductor.scheduler.templates import TemplateGroup, op_name

from .codegen.kernel import generate_triton_kernel
from .codegen.template import MatmulTemplateKernel, template_meta
from .config import read_triton_config
from .runtime.launcher import interpreting, load_module, load_triton_kernels, source_key
from .runtime.template import TemplateLauncher

TEMPLATE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _static(view: Any) -> bool:
    lay = view.layout
    return all(sympy.sympify(v).is_Integer for v in (*lay.size, *lay.stride, lay.offset))


def _static_group(group: FusedGroup, buffers: dict[str, Buffer]) -> bool:
    """Whether a kernel of ``group`` takes no size arguments: static loops, static layouts
    of what it reads and writes, and no size symbol in its text (``x / t``)."""
    ranges = [*group.outer, *(r for b in group.blocks for r in (*b.inner, *b.rranges))]
    if not all(sympy.sympify(r).is_Integer for r in ranges):
        return False
    if not all(_static(buffers[n]) for n in (*group.inputs, *group.outputs)):
        return False
    cfg = read_triton_config()
    return not generate_triton_kernel(group, buffers, cfg.persistent_max).size_args


def checked_args(names: Sequence[str], buffers: dict[str, Buffer]) -> list[int]:
    """Positions of the kernel arguments whose 16-byte alignment may change between calls
    (runtime/direct.py): graph inputs and what ATen calls return. Not the buffers kernels
    compute, which the wrapper allocates itself (fresh storage, or dead storage reused
    from offset 0), nor constants (the same tensor on every call)."""
    fixed = (ComputedBuffer, ConstantBuffer)
    return [k for k, n in enumerate(names) if not isinstance(buffers[n], fixed)]


# split reductions (TritonBackend.reduction_splits)
SPLIT_MAX_OUTPUTS = 8192
SPLIT_MAX_ROWS = 256
SPLIT_MIN_ELEMENTS = 4096
SPLIT_MIN_PIECE = 256
SPLIT_PARTIALS = 32768


class TritonBackend:
    name = "triton"
    # kiln-inductor lowers cumsum/cumprod to Scan nodes for backends that say so
    supports_scan = True
    # ... and index_put, scatter_add, index_add, embedding_dense_backward to Scatter nodes
    supports_scatter = True

    def codegen_kernel(self, group: FusedGroup, buffers: dict[str, Buffer]) -> KernelSource:
        cfg = read_triton_config()
        if isinstance(group, TemplateGroup):
            return self._codegen_template(group, buffers)
        kernel = generate_triton_kernel(group, buffers, cfg.persistent_max)
        meta = {
            **kernel.meta(),
            "int64": kernel.int64,
            "arg_dtypes": [
                str(buffers[n].dtype).removeprefix("torch.")
                for n in (*group.inputs, *group.outputs)
            ]
            + (["int64"] if kernel.checks else []),
            "checked_args": checked_args([*group.inputs, *group.outputs], buffers),
        }
        if kernel.size_args:
            # the sizes the wrapper passes after the tensors; meta's xnumel and extent are
            # expressions of them (runtime/launcher.py evaluates them on each call)
            meta["size_args"] = kernel.size_args
        if kernel.persistent_limit:
            # rows of symbolic length: ``kernel_persistent`` takes rows up to this long
            meta["persistent_limit"] = kernel.persistent_limit
        if kernel.checks:
            # failures go to the graph's error rows, read once per call by the wrapper
            meta["index_checks"] = tuple(kernel.checks)
            meta["index_report"] = "tensor"
        return KernelSource(
            kernel.source,
            "triton",
            (*group.inputs, *group.outputs),
            meta,
            size_args=kernel.size_args,
        )

    def _codegen_template(self, group: TemplateGroup, buffers: dict[str, Buffer]) -> KernelSource:
        cfg = read_triton_config()
        kernel = MatmulTemplateKernel(group, buffers, cfg.persistent_max)
        kernel.source = kernel.generate()
        assert group.epilogue is not None
        meta = {
            **template_meta(group),
            "itemsize": buffers[group.product].dtype.itemsize,
            "arg_dtypes": [
                str(buffers[n].dtype).removeprefix("torch.")
                for n in (*group.inputs, *group.outputs)
            ],
            "extern": group.extern,
            "product": group.product,
            "epilogue": self.codegen_kernel(group.epilogue, buffers),
        }
        return KernelSource(kernel.source, "triton", (*group.inputs, *group.outputs), meta)

    def reduction_splits(self, device: Any, outputs: int, elements: int, inner: bool) -> int:
        """Into how many pieces kiln-inductor splits a reduction of ``elements`` elements
        into each of ``outputs`` outputs (its lowering/reduction.py, "Split reductions"):
        over 4096+ elements, into fewer than 8192 outputs when they are columns (a program
        takes a block of up to 64 of them) or fewer than 256 when they are rows (``inner``:
        a program per row or a few), pieces of at least 256 elements (a power of two
        dividing ``elements``), until there are 32768 partial results (a weight gradient of
        768 columns over 8 x 512 rows: 16 pieces; a loss over 4096 tokens: 16; a
        log-softmax over 4096 rows of 32000 logits: none)."""
        limit = SPLIT_MAX_ROWS if inner else SPLIT_MAX_OUTPUTS
        if outputs >= limit or elements < SPLIT_MIN_ELEMENTS:
            return 1
        splits = 1
        while (
            outputs * splits < SPLIT_PARTIALS
            and elements % (2 * splits) == 0
            and elements // (2 * splits) >= SPLIT_MIN_PIECE
        ):
            splits *= 2
        return splits

    def matmul_templates(self) -> bool:
        """Whether matmuls may be fused with their epilogues now (``template_accepts``)."""
        return bool(read_triton_config().max_autotune)

    def template_accepts(
        self, extern: ExternKernel, epilogue: FusedGroup, buffers: dict[str, Buffer]
    ) -> bool:
        """Matmul templates are part of max-autotune, for static shapes in 16-bit or 32-bit
        floats on the GPU (or the interpreter) with int32 indices. Symbolic shapes keep the
        library matmul (cuBLAS) and the epilogue's own kernel: the template's tiles, grid and
        autotuning are specialized to M, N and K."""
        if not read_triton_config().max_autotune:
            return False
        if any(node_access(n).indirect for b in epilogue.blocks for n in b.nodes):
            return False  # the template has no error row for index checks
        views = [a for a in extern.args if isinstance(a, StorageView)]
        if len(views) != len(extern.args) or not all(_static(v) for v in views):
            return False
        if not all(_static(o) for o in extern.outputs) or not _static_group(epilogue, buffers):
            return False
        dtypes = {v.dtype for v in views}
        device = views[0].layout.device
        if len(dtypes) != 1 or dtypes.pop() not in TEMPLATE_DTYPES:
            return False
        if device.type != "cuda" and not interpreting():
            return False
        if op_name(extern.op) == "addmm" and len(views[0].layout.size) not in (1, 2):
            return False
        spans = [int(v.layout.storage_span()) for v in views]
        return max([*spans, int(extern.outputs[0].layout.numel)]) < 2**31 - 1

    def load_kernels(self, sources: Sequence[KernelSource]) -> list[Callable[..., Any]]:
        cfg = read_triton_config()
        plain = [s for s in sources if s.meta.get("kind") != "mm_template"]
        loaded = iter(load_triton_kernels(plain, cfg))
        out: list[Callable[..., Any]] = []
        for src in sources:
            if src.meta.get("kind") != "mm_template":
                out.append(next(loaded))
                continue
            epi: KernelSource = src.meta["epilogue"]
            key = source_key(src.source, cfg)
            out.append(
                TemplateLauncher(
                    load_module(src.source, key).kernel,
                    src.meta,
                    key,
                    cfg,
                    src.meta["extern"],
                    src.meta["product"],
                    src.arg_names,
                    epi.arg_names,
                    load_triton_kernels([epi], cfg)[0],
                )
            )
        return out

    def call_line(
        self, kernel_var: str, arg_names: Sequence[str], size_args: Sequence[str] = ()
    ) -> str:
        """``kernel.fast(*tensors, *sizes)``: the tensors (an error row last, if any), then
        the size symbols the wrapper bound (``KernelSource.size_args``) as Python ints.
        ``fast`` is the launcher itself, or its C Launcher once it has one (launcher.py)."""
        return f"{kernel_var}.fast({', '.join([*arg_names, *size_args])})"
