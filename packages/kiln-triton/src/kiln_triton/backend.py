"""TritonBackend: kiln-inductor's kernel backend protocol (DESIGN.md contract 4) for
CUDA tensors (and, in tests, CPU tensors through Triton's interpreter)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln_inductor.backend import KernelSource
from kiln_inductor.ir.nodes import Buffer
from kiln_inductor.scheduler.fuse import FusedGroup

from .codegen.kernel import generate_triton_kernel
from .config import read_triton_config
from .runtime.launcher import load_triton_kernels


class TritonBackend:
    name = "triton"

    def codegen_kernel(self, group: FusedGroup, buffers: dict[str, Buffer]) -> KernelSource:
        cfg = read_triton_config()
        kernel = generate_triton_kernel(group, buffers, cfg.persistent_max)
        meta = {
            "kind": kernel.kind,
            "xnumel": kernel.xnumel,
            "rblock": kernel.rblock,
            "extent": kernel.extent,
            "int64": kernel.int64,
            "arg_dtypes": [
                str(buffers[n].dtype).removeprefix("torch.")
                for n in (*group.inputs, *group.outputs)
            ],
        }
        return KernelSource(kernel.source, "triton", (*group.inputs, *group.outputs), meta)

    def load_kernels(self, sources: Sequence[KernelSource]) -> list[Callable[..., Any]]:
        return load_triton_kernels(sources, read_triton_config())

    def call_line(self, kernel_var: str, arg_names: Sequence[str]) -> str:
        return f"{kernel_var}({', '.join(arg_names)})"
