"""TemplateLauncher: runs a matmul template, or cuBLAS and the epilogue, whichever is faster.

On its first call (on the GPU) it times every tile configuration of the template
(``matmul_configs``) and the unfused alternative, the ATen matmul (cuBLAS) followed by the
epilogue's own kernel, on copies of the arguments, and keeps the fastest; the winner is
cached on disk like other autotuning results. Under Triton's interpreter it runs the
template with one small configuration (that is how CI tests the generated code).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import triton

from kiln_inductor.ir.nodes import ExternKernel, StorageView

from ..config import TritonConfig
from .launcher import TritonLauncher


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


class TemplateLauncher(TritonLauncher):
    """A TritonLauncher whose choices are tile configurations of the template or
    ``CUBLAS``: the ATen matmul followed by the epilogue's own kernel."""

    def __init__(
        self,
        fn: Any,
        meta: dict[str, Any],
        key: str,
        cfg: TritonConfig,
        extern: ExternKernel,
        product: str,
        arg_names: Sequence[str],
        epilogue_names: Sequence[str],
        epilogue: Callable[..., None],
    ):
        super().__init__(fn, meta, key, cfg)
        self.extern, self.product = extern, product
        self.arg_names, self.epilogue_names = list(arg_names), list(epilogue_names)
        self.epilogue = epilogue

    def unfused(self, args: Sequence[Any]) -> None:
        named = dict(zip(self.arg_names, args))
        result = self.extern.op(
            *_extern_args(self.extern.args, named),
            **{k: _extern_args(v, named) for k, v in self.extern.kwargs.items()},
        )
        named[self.product] = result
        self.epilogue(*(named[n] for n in self.epilogue_names))

    def grid(self, config: Any) -> tuple[int, ...]:
        m, n = int(self.meta["M"]), int(self.meta["N"])
        blocks = triton.cdiv(m, config.BLOCK_M) * triton.cdiv(n, config.BLOCK_N)
        return (blocks, int(self.meta["batch"]))

    def candidates(self) -> list[Any]:
        configs: list[Any] = matmul_configs(self.meta, self.cfg.max_autotune)
        return [*configs, CUBLAS] if self.cfg.autotune else configs[:1]

    def interpreter_choice(self) -> Any:
        return MatmulConfig(16, 16, 16, 4, 1, 1)

    def encode(self, config: Any) -> Any:
        return CUBLAS if config == CUBLAS else config.as_dict()

    def decode(self, saved: Any) -> Any:
        return CUBLAS if saved == CUBLAS else MatmulConfig(**saved)

    def launcher_for(self, config: Any) -> Callable[..., Any]:
        if config == CUBLAS:
            return lambda *args: self.unfused(args)
        return super().launcher_for(config)

    def select(self, config: Any) -> None:
        if config != CUBLAS:
            super().select(config)
            return
        self.config, self._kwargs = config, {}
        self._launch = self.launcher_for(config)  # returns None: no direct launch is built
