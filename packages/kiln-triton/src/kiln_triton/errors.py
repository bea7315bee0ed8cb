"""Exceptions of kiln-triton. Each message names what failed, why, and what to do."""

from __future__ import annotations

from kiln_inductor.errors import KilnInductorError


class TritonCodegenError(KilnInductorError):
    def __init__(self, what: str, why: str, fix: str):
        super().__init__(f"kiln-triton cannot generate {what}\n  why: {why}\n  fix: {fix}")


class TritonCompileError(KilnInductorError):
    def __init__(self, path: str, error: str):
        super().__init__(
            f"Triton failed to compile a generated kernel ({path})\n  {error}\n"
            "  fix: this is a kiln-triton bug, please report it with the kernel source; "
            "KILN_DEBUG_DIR=<dir> writes every kernel of the graph there"
        )
