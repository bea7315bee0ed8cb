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

Alignment is checked only for the arguments named by ``checked`` (positions): the
backend knows at compile time which arguments cannot change alignment between calls (the
buffers the wrapper allocates itself: fresh ``empty_strided`` storage, or dead storage
reused from offset 0; and constants, the same tensor every call) and which come from
outside (graph inputs, extern and fallback results, any of which may be a view at an odd
offset). Reading ``data_ptr()`` costs up to a microsecond of Python per tensor, so a
kernel reading only intermediates is launched with no check at all. ``build`` verifies
the assumption once, on the first call's arguments.

A kernel with symbolic sizes takes them as ints after its tensors (``nsizes``): its grid
comes with each call, and the caller keeps one DirectLaunch per Triton specialization of
the sizes (``runtime/buckets.py``), since each is a binary of its own. Such kernels launch
through ``kiln_triton._launch`` too, the sizes after the tensors, when the binary's PTX
has one parameter per tensor and size (a size Triton specialized away, a 1, has none:
Triton's launcher runs those).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from triton.runtime import driver

from kiln_inductor import log
from kiln_inductor.index_check import register_host_reader

from ..config import read_triton_config

try:  # the optional C extension (kiln-triton's setup.py); without it Triton's launcher runs
    from kiln_triton import _launch as _c_launch
except ImportError:  # pragma: no cover - a build without a C compiler
    _c_launch = None


def error_reader(host: torch.Tensor, rows: torch.Tensor) -> Any:
    """The C read of a graph's index-check error rows (``kiln_triton._launch.ErrorReader``:
    the rows' copy to page-locked ``host`` memory and an event, two driver calls each way,
    where torch's ``copy_`` and ``torch.cuda.Event`` cost ~40 us per call), or None to keep
    torch's (no C extension, or ``KILN_TRITON_C_LAUNCH=0``)."""
    reader = getattr(_c_launch, "ErrorReader", None)
    if reader is None or not read_triton_config().c_launch:
        return None
    return reader(
        host.data_ptr(),
        rows.data_ptr(),
        rows.numel() * rows.element_size(),
        rows.shape[0],
        driver.active.get_current_stream,
        rows.device.index if rows.device.index is not None else torch.cuda.current_device(),
    )


register_host_reader("cuda", error_reader)


def _hook_holder() -> tuple[Any, str, str]:
    try:
        from triton import knobs

        knobs.runtime.launch_enter_hook  # noqa: B018 (present since Triton 3.4)
        return knobs.runtime, "launch_enter_hook", "launch_exit_hook"
    except (ImportError, AttributeError):  # older releases kept them on CompiledKernel
        from triton.compiler import CompiledKernel

        return CompiledKernel, "launch_enter_hook", "launch_exit_hook"


_HOLDER, _ENTER, _EXIT = _hook_holder()


def _hooked() -> bool:
    """Whether a launch hook is installed now (checked on every launch: a profiler may
    install one at any time). Triton >= 3.4 keeps a HookChain that is always there and
    empty unless a profiler added a hook; older releases kept None or a function."""
    enter, exit_ = getattr(_HOLDER, _ENTER, None), getattr(_HOLDER, _EXIT, None)
    return (enter is not None and bool(getattr(enter, "calls", True))) or (
        exit_ is not None and bool(getattr(exit_, "calls", True))
    )


def _entry_params(ptx: str) -> int | None:
    """The number of parameters of the kernel's ``.entry`` in its PTX."""
    start = ptx.find(".entry ")
    if start < 0:
        return None
    open_ = ptx.find("(", start)
    close = ptx.find(")", open_)
    if open_ < 0 or close < 0:
        return None
    return ptx.count(".param", open_, close)


def c_launch_shape(kernel: Any, nargs: int) -> tuple[int, int, int] | None:
    """``(threads, shared bytes, hidden pointers)`` for launching ``kernel``, whose visible
    parameters are ``nargs`` tensors, through ``kiln_triton._launch``; None where that
    launch would differ from Triton's: no extension, several CTAs or a cluster, a
    cooperative or programmatic-dependent launch, scratch memory Triton would allocate,
    or parameters the PTX does not account for. The hidden pointers are the ones Triton
    appends (global and profile scratch), passed as NULL as Triton does when unused."""
    md, asm = getattr(kernel, "metadata", None), getattr(kernel, "asm", None)
    ptx = asm.get("ptx") if isinstance(asm, dict) else None
    if _c_launch is None or md is None or not isinstance(ptx, str):
        return None
    params = _entry_params(ptx)
    cluster = getattr(md, "cluster_dims", None) or (1, 1, 1)
    plain = (
        getattr(md, "num_ctas", 1) == 1
        and all(int(c) == 1 for c in cluster)
        and not getattr(md, "launch_cooperative_grid", False)
        and not getattr(md, "launch_pdl", False)
        and not getattr(md, "global_scratch_size", 0)
        and not getattr(md, "profile_scratch_size", 0)
        and not getattr(md, "tmem_size", 0)
    )
    if not plain or params is None or not 0 <= params - nargs <= 2:
        return None
    return 32 * int(md.num_warps), int(md.shared), params - nargs


def c_launcher(direct: DirectLaunch, fallback: Any) -> Any:
    """A ``kiln_triton._launch.Launcher`` running ``direct``'s C launches when called with
    the kernel's tensors, and ``fallback(*tensors)`` while a launch hook is installed or
    for a tensor the kernel assumes aligned that is not; None without the extension."""
    launcher = getattr(_c_launch, "Launcher", None)
    if launcher is None or direct.c_shape is None:
        return None
    threads, shared, hidden = direct.c_shape
    return launcher(
        direct.function, tuple(direct.grid), threads, shared, hidden, direct.must_align,
        direct.get_stream, direct.device, (_HOLDER, _ENTER, _EXIT), fallback,
    )  # fmt: skip


def c_sized_launcher(direct: DirectLaunch, nsizes: int, table: dict, fallback: Any) -> Any:
    """A ``kiln_triton._launch.SizedLauncher`` for a kernel with ``nsizes`` size arguments:
    called with the kernel's tensors and sizes, it launches what ``table`` holds for those
    sizes (``c_entry``; None: nothing to launch) on ``direct``'s device, and calls
    ``fallback(*args)`` for sizes not in it, while a launch hook is installed, for a
    misaligned tensor the kernel assumes aligned, or when a launch fails. None without the
    extension (or one built before it had SizedLauncher)."""
    launcher = getattr(_c_launch, "SizedLauncher", None)
    if launcher is None:
        return None
    return launcher(
        nsizes, table, direct.get_stream, direct.device, (_HOLDER, _ENTER, _EXIT), fallback
    )


def c_entry(direct: DirectLaunch, grid: tuple[int, ...]) -> tuple[Any, ...] | None:
    """A SizedLauncher table entry: ``direct``'s C launch on ``grid`` (None: it has none)."""
    if direct.c_shape is None:
        return None
    threads, shared, hidden = direct.c_shape
    g0, g1, g2 = (*grid, 1, 1)[:3]
    return (direct.function, g0, g1, g2, threads, shared, hidden, direct.must_align)


def alignment(args: Sequence[Any], checked: Sequence[int] | None = None) -> tuple[bool, ...]:
    """16-byte alignment of ``args`` (of those at the ``checked`` positions, if given)."""
    if checked is None:
        return tuple([a.data_ptr() & 15 == 0 for a in args])
    return tuple([args[i].data_ptr() & 15 == 0 for i in checked])


class DirectLaunch:
    def __init__(
        self,
        kernel: Any,
        grid: tuple[int, ...],
        tail: list[Any],
        aligned: tuple,
        checked: tuple[int, ...] | None = None,
        ntensors: int | None = None,
    ):
        self.run = kernel.run
        self.function = kernel.function
        self.metadata = getattr(kernel, "packed_metadata", None) or kernel.metadata
        self.grid = (*grid, 1, 1)[:3]
        # Triton >= 3.3 passes every bound argument (constexprs included) to the launcher,
        # older releases only the others; the first launch finds out which this one takes.
        self.tails = [tail, []] if tail else [[]]
        self.tail: list[Any] | None = None  # the one that worked
        self.aligned, self.checked = aligned, checked
        self.ntensors = ntensors  # the leading arguments that are tensors (None: all)
        # the device of the first launch: the kernel's function handle belongs to it
        self.device = driver.active.get_current_device()
        self.get_stream = driver.active.get_current_stream
        # (threads, shared, hidden) for kiln_triton._launch, or None: Triton's launcher
        self.c_shape: tuple[int, int, int] | None = None
        # the positions whose pointers the kernel assumes 16-byte aligned (a kernel built
        # for an unaligned pointer runs with an aligned one too: only these are checked)
        positions = range(len(aligned)) if checked is None else checked
        self.must_align = tuple(i for i, a in zip(positions, aligned) if a)

    @classmethod
    def build(
        cls,
        fn: Any,
        kernel: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        grid: tuple,
        checked: Sequence[int] | None = None,
        nsizes: int = 0,
    ) -> DirectLaunch | None:
        """A direct launch replaying ``kernel``'s first launch, checking the alignment of
        the tensors at ``checked`` (all of them when None) on every call. The last
        ``nsizes`` arguments are ints (sizes), the rest tensors."""
        ntensors = len(args) - nsizes
        tensors = args[:ntensors]
        if kernel is None or not all(isinstance(a, torch.Tensor) for a in tensors):
            return None
        names = [p.name for p in getattr(fn, "params", [])]
        rest = names[len(args) :]
        if not names or any(n not in kwargs for n in rest):
            return None
        try:
            positions = None if checked is None else tuple(checked)
            first = alignment(tensors)
            if positions is not None and not all(
                a for k, a in enumerate(first) if k not in positions
            ):
                # an argument assumed aligned is not (a wrapper that changed how it
                # allocates): check every argument rather than trust the assumption
                positions = None
            tail = [kwargs[n] for n in rest]
            aligned = alignment(tensors, positions)
            direct = cls(kernel, grid, tail, aligned, positions, ntensors if nsizes else None)
            if read_triton_config().c_launch:
                direct.c_shape = c_launch_shape(kernel, len(args))
            return direct
        except AttributeError as e:  # a Triton whose CompiledKernel looks otherwise
            log.log("kernels", f"direct launch unavailable ({e}); using Triton's launch path")
            return None

    def __call__(self, args: Sequence[Any], grid: tuple[int, ...] | None = None) -> bool:
        """Launch and return True, or return False: the caller must take Triton's path.
        ``grid``: this call's, for a kernel with symbolic sizes (``args`` then end with
        the sizes; else the first call's grid)."""
        sized = grid is not None
        grid = (*grid, 1, 1)[:3] if sized else self.grid  # type: ignore[misc]
        tensors = args[: self.ntensors] if sized else args
        shape = self.c_shape
        if shape is not None and not _hooked():
            threads, shared, hidden = shape
            extra = (tuple(args[self.ntensors :]),) if sized else ()
            try:
                # checks the alignment the kernel assumes while reading the pointers
                return _c_launch.launch(  # type: ignore[union-attr]
                    self.function, grid[0], grid[1], grid[2], threads, shared,
                    self.get_stream(self.device), hidden, tuple(tensors), self.must_align,
                    *extra,
                )  # fmt: skip
            except (RuntimeError, TypeError, OverflowError, IndexError) as e:
                # e.g. no current CUDA context on this thread: Triton's launcher sets it up
                log.log("kernels", f"C launch failed ({e}); using Triton's launcher")
                self.c_shape = None
        if self.checked != () and alignment(tensors, self.checked) != self.aligned:
            return False
        if _hooked():
            return False
        if self.tail is None:
            self.grid = grid
            return self._first(args)
        stream = self.get_stream(self.device)
        self.run(
            grid[0], grid[1], grid[2], stream, self.function, self.metadata, None, None, None,
            *args, *self.tail,
        )  # fmt: skip
        return True

    def _first(self, args: Sequence[Any]) -> bool:
        """The first direct launch: find the argument shape the launcher takes."""
        g0, g1, g2 = self.grid
        stream = self.get_stream(self.device)
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
            self.tail = tail
            return True
        return False
