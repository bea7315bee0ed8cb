"""CppBackend: kiln-inductor's kernel backend protocol for CPU tensors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln_inductor.backend import KernelSource
from kiln_inductor.ir.nodes import Buffer
from kiln_inductor.scheduler.fuse import FusedGroup

from .build import build_kernels
from .kernel import generate_cpp_kernel


class CppBackend:
    name = "cpp"
    # kiln-inductor lowers index_put, scatter_add, index_add... to Scatter nodes for it
    supports_scatter = True

    def codegen_kernel(self, group: FusedGroup, buffers: dict[str, Buffer]) -> KernelSource:
        source, checks, sizes = generate_cpp_kernel(group, buffers)
        meta = {"index_checks": tuple(checks)} if checks else {}
        return KernelSource(source, "cpp", (*group.inputs, *group.outputs), meta, sizes)

    def load_kernels(self, sources: Sequence[KernelSource]) -> list[Callable[..., Any]]:
        return build_kernels([(s.source, len(s.arg_names), len(s.size_args)) for s in sources])

    def call_line(
        self, kernel_var: str, arg_names: Sequence[str], size_args: Sequence[str] = ()
    ) -> str:
        args = [f"{a}.data_ptr()" for a in arg_names] + list(size_args)
        return f"{kernel_var}({', '.join(args)})"

    def checked_call_lines(
        self,
        kernel_var: str,
        arg_names: Sequence[str],
        raise_call: str,
        size_args: Sequence[str] = (),
    ) -> list[str]:
        """A kernel with index checks returns the failing check's number (0: none)."""
        call = self.call_line(kernel_var, arg_names, size_args)
        return [
            f"_err = {call}",
            f"if _err: {raise_call.format(code='_err', index=f'{kernel_var}.error_index()')}",
        ]
