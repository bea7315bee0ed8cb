"""Host time of one kernel launch through kiln-triton's direct launch path, on the CPU.

    python benchmarks/triton_launch_overhead.py [--calls 200000]

A direct launch (runtime/direct.py) checks the 16-byte alignment of some arguments, checks
for launch hooks, reads the current stream and calls the kernel's compiled launcher. This
times that Python path with the launcher replaced by a no-op (no GPU needed: what is left
is exactly the host work kiln adds per kernel), for a kernel of ``--args`` tensor
arguments whose alignment is checked for all of them (what every launch did before the
backend named the arguments to check), for one (a kernel reading one graph input), and
for none (a kernel reading only intermediates). It also counts, over the kernels of
kiln_triton.testing.SmallGPT's inference graph (compiled for CPU tensors through Triton's
interpreter; nothing is run), how many arguments each call still checks. Prints tables;
JSON goes to benchmarks/results/triton_launch_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton: compile for CPU tensors

import torch

import kiln_triton
from kiln_triton.runtime import direct
from kiln_triton.runtime.launcher import TritonLauncher
from kiln_triton.testing import SmallGPT, use_triton_for_cpu


class _Driver:
    get_current_device = staticmethod(lambda: 0)
    get_current_stream = staticmethod(lambda device: 0)


class _Kernel:
    """A CompiledKernel whose launcher does nothing."""

    function, packed_metadata = "function", "metadata"

    @staticmethod
    def run(*args: object) -> None:
        return None


class _Param:
    def __init__(self, name: str):
        self.name = name


def _launcher(n_args: int, checked: list[int] | None) -> tuple[TritonLauncher, tuple]:
    class Fn:
        params = [_Param(f"arg{i}") for i in range(n_args)] + [_Param("XBLOCK"), _Param("RBLOCK")]

    args = tuple(torch.empty(64) for _ in range(n_args))
    meta = {"kind": "pointwise", "xnumel": 64}
    if checked is not None:
        meta["checked_args"] = checked
    launcher = TritonLauncher(Fn, meta, "key", None)  # type: ignore[arg-type]
    launcher._direct = direct.DirectLaunch.build(
        Fn, _Kernel(), args, {"XBLOCK": 64, "RBLOCK": 1}, (1,), checked
    )
    assert launcher._direct is not None and launcher._direct(args)
    return launcher, args


def _us_per_call(fn, args: tuple, calls: int) -> float:
    """Microseconds per call: the least disturbed of 7 rounds (timeit's estimator)."""
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return min(rounds)


def checked_in_small_gpt() -> dict[str, int]:
    """Kernels, kernel arguments and checked arguments of SmallGPT's forward graph."""
    model = SmallGPT().eval()
    idx = torch.randint(0, 1024, (1, 64))
    metas: list = []
    with use_triton_for_cpu() as backend, torch.no_grad():
        codegen = backend.codegen_kernel

        def record(group, buffers):  # type: ignore[no-untyped-def]
            src = codegen(group, buffers)
            metas.append(src)
            return src

        backend.codegen_kernel = record  # type: ignore[method-assign]
        torch.compile(model, backend=kiln_triton.compile_fx)(idx)
    return {
        "kernels": len(metas),
        "arguments": sum(len(s.arg_names) for s in metas),
        "checked": sum(len(s.meta["checked_args"]) for s in metas),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--args", type=int, default=6)
    ns = parser.parse_args()
    direct.driver = type("D", (), {"active": _Driver})()
    n = ns.args
    rows = []
    empty = _us_per_call(lambda *a: None, tuple(range(n)), ns.calls)
    for label, checked in [
        (f"all {n} checked (as before)", None),
        ("1 checked (one graph input)", [0]),
        ("none checked (intermediates)", []),
    ]:
        launcher, args = _launcher(n, checked)
        us = _us_per_call(launcher, args, ns.calls)
        rows.append(
            {"case": label, "us_per_launch": round(us, 3), "minus_call": round(us - empty, 3)}
        )
    print(f"{'case':34} {'us/launch':>10} {'minus an empty call':>20}")
    for r in rows:
        print(f"{r['case']:34} {r['us_per_launch']:>10.2f} {r['minus_call']:>20.2f}")
    gpt = checked_in_small_gpt()
    print(
        f"SmallGPT forward: {gpt['kernels']} kernels, {gpt['arguments']} arguments per call, "
        f"{gpt['checked']} checked (graph inputs and ATen results; was {gpt['arguments']})"
    )
    out = Path(__file__).resolve().parent / "results" / "triton_launch_overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"calls": ns.calls, "args": n, "rows": rows, "small_gpt": gpt}, indent=1)
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
