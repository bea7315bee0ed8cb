"""Exceptions of kiln-inductor. Each message names the op, the source line and what to do."""

from __future__ import annotations

import torch.fx


def source_line(node: torch.fx.Node | None) -> str:
    """The user's source line recorded on an FX node, or '' when there is none."""
    if node is None:
        return ""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    if len(lines) >= 2:
        return f"{lines[-2]}   {lines[-1]}"
    return lines[-1] if lines else ""


class KilnInductorError(Exception):
    """Base class of kiln-inductor's errors."""


class LoweringError(KilnInductorError):
    def __init__(self, op: object, why: str, fix: str, node: torch.fx.Node | None = None):
        where = source_line(node)
        msg = f"cannot lower {op}"
        if where:
            msg += f"\n  at {where}"
        msg += f"\n  why: {why}\n  fix: {fix}"
        super().__init__(msg)
        self.op = op


class LoweringUnsupported(Exception):
    """Raised by a lowering for a case it does not handle: the op runs as a library call."""


class NoBackendError(KilnInductorError):
    def __init__(self, device_type: str):
        hint = {
            "cpu": "pip install kiln-cpp, then `import kiln_cpp` (it registers itself for 'cpu')",
            "cuda": "pip install kiln-triton, then `import kiln_triton` (it registers itself for 'cuda')",
        }.get(device_type, "register one with kiln_inductor.register_backend(device_type, backend)")
        super().__init__(
            f"no kernel backend registered for device type {device_type!r}\n  fix: {hint}"
        )


class AotUnavailableError(KilnInductorError):
    def __init__(self, what: str):
        super().__init__(
            f"this graph is torch-level and needs kiln_aot.{what} to reach ATen, which the installed "
            "kiln-aot does not provide\n  fix: upgrade kiln-aot, or pass an ATen-level graph to "
            "kiln_inductor.compile_aten_graph"
        )
