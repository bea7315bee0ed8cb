"""Exceptions of kiln-cpp."""

from __future__ import annotations

from kiln_inductor.errors import KilnInductorError


class CppCompileError(KilnInductorError):
    def __init__(self, cmd: list[str], stderr: str, source_path: str):
        tail = "\n".join(stderr.strip().splitlines()[-25:])
        super().__init__(
            f"the C++ compiler failed on a generated kernel ({source_path})\n  command: {' '.join(cmd)}\n"
            f"{tail}\n  fix: this is a kiln-cpp bug, please report it with the kernel source; "
            "set KILN_CPP_CXX / KILN_CPP_FLAGS to try another compiler or flags"
        )
