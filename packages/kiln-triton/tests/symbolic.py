"""Symbolic-size test helpers: graphs made as kiln-capture makes them and the counting
``compile_graph`` come from kiln_inductor.testing (kiln-cpp's tests use the same); the
kernel-source recorder and launcher lookups are kiln-triton's own."""

from __future__ import annotations

from kiln_inductor.testing import CountingCompiler as Counting  # noqa: F401
from kiln_inductor.testing import symbolic_graph, symbolic_programs  # noqa: F401


def recording(backend):
    """Make ``backend`` keep every KernelSource it generates in ``backend.sources``."""
    backend.sources = []
    generate = backend.codegen_kernel

    def codegen_kernel(group, buffers):
        src = generate(group, buffers)
        backend.sources.append(src)
        return src

    backend.codegen_kernel = codegen_kernel
    return backend


def launchers(compiled) -> list:
    """The kernel launchers of a compiled ATen graph (its wrapper's globals)."""
    names = compiled._call.__globals__
    return [v for k, v in names.items() if k.startswith("kernel_")]
