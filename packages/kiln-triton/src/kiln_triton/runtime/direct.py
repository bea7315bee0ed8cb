"""DirectLaunch: launch an already compiled Triton kernel without Triton's per-call work.

``JITFunction.run`` re-binds the arguments, recomputes their specialization (pointer
alignment) and looks the compiled kernel up in a cache on every launch: 10-20 us of Python
per kernel, which for a graph of a hundred small kernels costs more than the kernels. A
DirectLaunch is built from the CompiledKernel the first, normal launch returned and calls
its launcher the way ``JITFunction.run`` does, with the constexpr values fixed.

It is valid only while the call looks like the one it was built from: the same tensors'
16-byte alignment (Triton specializes pointers on it) and no launch hooks installed (a
profiler's). ``__call__`` returns False when it did not launch, and the caller then takes
Triton's normal path, which compiles another specialization where one is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from triton.runtime import driver

from kiln_inductor import log


def _hook_holder() -> tuple[Any, str, str]:
    try:
        from triton import knobs

        knobs.runtime.launch_enter_hook  # noqa: B018 (present since Triton 3.4)
        return knobs.runtime, "launch_enter_hook", "launch_exit_hook"
    except (ImportError, AttributeError):  # older releases kept them on CompiledKernel
        from triton.compiler import CompiledKernel

        return CompiledKernel, "launch_enter_hook", "launch_exit_hook"


_HOLDER, _ENTER, _EXIT = _hook_holder()


def _hooks() -> tuple[Any, Any]:
    return getattr(_HOLDER, _ENTER, None), getattr(_HOLDER, _EXIT, None)


def _active(hook: Any) -> bool:
    """Triton >= 3.4 keeps a HookChain that is always there and empty unless a profiler
    added a hook; older releases kept None or a function."""
    return hook is not None and bool(getattr(hook, "calls", True))


def alignment(args: Sequence[Any]) -> tuple[bool, ...]:
    return tuple([a.data_ptr() & 15 == 0 for a in args])


class DirectLaunch:
    def __init__(self, kernel: Any, grid: tuple[int, ...], tail: list[Any], aligned: tuple):
        self.run = kernel.run
        self.function = kernel.function
        self.metadata = getattr(kernel, "packed_metadata", None) or kernel.metadata
        self.grid = (*grid, 1, 1)[:3]
        # Triton >= 3.3 passes every bound argument (constexprs included) to the launcher,
        # older releases only the others; the first launch finds out which this one takes.
        self.tails = [tail, []] if tail else [[]]
        self.aligned = aligned
        # the device of the first launch: the kernel's function handle belongs to it
        self.device = driver.active.get_current_device()
        self.get_stream = driver.active.get_current_stream

    @classmethod
    def build(
        cls, fn: Any, kernel: Any, args: Sequence[Any], kwargs: dict[str, Any], grid: tuple
    ) -> DirectLaunch | None:
        if kernel is None or not all(isinstance(a, torch.Tensor) for a in args):
            return None
        names = [p.name for p in getattr(fn, "params", [])]
        rest = names[len(args) :]
        if not names or any(n not in kwargs for n in rest):
            return None
        try:
            return cls(kernel, grid, [kwargs[n] for n in rest], alignment(args))
        except AttributeError as e:  # a Triton whose CompiledKernel looks otherwise
            log.log("kernels", f"direct launch unavailable ({e}); using Triton's launch path")
            return None

    def __call__(self, args: Sequence[Any]) -> bool:
        """Launch and return True, or return False: the caller must take Triton's path."""
        enter, exit_ = _hooks()
        if not self.tails or alignment(args) != self.aligned or _active(enter) or _active(exit_):
            return False
        stream = self.get_stream(self.device)
        g0, g1, g2 = self.grid
        while self.tails:
            tail = self.tails[0]
            try:
                self.run(
                    g0, g1, g2, stream, self.function, self.metadata, None, None, None, *args, *tail
                )
            except TypeError as e:  # the launcher checks its arguments before launching
                self.tails.pop(0)
                if not self.tails:
                    log.log("kernels", f"direct launch rejected ({e}); using Triton's launch path")
                continue
            self.tails = [tail]
            return True
        return False
