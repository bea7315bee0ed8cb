"""ReductionCodegen: the reduction blocks of a Triton kernel.

Inside ``TritonKernel.r_region`` a block's body is evaluated over ``[XBLOCK, RBLOCK]``
tiles. A persistent kernel reduces the whole row at once (``tl.sum``, or ``tl.reduce`` with
a NaN-propagating max/min or a product); a looped kernel keeps ``[XBLOCK, RBLOCK]``
accumulators across chunks and reduces them after the loop. Results are ``[XBLOCK, 1]``
values stored (or kept in registers) after the region, in the x context.

argmax/argmin keep the first index of the extreme value (NaN counts as the extreme, as in
eager). Welford mean/M2 pairs over one body share one computation: persistent, the mean,
then the sum of squared deviations from it; looped, one pass of per-lane Welford updates
merged across lanes with ``libm.welford_combine``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kiln_inductor.ir.nodes import ComputedBuffer, Reduction
from kiln_inductor.ir.symbols import product
from kiln_inductor.scheduler.fuse import Block

from .triton_ops import TritonValue, tl_type

if TYPE_CHECKING:
    from .kernel import TritonKernel

TILE = "[XBLOCK, RBLOCK]"
BIG_INDEX = 2**31 - 1


def _extreme(dtype: torch.dtype, low: bool) -> str:
    if dtype.is_floating_point:
        return "float('-inf')" if low else "float('inf')"
    info = torch.iinfo(dtype)
    return str(info.min if low else info.max)


def _compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class _Acc:
    """One non-Welford reduction node: its accumulator, update and result."""

    def __init__(self, gen: ReductionCodegen, node: ComputedBuffer, k: int):
        body = node.body
        assert isinstance(body, Reduction)
        self.gen, self.node, self.type = gen, node, body.reduction_type
        is_ext = self.type in ("max", "min", "argmax", "argmin")
        self.dtype = _compute(body.src_dtype if is_ext else body.dtype)
        if self.dtype == torch.bool and self.type in ("max", "min"):
            self.type = "any" if self.type == "max" else "all"
        if self.dtype == torch.bool and self.type.startswith("arg"):
            self.dtype = torch.int8
        self.name = f"acc{k}"

    @property
    def k(self) -> TritonKernel:
        return self.gen.kernel

    def _value(self, v: TritonValue) -> TritonValue:
        if self.type in ("any", "all"):
            return self.k.h.to_dtype(v, torch.bool)
        return self.k.h.to_dtype(v, self.dtype)

    def _fill(self) -> str:
        t = self.type
        if t == "sum" or t == "any":
            return "0"
        if t in ("prod", "all"):
            return "1"
        return _extreme(self.dtype, low=t in ("max", "argmax"))

    def _combine(self) -> str:
        big = "max" in self.type
        if self.dtype.is_floating_point:
            return "libm.max_nan" if big else "libm.min_nan"
        return "tl.maximum" if big else "tl.minimum"

    def _reduce(self, tile: str) -> str:
        t = self.type
        if t == "sum":
            return f"tl.sum({tile}, 1)[:, None]"
        if t == "prod":
            return f"tl.reduce({tile}, 1, libm.prod_combine)[:, None]"
        if t == "any":
            return f"(tl.max({tile}, 1)[:, None] != 0)"
        if t == "all":
            return f"(tl.min({tile}, 1)[:, None] != 0)"
        return f"tl.{t}({tile}, 1)[:, None]"

    def _masked(self, v: TritonValue) -> str:
        tile = f"tl.where({self.k.mask_text()}, {v}, {self._fill()})"
        if self.type in ("any", "all"):
            tile = f"{tile}.to(tl.int8)"
        return tile

    # persistent: the whole row at once
    def persistent(self, v: TritonValue, flat: str) -> TritonValue:
        h = self.k.h
        v = self._value(v)
        tile = h.value(self._masked(v), self.dtype)
        if not self.type.startswith("arg"):
            return self._reduce_value(tile.name)
        return self._arg_final(tile.name, f"({flat} + xrzero)", in_region=True)

    # looped: accumulate chunk by chunk
    def init(self) -> None:
        t = tl_type(torch.int8 if self.type in ("any", "all") else self.dtype)
        self.k.emit(f"{self.name} = tl.full({TILE}, {self._fill()}, {t})")
        if self.type.startswith("arg"):
            self.k.emit(f"{self.name}_i = tl.full({TILE}, 0, tl.int32)")

    def update(self, v: TritonValue, flat: str) -> None:
        v = self._value(v)
        tile = self._masked(v)
        a = self.name
        if self.type == "sum":
            self.k.emit(f"{a} = {a} + {tile}")
        elif self.type == "prod":
            self.k.emit(f"{a} = {a} * {tile}")
        elif self.type in ("any", "all"):
            fn = "tl.maximum" if self.type == "any" else "tl.minimum"
            self.k.emit(f"{a} = {fn}({a}, {tile})")
        elif self.type in ("max", "min"):
            self.k.emit(f"{a} = {self._combine()}({a}, {tile})")
        else:
            cmp = ">" if self.type == "argmax" else "<"
            self.k.emit(f"{a}_v = {tile}")
            nan = f" | (({a}_v != {a}_v) & ({a} == {a}))" if self.dtype.is_floating_point else ""
            self.k.emit(f"{a}_take = ({a}_v {cmp} {a}){nan}")
            self.k.emit(f"{a} = tl.where({a}_take, {a}_v, {a})")
            self.k.emit(f"{a}_i = tl.where({a}_take, {flat} + xrzero, {a}_i)")

    def final(self) -> TritonValue:
        if self.type.startswith("arg"):
            return self._arg_final(self.name, f"{self.name}_i", in_region=False)
        return self._reduce_value(self.name)

    def _reduce_value(self, tile: str) -> TritonValue:
        h = self.k.h
        dtype = torch.bool if self.type in ("any", "all") else self.dtype
        out = h.value(self._reduce(tile), dtype)
        if self.type in ("max", "min") and self.dtype.is_floating_point:
            # tl.max/tl.min ignore NaN on GPUs; eager propagates it
            nan = h.value(f"tl.max(({tile} != {tile}).to(tl.int8), 1)[:, None]", torch.int8)
            out = h.value(f"tl.where({nan} != 0, float('nan'), {out})", dtype)
        return out

    def _arg_final(self, values: str, indices: str, in_region: bool) -> TritonValue:
        h = self.k.h
        best = h.value(f"tl.{self.type[3:]}({values}, 1)[:, None]", self.dtype)
        cand = f"({values} == {best})"
        if self.dtype.is_floating_point:  # the first NaN wins when there is one
            nan = h.value(f"tl.max(({values} != {values}).to(tl.int8), 1)[:, None]", torch.int8)
            cand = f"tl.where({nan} != 0, {values} != {values}, {cand})"
        if in_region:
            cand = f"({cand} & {self.k.mask_text()})"
        idx = h.value(f"tl.min(tl.where({cand}, {indices}, {BIG_INDEX}), 1)[:, None]", torch.int32)
        return h.to_dtype(idx, torch.int64)


class ReductionCodegen:
    def __init__(self, kernel: TritonKernel, k: int, block: Block):
        self.kernel, self.k, self.block = kernel, k, block

    def _eval(self, node: ComputedBuffer, subs: dict[Any, Any]) -> TritonValue:
        vs, rvs, _ = self.kernel._vars(node, subs)
        return node.body.inner_fn(vs, rvs)  # type: ignore[union-attr]

    def _region(self, body: Any) -> None:
        b = self.block
        self.kernel.r_region(self.k, b, list(b.rvars), list(b.rranges), body)

    def _store(self, node: ComputedBuffer, value: TritonValue) -> None:
        _, _, store = self.kernel._vars(node, {})
        self.kernel.store(node, value, store)

    def generate(self) -> None:
        if self.block.kind == "welford":
            self.welford()
            return
        kern = self.kernel
        base = kern.h.count
        kern.h.count += len(self.block.nodes)
        accs = [_Acc(self, n, base + i) for i, n in enumerate(self.block.nodes)]
        results: dict[str, TritonValue] = {}
        if kern.kind == "persistent":

            def body(block: Block, subs: dict[Any, Any], flat: str) -> None:
                for a in accs:
                    results[a.node.name] = a.persistent(self._eval(a.node, subs), flat)

            self._region(body)
        else:
            for a in accs:
                a.init()

            def body(block: Block, subs: dict[Any, Any], flat: str) -> None:
                for a in accs:
                    a.update(self._eval(a.node, subs), flat)

            self._region(body)
            for a in accs:
                results[a.node.name] = a.final()
        for a in accs:
            self._store(a.node, results[a.node.name])

    def welford(self) -> None:
        kern, h = self.kernel, self.kernel.h
        nodes = self.block.nodes
        groups: dict[int, list[ComputedBuffer]] = {}
        for n in nodes:
            groups.setdefault(id(n.body.inner_fn), []).append(n)  # type: ignore[union-attr]
        reps = [g[0] for g in groups.values()]
        dts = {id(r): _compute(r.body.src_dtype) for r in reps}  # type: ignore[union-attr]
        count = product(self.block.rranges)
        means: dict[int, TritonValue] = {}
        m2s: dict[int, TritonValue] = {}
        names = {id(r): f"wf{h.count + i}" for i, r in enumerate(reps)}
        h.count += len(reps)

        def value(r: ComputedBuffer, subs: dict[Any, Any]) -> TritonValue:
            return h.to_dtype(self._eval(r, subs), dts[id(r)])

        if kern.kind == "persistent":

            def body(block: Block, subs: dict[Any, Any], flat: str) -> None:
                for r in reps:
                    dt, m = dts[id(r)], kern.mask_text()
                    v = value(r, subs)
                    s = h.value(f"tl.sum(tl.where({m}, {v}, 0), 1)[:, None]", dt)
                    n = h.constant(int(count), dt) if count.is_Integer else h.index_expr(count, dt)
                    mean = h.truediv(s, n)
                    d = h.value(f"tl.where({m}, {v} - {mean}, 0)", dt)
                    means[id(r)] = mean
                    m2s[id(r)] = h.value(f"tl.sum({d} * {d}, 1)[:, None]", dt)

            self._region(body)
        else:
            # one pass: each lane keeps a running mean, M2 and count (Welford), merged
            # across lanes after the loop; the rows are read once, not twice
            for r in reps:
                a, t = names[id(r)], tl_type(dts[id(r)])
                for part in ("mean", "m2", "n"):
                    kern.emit(f"{a}_{part} = tl.full({TILE}, 0, {t})")

            def update(block: Block, subs: dict[Any, Any], flat: str) -> None:
                m = kern.mask_text()
                # a lane the mask lets through has seen one element per chunk so far
                # (only the last chunk masks r lanes), so one reciprocal per chunk serves
                # them all; with any other mask the lane's own count divides
                uniform = kern.extra_mask is None
                for r in reps:
                    a, t = names[id(r)], tl_type(dts[id(r)])
                    v = value(r, subs)
                    if uniform:
                        kern.emit(f"{a}_rc = 1.0 / tl.full([], roffset // RBLOCK + 1, {t})")
                    kern.emit(f"{a}_n = tl.where({m}, {a}_n + 1, {a}_n)")
                    kern.emit(f"{a}_d = {v} - {a}_mean")
                    step = f"{a}_d * {a}_rc" if uniform else f"{a}_d / {a}_n"
                    kern.emit(f"{a}_mean = tl.where({m}, {a}_mean + {step}, {a}_mean)")
                    kern.emit(f"{a}_m2 = tl.where({m}, {a}_m2 + {a}_d * ({v} - {a}_mean), {a}_m2)")

            self._region(update)
            for r in reps:
                dt, a = dts[id(r)], names[id(r)]
                kern.emit(
                    f"{a}_rm, {a}_rq, {a}_rn = tl.reduce(({a}_mean, {a}_m2, {a}_n), 1, "
                    "libm.welford_combine)"
                )
                means[id(r)] = h.value(f"{a}_rm[:, None]", dt)
                m2s[id(r)] = h.value(f"{a}_rq[:, None]", dt)
        for n in nodes:
            key = id(n.body.inner_fn)  # type: ignore[union-attr]
            rep = groups[key][0]
            is_mean = n.body.reduction_type == "welford_mean"  # type: ignore[union-attr]
            self._store(n, means[id(rep)] if is_mean else m2s[id(rep)])
