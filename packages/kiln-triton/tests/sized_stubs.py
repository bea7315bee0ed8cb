"""Stand-ins for launching a Triton kernel with size arguments without a GPU: a JITFunction
(``SizedFn``) whose launches and compiled kernels' launches are logged, a driver, and a
stub ``libcuda.so.1`` whose cuLaunchKernel records its arguments (for kiln_triton._launch).

Run as a script (``python sized_stubs.py STUB_LIBCUDA``), it checks the C SizedLauncher's
launches against the stub driver: in a process of its own, since kiln_triton._launch opens
libcuda once per process (test_sized_launch.py runs it).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from kiln_triton.runtime.buckets import int_specialization

# a Triton kernel's .entry with `n` parameters (kiln_triton.runtime.direct._entry_params)
_PTX = ".visible .entry kernel(\n{}\n)\n.reqntid 128\n{{\n}}\n"


def ptx(nparams: int) -> str:
    params = ",\n".join(f"\t.param .u64 kernel_param_{i}" for i in range(nparams))
    return _PTX.format(params)


class _Param:
    def __init__(self, name: str):
        self.name = name


class _Metadata:
    num_warps, num_ctas, shared = 4, 1, 2048
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False


class Compiled:
    """A CompiledKernel stand-in: Triton's launcher (``run``) logs ("direct", its
    function's name, grid, sizes, XBLOCK, RBLOCK); with ``nparams``, the metadata and PTX
    kiln_triton._launch needs (two tensors, the sizes, then Triton's hidden pointers)."""

    def __init__(self, log: list, name: str, nsizes: int, function: int, nparams: int | None):
        self.log, self.name, self.nsizes = log, name, nsizes
        self.function, self.packed_metadata = function, "meta"
        if nparams is not None:
            self.metadata, self.asm = _Metadata(), {"ptx": ptx(nparams)}

    def run(self, g0, g1, g2, stream, function, metadata, launch_md, enter, exit, *args):
        sizes, (xblock, rblock) = args[2 : 2 + self.nsizes], args[2 + self.nsizes :]
        self.log.append(("direct", self.name, (g0, g1, g2), tuple(sizes), xblock, rblock))


class SizedFn:
    """A JITFunction stand-in for a kernel taking two tensors and the sizes ``names``:
    ``fn[grid](...)`` is Triton's launch, logged as ("triton", name, grid, sizes, XBLOCK,
    RBLOCK), returning one compiled kernel per Triton specialization of the sizes."""

    functions = iter(range(0x1000, 1 << 30, 0x100))  # distinct function handles

    def __init__(self, log: list, name: str = "kernel", names=("s0",), nparams=None):
        self.log, self.name, self.nparams = log, name, nparams
        self.nsizes = len(names)
        self.params = [_Param(n) for n in ("in_ptr0", "out_ptr0", *names, "XBLOCK", "RBLOCK")]
        self.kernels: dict[tuple, Compiled] = {}

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Compiled:
            sizes = tuple(args[2:])
            g = (*grid, 1, 1)[:3]
            self.log.append(("triton", self.name, g, sizes, kwargs["XBLOCK"], kwargs["RBLOCK"]))
            spec = int_specialization(sizes)
            if spec not in self.kernels:
                function = next(SizedFn.functions)
                self.kernels[spec] = Compiled(
                    self.log, self.name, self.nsizes, function, self.nparams
                )
            return self.kernels[spec]

        return launch


class Driver:
    """Triton's active driver, for ``runtime.direct.driver``: device 0, stream 77."""

    class active:  # the attribute of Triton's driver module
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device: 77)


STUB_LIBCUDA = r"""
#include <stdint.h>
static int calls, fail, nparams;
static unsigned long long last[32];
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    calls++;
    if (fail) return fail;
    unsigned long long head[9] = {(uintptr_t)f, gx, gy, gz, bx, by, bz, shared,
                                  (uintptr_t)stream};
    for (int i = 0; i < 9; i++) last[i] = head[i];
    for (int i = 0; i < nparams && i < 23; i++) last[9 + i] = *(uint64_t *)params[i];
    return 0;
}
int cuGetErrorString(int error, const char **text) { *text = "stub failure"; return 0; }
void stub_set(int n, int f) { nparams = n; fail = f; }
int stub_calls(void) { return calls; }
void stub_last(unsigned long long *out) { for (int i = 0; i < 32; i++) out[i] = last[i]; }
"""


def build_stub_libcuda(directory: Path) -> Path | None:
    """A stand-in libcuda.so.1 (soname included) in ``directory``; None without a C
    compiler. cuLaunchKernel records the function, grid, block, shared bytes, stream and
    the first ``n`` parameters (``stub_set(n, fail)``; ``fail``: the error it returns)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, lib = directory / "stub_libcuda.c", directory / "libcuda.so.1"
    src.write_text(STUB_LIBCUDA)
    cmd = [cc, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(src)]
    subprocess.run(cmd, check=True, capture_output=True)
    return lib


def check_sized_c_launches(lib: str) -> None:
    """A TritonLauncher with one size argument, called as the wrapper calls it
    (``kernel.fast(x, out, s0)``), with the stub libcuda loaded: sizes seen before launch
    from C with no Python call; new sizes, hooks, misaligned tensors and failed launches
    call back into the launcher."""
    stub = ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)  # dlopen("libcuda.so.1") finds it
    import torch
    from triton import knobs

    from kiln_triton.config import TritonConfig
    from kiln_triton.runtime import direct, launcher

    assert getattr(direct._c_launch, "SizedLauncher", None) is not None, "extension not rebuilt"
    direct.driver = Driver
    launcher.interpreting = lambda: False
    entered: list[int] = []  # the sizes of calls that reached Python
    real_call = launcher.TritonLauncher.__call__

    def call(self, *args):
        entered.append(args[-1])
        return real_call(self, *args)

    launcher.TritonLauncher.__call__ = call
    log: list = []
    fn = SizedFn(log, nparams=5)  # x, out, s0 and Triton's two scratch pointers
    meta = {"kind": "pointwise", "xnumel": "(4 * s0)", "rblock": 1, "extent": 1,
            "size_args": ("s0",), "checked_args": [0]}  # fmt: skip
    ln = launcher.TritonLauncher(fn, meta, "k", TritonConfig(autotune=False, compile_workers=0))
    x, out = torch.randn(64), torch.empty(64)
    stub.stub_set(5, 0)
    last = (ctypes.c_ulonglong * 32)()

    def launched(s0: int) -> tuple:
        """(function, grid, block, shared, stream, params) of the stub's last launch"""
        stub.stub_last(last)
        return last[0], tuple(last[1:4]), tuple(last[4:7]), last[7], last[8], tuple(last[9:14])

    def params(s0: int) -> tuple:
        return (x.data_ptr(), out.data_ptr(), s0, 0, 0)

    ln.fast(x, out, 5)  # Triton's launch; its direct launch becomes the entry for (5,)
    assert type(ln.fast).__name__ == "SizedLauncher", ln.fast
    assert entered == [5] and len(log) == 1 and stub.stub_calls() == 0
    small = fn.kernels[(("i32", False),)].function
    for _ in range(3):  # seen before: C only
        ln.fast(x, out, 5)
    assert entered == [5] and stub.stub_calls() == 3 and len(log) == 1
    # 4 * 5 elements, XBLOCK 32 (bucket 8): one program of 128 threads, on stream 77
    assert launched(5) == (small, (1, 1, 1), (128, 1, 1), 2048, 77, params(5))
    ln.fast(x, out, 7)  # a new size of the bucket: decided in Python, launched from C
    ln.fast(x, out, 7)
    assert entered == [5, 7] and stub.stub_calls() == 5 and len(log) == 1
    assert launched(7) == (small, (1, 1, 1), (128, 1, 1), 2048, 77, params(7))
    ln.fast(x, out, 300)  # a new bucket: Triton's launch, then C
    ln.fast(x, out, 300)
    assert entered == [5, 7, 300] and stub.stub_calls() == 6 and len(log) == 2
    assert launched(300)[:2] == (small, (2, 1, 1)) and launched(300)[5] == params(300)
    ln.fast(x, out, 16)  # another specialization (a multiple of 16): another binary
    ln.fast(x, out, 16)
    assert entered == [5, 7, 300, 16] and stub.stub_calls() == 7 and len(log) == 3
    assert launched(16)[0] == fn.kernels[(("i32", True),)].function != small
    ln.fast(x, out, 0)  # no elements: nothing launched, in Python once
    ln.fast(x, out, 0)
    assert entered[-1] == 0 and len(entered) == 5 and stub.stub_calls() == 7 and len(log) == 3
    # a launch hook: Triton's launch (the profiler sees it), through Python
    chain = getattr(direct._HOLDER, direct._ENTER)
    assert hasattr(chain, "add"), knobs.runtime  # Triton >= 3.4

    def hook(*args):
        return None

    chain.add(hook)
    try:
        ln.fast(x, out, 5)
    finally:
        chain.remove(hook)
    assert len(entered) == 6 and stub.stub_calls() == 7 and log[-1][:4] == (
        "triton", "kernel", (1, 1, 1), (5,)
    )  # fmt: skip
    # a misaligned input the kernel assumes aligned: Triton's path specializes for it
    ln.fast(x[1:], out, 5)
    assert len(entered) == 7 and stub.stub_calls() == 7 and log[-1][0] == "triton"
    ln.fast(x, out, 5)
    assert len(entered) == 7 and stub.stub_calls() == 8
    # failing launches: the C launch fails (in C, then again from Python's direct launch),
    # Triton's launcher runs, and those sizes are not launched from C again
    stub.stub_set(5, 700)
    ln.fast(x, out, 5)
    assert len(entered) == 8 and stub.stub_calls() == 10 and log[-1][:2] == ("direct", "kernel")
    ln.fast(x, out, 5)
    assert len(entered) == 9 and stub.stub_calls() == 10 and log[-1][0] == "direct"
    assert (5,) not in ln._c_table and (7,) in ln._c_table
    ln.fast(x, out, 7)  # its entry was the same binary's: one failed C launch, then Python
    assert len(entered) == 10 and stub.stub_calls() == 11 and (7,) not in ln._c_table
    ln.fast(x, out, 300)  # another bucket's direct launch: the same, found on its own
    assert len(entered) == 11 and stub.stub_calls() == 13 and log[-1][:4] == (
        "direct", "kernel", (2, 1, 1), (300,)
    )  # fmt: skip
    ln.fast(x, out, 300)
    assert len(entered) == 12 and stub.stub_calls() == 13
    print("ok")


if __name__ == "__main__":
    check_sized_c_launches(sys.argv[1])
