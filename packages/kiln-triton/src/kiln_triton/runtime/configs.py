"""Launch configurations: the candidates autotuning measures, per kernel shape.

A configuration is ``XBLOCK`` (outer iterations per program), ``RBLOCK`` (row chunk of
2-D kernels; fixed to the whole row for persistent ones), ``num_warps`` and
``num_stages``. Default mode keeps the few heuristically best candidates (one for small
pointwise kernels); ``max_autotune`` measures all of them. Triton's interpreter runs
programs one after another in NumPy, so there the largest blocks are fastest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LaunchConfig:
    XBLOCK: int
    RBLOCK: int
    num_warps: int
    num_stages: int = 1

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# the largest RBLOCK a looped reduction is launched with (every RBLOCK is a power of two)
MAX_LOOPED_RBLOCK = 4096


def looped_rows_divide(n: int, extent: int) -> bool:
    """Whether every RBLOCK a looped kernel whose longest row has ``extent`` elements may
    be launched with (``candidate_configs``, ``interpreter_config``: powers of two up to
    ``min(MAX_LOOPED_RBLOCK, next power of two of extent)``) divides ``n``, the length of
    one of its rows: then no chunk of that row has lanes past its end (no r mask)."""
    return n > 0 and n % min(MAX_LOOPED_RBLOCK, _np2(max(extent, n))) == 0


def _np2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _warps(elements: int, lo: int = 1, hi: int = 16) -> int:
    """About 8 elements per thread, a power of two in [lo, hi]."""
    w = _np2(max(elements // 256, 1))
    return max(lo, min(hi, w))


def _dedupe(configs: list[LaunchConfig]) -> list[LaunchConfig]:
    out: list[LaunchConfig] = []
    for c in configs:
        if c not in out:
            out.append(c)
    return out


def candidate_configs(meta: dict[str, Any], exhaustive: bool) -> list[LaunchConfig]:
    kind, xnumel = meta["kind"], max(int(meta["xnumel"]), 1)
    xcap = _np2(xnumel)
    if kind == "pointwise":
        sizes = [1024, 2048, 512, 4096] if exhaustive else [1024, 2048]
        out = []
        for xb in sizes:
            xb = min(xb, xcap)
            out.append(LaunchConfig(xb, 1, _warps(xb, 1, 8)))
            if exhaustive:
                out.append(LaunchConfig(xb, 1, _warps(xb // 2, 1, 8)))
        if not exhaustive and xnumel < (1 << 20):
            out = out[:1]
        return _dedupe(out)
    if kind == "persistent":
        rb = int(meta["rblock"])
        out = []
        # rows of 4096+ elements: one row per program, or two (about 1% faster for a
        # float32 layer_norm over (32768, 4096) on the H200, the rows' loads overlapping)
        default = [4096, 1024] if rb < 4096 else [4096, 2 * rb]
        for budget in [4096, 1024, 8192, 2048, 16384] if exhaustive else default:
            xb = max(1, min(xcap, budget // rb, 128))
            out.append(LaunchConfig(xb, rb, _warps(xb * rb)))
            out.append(LaunchConfig(xb, rb, _warps(xb * rb // 2)))
        if not exhaustive and xnumel * rb < (1 << 16):
            out = out[:1]
        if meta.get("columns"):
            out = [*_column_configs(xcap, rb), *out]
        return _dedupe(out)
    extent = max(int(meta["extent"]), 1)
    pairs = [(1, 2048), (4, 512), (64, 16), (8, 256), (1, MAX_LOOPED_RBLOCK), (16, 64), (32, 32)]
    if not exhaustive:
        pairs = pairs[:3]
    if meta.get("columns"):  # rows strided in memory: wide x tiles, short row chunks
        pairs = [(128, 8), (64, 16), (32, 32), *pairs]
    out = []
    for xb, rb in pairs:
        xb, rb = max(1, min(xb, xcap)), max(1, min(rb, _np2(extent)))
        out.append(LaunchConfig(xb, rb, _warps(xb * rb, 2, 8)))
    if extent >= 4096:
        # long rows streamed by one program of 16 warps (H200, float32 layer_norm over
        # 4096-element rows: 0.254 ms, against 0.263 with 8 warps)
        out.insert(1, LaunchConfig(1, 2048, 16))
    return _dedupe(out)


def _column_configs(xcap: int, rb: int) -> list[LaunchConfig]:
    """Persistent column reductions (``meta["columns"]``: the row is strided, the outputs
    contiguous): 32-64 adjacent columns per program, so that each load of a row reads whole
    128-byte lines, at about 32 elements per thread."""
    return [
        LaunchConfig(max(1, min(xcap, xb)), rb, _warps(min(xcap, xb) * rb // 4, 4, 16))
        for xb in (64, 32)
    ]


def xblocks_divide(meta: dict[str, Any]) -> bool:
    """Whether every XBLOCK a kernel with ``meta`` may be launched with (any candidate of
    either mode, or the interpreter's) divides its ``xnumel``: then no program has rows
    past the end (no x mask). A cached autotuning winner is only used when it is one of
    today's candidates (``TritonLauncher.choose``), so this holds for it too."""
    n = int(meta["xnumel"])
    configs = [*candidate_configs(meta, True), *candidate_configs(meta, False)]
    return n > 0 and all(n % c.XBLOCK == 0 for c in [*configs, interpreter_config(meta)])


def interpreter_config(meta: dict[str, Any]) -> LaunchConfig:
    kind, xcap = meta["kind"], _np2(max(int(meta["xnumel"]), 1))
    if kind == "pointwise":
        return LaunchConfig(min(xcap, 1 << 16), 1, 4)
    rb = (
        int(meta["rblock"])
        if kind == "persistent"
        else min(_np2(max(int(meta["extent"]), 1)), 1024)
    )
    return LaunchConfig(max(1, min(xcap, (1 << 16) // rb)), rb, 4)
