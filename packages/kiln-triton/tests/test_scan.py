"""Scans (cumsum, cumprod) through kiln-triton under Triton's interpreter: generated source
for the persistent and looped shapes, an op sweep over dims, layouts, sizes and dtypes
compared with eager, and model-style uses (HF position ids from an attention mask, a
training step through cumsum's backward)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn
from batch import Case, build_graph, make
from test_kernel import in_order, kernels_of

import kiln_triton
from kiln_inductor import compile_aten_graph
from kiln_triton.config import settings_scope
from kiln_triton.testing import use_triton_for_cpu

aten = torch.ops.aten
F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
I64, I32, BOOL = torch.int64, torch.int32, torch.bool
# the interpreter runs blocks of at most 1024 along the scanned axis: longer ones loop
LONG = 2500


def factors(shape, dtype=F32, device="cpu"):
    """Random factors near 1 (never zero), so long products neither vanish nor overflow."""
    return (1 + 0.01 * make(shape, F64)).to(dtype).to(device)


def _check(got, expected, n, label=""):
    """Compare with eager: sums of n terms err in absolute terms (a blocked order against
    eager's sequential one), products in relative terms."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    low = expected.dtype in (BF16, F16)
    if "cumprod" in label and expected.dtype.is_floating_point:
        # low precision: computed in float32, rounded once to the output type
        eps = 1e-6 if expected.dtype == F32 else 1e-13
        tol = {"rtol": 1e-2 if low else eps * (1 + n**0.5), "atol": 1e-30}
    elif low:
        tol = {"rtol": 2e-2, "atol": 2e-2 * max(1.0, n**0.5)}
    elif expected.dtype == F32:
        tol = {"rtol": 1e-4, "atol": 2e-6 * max(1.0, n)}
    else:
        tol = {"rtol": 1e-10, "atol": 1e-10} if expected.dtype == F64 else {}
    torch.testing.assert_close(got, expected, equal_nan=True, **tol)


# -- generated source ----------------------------------------------------------------------


def test_persistent_cumsum_scans_the_row_with_its_prologue_fused():
    def fn(x):
        return (aten.cumsum.default(aten.mul.Tensor(x, 2), 1),)

    kernels, (src,) = kernels_of(fn, [make((6, 70), F32)])
    assert kernels[0].kind == "persistent" and kernels[0].rblock == 128
    in_order(
        src,
        "rmask0 = rbase < 70",
        "tl.load(in_ptr0 + ((70 * x0) + r0_0), (xmask & rmask0), other=0)",
        " * ",
        "tl.where((xmask & rmask0), ",
        ", 0.0)",
        "tl.cumsum(",
        ", 1)",
        "tl.store(out_ptr0 + ((70 * x0) + r0_0), ",
    )
    assert src.count("tl.load(") == 1


def test_long_scans_loop_with_a_carry():
    def fn(x):
        return (aten.cumprod.default(x, 0),)

    kernels, (src,) = kernels_of(fn, [factors((LONG, 5))], persistent_max=64)
    assert kernels[0].kind == "looped"
    in_order(
        src,
        "carry0 = tl.full([XBLOCK, 1], 1.0, tl.float32)",
        f"for roffset in range(0, {LONG}, RBLOCK):",
        "tl.load(in_ptr0 + ((5 * z0_0) + x0)",
        "tl.where((xmask & rmask), ",
        "tl.cumprod(",
        "(carry0 * ",
        "tl.store(out_ptr0 + ((5 * z0_0) + x0)",
        "carry0 = tl.sum(tl.where(rbase == RBLOCK - 1, ",
    )


def test_scans_across_memory_loop_over_wide_chunks():
    # cumsum over dim 0 of a row-major matrix: a persistent program would read one strided
    # column; chunks of XBLOCK neighbouring columns read memory in order
    def fn(x):
        return (aten.cumsum.default(x, 0), aten.cumsum.default(x, 1))

    kernels, sources = kernels_of(fn, [make((40, 64), F32)])
    kinds = {k.kind for k in kernels}
    assert kinds == {"looped", "persistent"}
    looped = sources[[k.kind for k in kernels].index("looped")]
    in_order(looped, "for roffset in range(0, 40, RBLOCK):", "tl.load(in_ptr0 + ((64 * z0_0) + x0)")


def test_cumsum_is_generated_not_run_eagerly():
    from kiln_inductor.testing import aten_graph

    def fn(x):
        return (aten.cumsum.default(x, 1),)

    x = make((4, 9), F32)
    with use_triton_for_cpu():
        compiled = compile_aten_graph(aten_graph(fn, [x]), [x])
    assert "aten.cumsum" not in compiled.wrapper_source
    _check(compiled(x)[0], fn(x)[0], 9, "cumsum")


# -- the sweep -------------------------------------------------------------------------------


def _sweep_cases(long: bool, device: str = "cpu", n: int = 0) -> list[tuple[Case, int]]:
    """(case, scanned extent) pairs: every op, dim, layout and dtype the sweep covers."""
    n = n or (LONG if long else 37)
    out: list[tuple[Case, int]] = []

    def mk(shape, dtype, domain="any"):
        return make(shape, dtype, domain, device=device)

    def fac(shape, dtype=F32):
        return factors(shape, dtype, device)

    def add(label, fn, x, extent):
        out.append((Case(label, fn, (x,)), extent))

    cumsum, cumprod = aten.cumsum.default, aten.cumprod.default
    for dt in (F32, F64, BF16, F16):
        add(f"cumsum/last/{dt}", lambda t: cumsum(t, -1), mk((5, n), dt), n)
        add(f"cumsum/first/{dt}", lambda t: cumsum(t, 0), mk((n, 6), dt), n)
        add(f"cumprod/last/{dt}", lambda t: cumprod(t, 1), fac((4, n), dt), n)
    add("cumsum/middle", lambda t: cumsum(t, 1), mk((3, n, 4), F32), n)
    add("cumprod/middle", lambda t: cumprod(t, 1), fac((3, n, 4)), n)
    add("cumsum/transposed", lambda t: cumsum(t, 1), mk((n, 7), F32).t(), n)
    add("cumsum/strided", lambda t: cumsum(t, 0), mk((2 * n, 6), F32)[::2, 1:], n)
    add("cumsum/1d", lambda t: cumsum(t, 0), mk((n,), F32), n)
    add("cumsum/prologue", lambda t: cumsum(aten.exp.default(aten.mul.Tensor(t, 0.5)), 1),
        mk((4, n), F32), n)  # fmt: skip
    add("cumsum/int64", lambda t: cumsum(t, 1), mk((5, n), I64), n)
    add("cumsum/int32->int64", lambda t: cumsum(t, 1), mk((5, n), I32), n)
    add("cumsum/bool->int64", lambda t: cumsum(t, 1), mk((5, n), BOOL), n)
    signs = mk((5, n), I64, "pos") % 2 * 2 - 1  # +-1: long products stay exact and nonzero
    add("cumprod/int64", lambda t: cumprod(t, 1), signs, n)
    add("cumprod/bool->int64", lambda t: cumprod(t, 0), mk((n, 3), BOOL), n)
    add("cumsum/uint8->int64", lambda t: cumsum(t, 0), mk((n, 3), torch.uint8, "pos"), n)
    add("cumsum/dtype=int16", lambda t: cumsum(t, 1, dtype=torch.int16), mk((5, n), I32), n)
    add(
        "cumprod/dtype=int16", lambda t: cumprod(t, 1, dtype=torch.int16), mk((5, n), I64, "pos"), n
    )
    add("cumsum/dtype=f64", lambda t: cumsum(t, 1, dtype=F64), mk((5, n), F32), n)
    add("cumsum/dtype=f32", lambda t: cumsum(t, 1, dtype=F32), mk((5, n), BF16), n)
    if not long:
        add("cumsum/size1", lambda t: cumsum(t, 1), mk((6, 1), F32), 1)
        add("cumprod/size1", lambda t: cumprod(t, 0), mk((1, 5), F32), 1)
        add("cumsum/all-size1", lambda t: cumsum(t, 0), mk((1, 1), I64), 1)
        add("cumsum/0d", lambda t: cumsum(t, 0), mk((), F32), 1)
        add("cumsum/empty", lambda t: cumsum(t, 1), mk((0, 5), F32), 5)
        add("cumsum/empty-axis", lambda t: cumsum(t, 1), mk((4, 0), F32), 0)
    return out


@pytest.fixture(scope="module", params=["persistent", "looped"])
def sweep(request):
    """One graph of every case, compiled with the kernel sources recorded."""
    long = request.param == "looped"
    cases = _sweep_cases(long)
    gm, flat, outputs, _ = build_graph([c for c, _ in cases])
    labels = [label for label, _ in outputs]
    sources: list[str] = []
    with settings_scope(persistent_max=64 if long else 8192), use_triton_for_cpu() as backend:
        codegen = backend.codegen_kernel

        def recording(group, buffers):
            src = codegen(group, buffers)
            sources.append(src.source)
            return src

        backend.codegen_kernel = recording
        compiled = compile_aten_graph(gm, flat)
        got = compiled(*flat)
    return request.param, cases, labels, got, compiled, sources


def test_scan_sweep_generates_every_scan(sweep):
    kind, cases, _, _, compiled, sources = sweep
    assert compiled.stats["fallbacks"] == []
    scans = [s for s in sources if "tl.cumsum(" in s or "tl.cumprod(" in s]
    # every case but the empty, 0-d and size-1 ones scans in a kernel
    assert len(scans) >= len([c for c, n in cases if n > 1]) - 1
    if kind == "looped":
        assert all("carry" in s for s in scans if f"range(0, {LONG}, RBLOCK)" in s)
        assert sum(f"range(0, {LONG}, RBLOCK)" in s for s in scans) >= len(cases) - 2


def test_scan_sweep_matches_eager(sweep):
    _, cases, labels, got, _, _ = sweep
    expected = [e for c, _ in cases for e in _outputs(c)]
    extent = {c.label: n for c, n in cases}
    failures = []
    for label, e, g in zip(labels, expected, got, strict=True):
        try:
            _check(g, e, extent[label], label)
        except AssertionError as err:
            failures.append(f"{label}: {err}")
    assert not failures, "\n".join(failures)


def _outputs(case: Case) -> tuple:
    r = case.fn(*case.inputs)
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


# -- model-style uses ----------------------------------------------------------------------


class PositionIds(nn.Module):
    """Position ids from a left-padded attention mask, as HF decoders compute them, then
    position embeddings added to token embeddings."""

    def __init__(self, vocab: int = 50, ctx: int = 40, d: int = 16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = attention_mask.long().cumsum(-1) - 1
        position_ids = position_ids.masked_fill(attention_mask == 0, 1)
        return self.tok(ids) + self.pos(position_ids)


def test_position_ids_from_attention_mask_match_eager():
    torch.manual_seed(0)
    model = PositionIds().eval()
    ids = torch.randint(0, 50, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    mask[2, :7] = 0
    with use_triton_for_cpu(), torch.no_grad():
        compiled = torch.compile(model, backend=kiln_triton.compile_fx)
        torch.testing.assert_close(compiled(ids, mask), model(ids, mask))
        mask2 = (torch.rand(3, 12) > 0.3).long()  # new values, same graph
        torch.testing.assert_close(compiled(ids, mask2), model(ids, mask2))


def test_cumsum_training_step_matches_eager():
    torch.manual_seed(0)
    w = torch.randn(5, 30, requires_grad=True)
    x = torch.randn(5, 30, requires_grad=True)

    def fn(x, w):
        return (torch.cumsum(torch.tanh(x) * w, 1) * 0.1).sin().sum()

    with use_triton_for_cpu():
        compiled = torch.compile(fn, backend=kiln_triton.compile_fx)
        loss = compiled(x, w)
        loss.backward()
    grads = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    expected = fn(x, w)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads, (x.grad, w.grad), rtol=1e-4, atol=1e-5)


# -- Triton's real compiler ----------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="Triton's CUDA compiler ships for Linux")
def test_scan_kernels_compile_for_sm90(tmp_path):
    from test_compile_for_gpu import _compile_for_sm90, _sources

    cumsum, cumprod = aten.cumsum.default, aten.cumprod.default
    sources = []
    # the scanned axis along memory (last dim) and across it (first dim: x is contiguous)
    sources += _sources(lambda t: (cumsum(aten.mul.Tensor(t, 2), 1),), [make((64, 1000), F32)])
    sources += _sources(lambda t: (cumsum(t, 0),), [make((1000, 64), BF16)])
    sources += _sources(lambda t: (cumprod(t, 1),), [make((8, 5000), F64)], 256)
    sources += _sources(lambda t: (cumsum(t, 1),), [make((8, 5000), BOOL)], 256)
    sources += _sources(lambda t: (cumsum(t, 1, dtype=torch.int16),), [make((8, 5000), I64)], 256)
    sources += _sources(lambda t: (cumprod(t, 1),), [make((64, 1), F32)])
    scans = [s for s in sources if "tl.cum" in s.source]
    assert len(scans) == 6
    reports = _compile_for_sm90(scans, tmp_path)
    for src, rep in zip(scans, reports):
        assert "error" not in rep, f"{rep['error']}\n{src.source}"
        assert rep["configs"]
