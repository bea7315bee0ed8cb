"""TemplateLauncher: runs a matmul template, or cuBLAS and the epilogue, whichever is faster.

On its first call (on the GPU) it times every tile configuration of the template
(``matmul_configs``) and the unfused alternative, the ATen matmul (cuBLAS) followed by the
epilogue's own kernel, on copies of the arguments, and keeps the fastest; the winner is
cached on disk like other autotuning results. Under Triton's interpreter it runs the
template with one small configuration (that is how CI tests the generated code).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import triton

from kiln_inductor import log
from kiln_inductor.ir.nodes import ExternKernel, StorageView
from kiln_inductor.runtime.cache import KernelCache, digest

from .direct import DirectLaunch


@dataclass(frozen=True)
class MatmulConfig:
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int
    num_warps: int
    num_stages: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


CUBLAS = "cublas+epilogue"


def matmul_configs(meta: dict[str, Any], exhaustive: bool) -> list[MatmulConfig]:
    """Tile shapes that suit Hopper-class GPUs for bf16/fp16 (and fp32, smaller K tiles)."""
    m, n, k = int(meta["M"]), int(meta["N"]), int(meta["K"])
    wide = meta.get("itemsize", 2) <= 2
    base = [
        (128, 128, 64, 8, 4),
        (128, 256, 64, 8, 3),
        (64, 128, 64, 8, 4),
        (128, 64, 64, 4, 4),
        (64, 64, 64, 4, 4),
    ]
    if exhaustive:
        base += [
            (256, 128, 64, 8, 3),
            (64, 256, 32, 4, 4),
            (32, 64, 32, 4, 5),
            (128, 128, 32, 4, 4),
        ]
    out: list[MatmulConfig] = []
    for bm, bn, bk, warps, stages in base:
        bk = bk if wide else min(bk, 32)
        cfg = MatmulConfig(
            max(16, min(bm, triton.next_power_of_2(m))),
            max(16, min(bn, triton.next_power_of_2(n))),
            max(16, min(bk, triton.next_power_of_2(k))),
            8,
            warps,
            stages,
        )
        if cfg not in out:
            out.append(cfg)
    return out


def _view(t: torch.Tensor, v: StorageView) -> torch.Tensor:
    lay = v.layout
    if lay == v.buffer.layout:
        return t
    return t.as_strided(
        tuple(int(s) for s in lay.size),
        tuple(int(s) for s in lay.stride),
        t.storage_offset() + int(lay.offset),
    )


def _extern_args(a: Any, named: dict[str, torch.Tensor]) -> Any:
    if isinstance(a, StorageView):
        return _view(named[a.buffer.name], a)
    if isinstance(a, (list, tuple)):
        return type(a)(_extern_args(x, named) for x in a)
    return a


class TemplateLauncher:
    def __init__(
        self,
        fn: Any,
        meta: dict[str, Any],
        key: str,
        extern: ExternKernel,
        product: str,
        arg_names: Sequence[str],
        epilogue_names: Sequence[str],
        epilogue: Callable[..., None],
        autotune: bool,
        exhaustive: bool,
        interpreting: bool,
    ):
        self.fn, self.meta, self.key = fn, meta, key
        self.extern, self.product = extern, product
        self.arg_names, self.epilogue_names = list(arg_names), list(epilogue_names)
        self.epilogue = epilogue
        self.autotune, self.exhaustive, self.interpreting = autotune, exhaustive, interpreting
        self.choice: MatmulConfig | str | None = None
        self._launch: Any = None
        self._kwargs: dict[str, int] = {}
        self._grid: tuple[int, int] = (1, 1)
        self._direct: DirectLaunch | None = None

    # -- the two ways ------------------------------------------------------------------------
    def unfused(self, args: Sequence[Any]) -> None:
        named = dict(zip(self.arg_names, args))
        result = self.extern.op(
            *_extern_args(self.extern.args, named),
            **{k: _extern_args(v, named) for k, v in self.extern.kwargs.items()},
        )
        named[self.product] = result
        self.epilogue(*(named[n] for n in self.epilogue_names))

    def grid(self, c: MatmulConfig) -> tuple[int, int]:
        m, n = int(self.meta["M"]), int(self.meta["N"])
        return (triton.cdiv(m, c.BLOCK_M) * triton.cdiv(n, c.BLOCK_N), int(self.meta["batch"]))

    def _select(self, choice: MatmulConfig | str) -> None:
        self.choice = choice
        if isinstance(choice, MatmulConfig):
            self._grid = self.grid(choice)
            self._launch = self.fn[self._grid]
            self._kwargs = choice.as_dict()

    def __call__(self, *args: Any) -> None:
        direct = self._direct
        if direct is not None and direct(args):
            return
        if self.choice is None:
            self._select(self.choose(args))
        if self.choice == CUBLAS:
            self.unfused(args)
            return
        kernel = self._launch(*args, **self._kwargs)
        if direct is None and not self.interpreting:
            self._direct = DirectLaunch.build(self.fn, kernel, args, self._kwargs, self._grid)

    # -- choosing ----------------------------------------------------------------------------
    def choose(self, args: Sequence[Any]) -> MatmulConfig | str:
        configs = matmul_configs(self.meta, self.exhaustive)
        if self.interpreting:
            return MatmulConfig(16, 16, 16, 4, 1, 1)
        device = torch.cuda.get_device_name(args[0].device)
        tkey = digest(self.key, device, str(self.exhaustive), "template")
        cache = KernelCache("triton-autotune")
        found = cache.lookup(tkey)
        if found is not None:
            saved = json.loads((found / "winner.json").read_text())
            return CUBLAS if saved == CUBLAS else MatmulConfig(**saved)
        if not self.autotune:
            return configs[0]
        timings = self.measure(configs, args)
        winner = min(timings, key=timings.get)  # type: ignore[arg-type]
        log.log(
            "kernels",
            f"matmul template {self.meta['M']}x{self.meta['N']}x{self.meta['K']}: {winner} "
            f"({timings[winner] * 1e3:.1f} us; {CUBLAS} {timings[CUBLAS] * 1e3:.1f} us)",
        )

        def build(tmp: Path) -> None:
            data = winner if winner == CUBLAS else winner.as_dict()  # type: ignore[union-attr]
            (tmp / "winner.json").write_text(json.dumps(data))

        cache.get_or_build(tkey, build)
        return winner

    def measure(self, configs: Sequence[MatmulConfig], args: Sequence[Any]) -> dict[Any, float]:
        from triton.testing import do_bench

        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        out: dict[Any, float] = {}
        for c in configs:
            launch, kw = self.fn[self.grid(c)], c.as_dict()
            try:
                launch(*copies, **kw)
                torch.cuda.synchronize()
                out[c] = float(do_bench(lambda f=launch, kw=kw: f(*copies, **kw), warmup=5, rep=20))
            except Exception as e:  # out of shared memory or registers for this tile
                log.log("kernels", f"matmul config {c} failed: {e}")
                out[c] = float("inf")
        self.unfused(copies)
        torch.cuda.synchronize()
        out[CUBLAS] = float(do_bench(lambda: self.unfused(copies), warmup=5, rep=20))
        return out
