"""The op sweep of kiln-inductor, run through kiln-triton in Triton's interpreter (CPU
tensors), compared with eager on random inputs.

The interpreter is slow, so this is a representative subset (CI budget: a few minutes):
  - pointwise: unary float ops (tl builtins and the interpreter's libm), integer ops,
    binary ops with broadcasting, 0-d, size-1, empty, transposed and strided inputs,
    scalar operands and mixed dtypes;
  - reductions: sum/mean/amax/amin/prod/any/all, argmax/argmin and max.dim, var/var_mean/
    std (Welford), softmax/log_softmax/logsumexp, layer_norm; rows that fit a block
    (persistent kernels) and rows that do not (looped kernels);
  - views: permute, transpose, expand, slice, select, reshape, split;
  - cat, stack, constant_pad_nd, gather, index, index_select, embedding;
  - bfloat16 inputs computed in float32;
  - scans (cumsum, cumprod) are swept in test_scan.py.
Left out here (they run in the GPU tests): asin/acos/atan/atan2/lgamma (libdevice only),
float64, and the long tail of lowerings the kiln-cpp sweep covers.
"""

from __future__ import annotations

import pytest
import torch
from batch import Case, assert_case, make, run_batch

from kiln_triton.config import settings_scope

aten = torch.ops.aten
F32, BF16, I64, BOOL = torch.float32, torch.bfloat16, torch.int64, torch.bool

VARIANTS = {
    "contig": lambda mk: mk((8, 33)),
    "noncontig": lambda mk: mk((33, 8)).t(),
    "strided": lambda mk: mk((8, 66))[:, ::2],
    "zerodim": lambda mk: mk(()),
    "size1": lambda mk: mk((1, 33)),
    "empty": lambda mk: mk((0, 33)),
}

UNARY = {
    **{
        n: (getattr(aten, n).default, d)
        for n, d in [
            ("exp", "any"), ("exp2", "any"), ("expm1", "any"), ("log", "pos"), ("log2", "pos"),
            ("log10", "pos"), ("log1p", "pos"), ("sqrt", "pos"), ("rsqrt", "pos"),
            ("sin", "any"), ("cos", "any"), ("tan", "unit"), ("sinh", "any"), ("cosh", "any"),
            ("tanh", "any"), ("asinh", "any"), ("atanh", "unit"), ("erf", "any"),
            ("erfc", "any"), ("sigmoid", "any"), ("reciprocal", "pos"), ("floor", "any"),
            ("ceil", "any"), ("round", "any"), ("trunc", "any"), ("frac", "any"),
            ("isinf", "any"), ("signbit", "any"), ("neg", "any"), ("abs", "any"),
            ("sign", "any"), ("relu", "any"), ("isnan", "any"), ("square", "any"),
        ]
    },
    "gelu": (lambda x: aten.gelu.default(x), "any"),
    "gelu_tanh": (lambda x: aten.gelu.default(x, approximate="tanh"), "any"),
    "silu": (aten.silu.default, "any"),
    "hardswish": (aten.hardswish.default, "any"),
    "clamp": (lambda x: aten.clamp.default(x, -0.5, 0.5), "any"),
    "pow_2_5": (lambda x: aten.pow.Tensor_Scalar(x, 2.5), "pos"),
    "to_i64": (lambda x: aten._to_copy.default(x, dtype=torch.int64), "any"),
    "to_bool": (lambda x: aten._to_copy.default(x, dtype=torch.bool), "any"),
    "to_bf16": (lambda x: aten._to_copy.default(x, dtype=torch.bfloat16), "any"),
}  # fmt: skip
INT_UNARY = {
    "neg": aten.neg.default,
    "abs": aten.abs.default,
    "sign": aten.sign.default,
    "bitwise_not": aten.bitwise_not.default,
    "to_f32": lambda x: aten._to_copy.default(x, dtype=torch.float32),
    "pow_3": lambda x: aten.pow.Tensor_Scalar(x, 3),
}


@pytest.fixture(scope="module")
def unary_results():
    cases = []
    for name, (fn, domain) in UNARY.items():
        for vname, variant in VARIANTS.items():
            cases.append(
                Case(f"{name}/{vname}", fn, (variant(lambda s, d=domain: make(s, F32, d)),))
            )
    for name, fn in INT_UNARY.items():
        for vname in ("contig", "noncontig", "zerodim"):
            cases.append(
                Case(f"int_{name}/{vname}", fn, (VARIANTS[vname](lambda s: make(s, I64)),))
            )
    return run_batch(cases)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_float32(unary_results, name):
    # the interpreter rounds float32 -> bfloat16 toward zero (GPUs round to nearest even)
    tol = {} if name == "to_bf16" else {"rtol": 1e-4, "atol": 1e-5}
    for vname in VARIANTS:
        assert_case(unary_results[f"{name}/{vname}"], **tol)


@pytest.mark.parametrize("name", list(INT_UNARY))
def test_unary_int64(unary_results, name):
    for vname in ("contig", "noncontig", "zerodim"):
        assert_case(unary_results[f"int_{name}/{vname}"])


BINARY = {
    "add": (aten.add.Tensor, [F32, I64, BOOL], "any"),
    "add_alpha": (lambda a, b: aten.add.Tensor(a, b, alpha=2), [F32, I64], "any"),
    "sub": (aten.sub.Tensor, [F32, I64], "any"),
    "mul": (aten.mul.Tensor, [F32, I64, BOOL], "any"),
    "div": (aten.div.Tensor, [F32, I64], "pos"),
    "div_floor": (lambda a, b: aten.div.Tensor_mode(a, b, rounding_mode="floor"), [F32, I64], "pos"),
    "div_trunc": (lambda a, b: aten.div.Tensor_mode(a, b, rounding_mode="trunc"), [F32, I64], "pos"),
    "remainder": (aten.remainder.Tensor, [F32, I64], "pos"),
    "fmod": (aten.fmod.Tensor, [F32, I64], "pos"),
    "pow": (aten.pow.Tensor_Tensor, [F32], "unit"),
    "maximum": (aten.maximum.default, [F32, I64, BOOL], "any"),
    "minimum": (aten.minimum.default, [F32, I64], "any"),
    "eq": (aten.eq.Tensor, [F32, I64, BOOL], "any"),
    "lt": (aten.lt.Tensor, [F32, I64], "any"),
    "ge": (aten.ge.Tensor, [F32, I64], "any"),
    "logical_and": (aten.logical_and.default, [F32, BOOL], "any"),
    "logical_xor": (aten.logical_xor.default, [I64, BOOL], "any"),
    "bitwise_and": (aten.bitwise_and.Tensor, [I64, BOOL], "any"),
    "bitwise_or": (aten.bitwise_or.Tensor, [I64], "any"),
    "where": (lambda a, b: aten.where.self(aten.gt.Tensor(a, b), a, b), [F32, I64], "any"),
    "masked_fill": (lambda a, b: aten.masked_fill.Scalar(a, aten.gt.Tensor(a, b), 3), [F32], "any"),
    "lerp": (lambda a, b: aten.lerp.Scalar(a, b, 0.3), [F32], "any"),
    "hypot": (aten.hypot.default, [F32], "any"),
    "copysign": (aten.copysign.Tensor, [F32], "any"),
}  # fmt: skip
BINARY_VARIANTS = {
    "contig": lambda mk: (mk((8, 33), "l"), mk((8, 33), "r")),
    "noncontig": lambda mk: (mk((33, 8), "l").t(), mk((8, 33), "r")),
    "strided": lambda mk: (mk((8, 66), "l")[:, ::2], mk((8, 99), "r")[:, 1::3]),
    "bcast_row": lambda mk: (mk((8, 33), "l"), mk((33,), "r")),
    "bcast_both": lambda mk: (mk((8, 1), "l"), mk((1, 33), "r")),
    "zerodim_rhs": lambda mk: (mk((8, 33), "l"), mk((), "r")),
    "empty": lambda mk: (mk((0, 33), "l"), mk((0, 33), "r")),
}
BINARY_PARAMS = [(n, dt) for n, (_, dts, _) in BINARY.items() for dt in dts]


@pytest.fixture(scope="module")
def binary_results():
    cases = []
    for name, (fn, dts, domain) in BINARY.items():
        for dt in dts:
            for vname, variant in BINARY_VARIANTS.items():
                a, b = variant(
                    lambda s, side, dt=dt, d=domain: make(s, dt, d if side == "r" else "any")
                )
                cases.append(Case(f"{name}/{dt}/{vname}", fn, (a, b)))
    return run_batch(cases)


@pytest.mark.parametrize(
    "name,dtype", BINARY_PARAMS, ids=[f"{n}-{str(d)[6:]}" for n, d in BINARY_PARAMS]
)
def test_binary(binary_results, name, dtype):
    for vname in BINARY_VARIANTS:
        assert_case(binary_results[f"{name}/{dtype}/{vname}"])


def test_scalar_operands_and_mixed_dtypes():
    x, i = make((8, 33), F32), make((8, 33), I64)
    cases = [
        Case("add_scalar", lambda t: aten.add.Tensor(t, 2.5), (x,)),
        Case("div_int_scalar", lambda t: aten.div.Tensor(t, 4), (i,)),
        Case("gt_scalar", lambda t: aten.gt.Scalar(t, 0.5), (x,)),
        Case("int_plus_float", lambda a, b: aten.add.Tensor(a, b), (i, x)),
        Case("pow_scalar_base", lambda t: aten.pow.Scalar(2.0, t), (make((8, 33), F32, "unit"),)),
        Case("remainder_scalar", lambda t: aten.remainder.Scalar(t, 3), (i,)),
    ]
    results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label])


def test_bfloat16_pointwise():
    a, b = make((8, 33), BF16), make((33,), BF16)
    cases = [
        Case("add_mul", lambda x, y: aten.mul.Tensor(aten.add.Tensor(x, y), 2), (a, b)),
        Case("gelu", lambda x: aten.gelu.default(x), (a,)),
        Case("tanh", aten.tanh.default, (a,)),
        Case("exp_noncontig", aten.exp.default, (make((33, 8), BF16).t(),)),
        Case("where", lambda x, y: aten.where.self(aten.gt.Tensor(x, y), x, y), (a, b)),
        Case("to_f32", lambda x: aten._to_copy.default(x, dtype=F32), (a,)),
        Case("from_f32", lambda x: aten._to_copy.default(x, dtype=BF16), (make((8, 33), F32),)),
    ]
    results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label])


REDUCTIONS = {
    "sum_last": lambda x: aten.sum.dim_IntList(x, [-1]),
    "sum_first_keep": lambda x: aten.sum.dim_IntList(x, [0], True),
    "sum_all": lambda x: aten.sum.default(x),
    "mean": lambda x: aten.mean.dim(x, [-1]),
    "amax": lambda x: aten.amax.default(x, [1]),
    "amin_keep": lambda x: aten.amin.default(x, [0], True),
    "prod": lambda x: aten.prod.dim_int(aten.add.Tensor(aten.tanh.default(x), 1), 1),
    "argmax": lambda x: aten.argmax.default(x, 1),
    "argmin": lambda x: aten.argmin.default(x, 0, True),
    "argmax_all": lambda x: aten.argmax.default(x),
    "max_dim": lambda x: aten.max.dim(x, 1),
    "min_dim": lambda x: aten.min.dim(x, 0, True),
    "any": lambda x: aten.any.dim(aten.gt.Scalar(x, 1.5), 1),
    "all": lambda x: aten.all.dim(aten.gt.Scalar(x, -1.5), 0),
    "var": lambda x: aten.var.correction(x, [1], correction=1),
    "var_mean": lambda x: aten.var_mean.correction(x, [0], correction=0, keepdim=True),
    "std_all": lambda x: aten.std.correction(x, None, correction=1),
    "softmax": lambda x: aten._softmax.default(x, -1, False),
    "softmax_dim0": lambda x: aten._softmax.default(x, 0, False),
    "log_softmax": lambda x: aten._log_softmax.default(x, 1, False),
    "logsumexp": lambda x: aten.logsumexp.default(x, [1]),
}
RED_VARIANTS = {
    "contig": lambda mk: mk((16, 300)),
    "noncontig": lambda mk: mk((300, 16)).t(),
    "strided": lambda mk: mk((16, 600))[:, ::2],
    "size1": lambda mk: mk((1, 7)),
}


def _reduction_batch(dtype, persistent_max):
    cases = []
    for name, fn in REDUCTIONS.items():
        for vname, variant in RED_VARIANTS.items():
            cases.append(Case(f"{name}/{vname}", fn, (variant(lambda s: make(s, dtype)),)))
    with settings_scope(persistent_max=persistent_max):
        return run_batch(cases)


@pytest.fixture(scope="module")
def persistent_results():
    return _reduction_batch(F32, 8192)


@pytest.fixture(scope="module")
def looped_results():
    return _reduction_batch(F32, 64)  # rows longer than 64 loop in chunks


@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("kind", ["persistent", "looped"])
def test_reduction_float32(request, kind, name):
    results = request.getfixturevalue(f"{kind}_results")
    for vname in RED_VARIANTS:
        assert_case(results[f"{name}/{vname}"], rtol=1e-4, atol=1e-4)


def test_reductions_int64_and_bool():
    x, b = make((16, 300), I64), make((16, 300), BOOL)
    cases = [
        Case("sum", lambda t: aten.sum.dim_IntList(t, [1]), (x,)),
        Case("amax", lambda t: aten.amax.default(t, [0]), (x,)),
        Case("argmin", lambda t: aten.argmin.default(t, 1), (x,)),
        Case("max_dim_noncontig", lambda t: aten.max.dim(t, 1), (make((300, 16), I64).t(),)),
        Case("sum_bool", lambda t: aten.sum.dim_IntList(t, [1]), (b,)),
        Case("any_bool", lambda t: aten.any.dim(t, 0), (b,)),
        Case("all_bool", lambda t: aten.all.dim(t, 1), (b,)),
    ]
    results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label])


def _layer_norm(x, w, b):
    return aten.native_layer_norm.default(x, [x.shape[-1]], w, b, 1e-5)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("persistent_max", [8192, 128], ids=["persistent", "looped"])
def test_softmax_layer_norm(dtype, persistent_max):
    x = make((64, 384), dtype)
    w, b = make((384,), dtype, "pos"), make((384,), dtype)
    cases = [
        Case("softmax", lambda t: aten._softmax.default(t, -1, False), (x,)),
        Case("log_softmax", lambda t: aten._log_softmax.default(t, -1, False), (x,)),
        # mean/rstd of low-precision inputs: float32 in kiln (as CUDA), bfloat16 on CPU eager
        Case(
            "layer_norm",
            lambda t, ww, bb: _layer_norm(t, ww, bb)[: 3 if dtype == F32 else 1],
            (x, w, b),
        ),
        Case("argmax", lambda t: aten.argmax.default(t, 1), (x,)),
        Case("var_mean", lambda t: aten.var_mean.correction(t, [1], correction=1), (x,)),
        Case("sum_to_f32", lambda t: aten.sum.dim_IntList(t, [1], dtype=F32), (x,)),
    ]
    with settings_scope(persistent_max=persistent_max):
        results = run_batch(cases)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == BF16 else {"rtol": 1e-4, "atol": 1e-4}
    for c in cases:
        assert_case(results[c.label], **tol)


def test_looped_welford_float64_keeps_float64_precision():
    # the looped Welford update scales by one reciprocal per chunk, in the row's dtype
    # the interpreter loops in chunks of 1024: two full ones and a masked tail
    x = make((4, 3000), torch.float64)
    w, b = make((3000,), torch.float64, "pos"), make((3000,), torch.float64)
    cases = [
        Case("var_mean", lambda t: aten.var_mean.correction(t, [1], correction=1), (x,)),
        Case("layer_norm", lambda t, ww, bb: _layer_norm(t, ww, bb), (x, w, b)),
    ]
    with settings_scope(persistent_max=64):
        results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label], rtol=1e-12, atol=1e-12)


def _kernels_of_checked_run(tmp_path, monkeypatch, cases, persistent_max: int) -> str:
    """Run ``cases`` (compared with eager) and return the source of every Triton kernel
    compiled so far into ``tmp_path`` (KILN_DEBUG_DIR)."""
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    with settings_scope(persistent_max=persistent_max):
        results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label], rtol=1e-4, atol=1e-4)
    return "".join(p.read_text() for p in tmp_path.rglob("kernel*.triton"))


def test_looped_rows_that_every_block_divides_need_no_r_mask(tmp_path, monkeypatch):
    # 2048-element rows: every RBLOCK a looped kernel may get divides them
    x = make((4, 2048), F32)
    w, b = make((2048,), F32, "pos"), make((2048,), F32)
    cases = [
        Case("softmax", lambda t: aten._softmax.default(t, -1, False), (x,)),
        Case("layer_norm", lambda t, ww, bb: _layer_norm(t, ww, bb), (x, w, b)),
        Case("argmax", lambda t: aten.argmax.default(t, 1), (x,)),
    ]
    kernels = _kernels_of_checked_run(tmp_path, monkeypatch, cases, persistent_max=128)
    assert "for roffset in range(0, 2048, RBLOCK)" in kernels
    assert "rmask = tl.full([1, RBLOCK], 1, tl.int1)" in kernels
    assert "rindex < 2048" not in kernels


def test_rows_that_every_block_divides_need_no_x_mask(tmp_path, monkeypatch):
    # 64 rows (and 4096 elements): every XBLOCK a kernel may get divides them; 100 do not
    cases = []
    for rows in (64, 100):
        x = make((rows, 256), F32)
        w, b = make((256,), F32, "pos"), make((256,), F32)
        cases += [
            Case(f"softmax {rows}", lambda t: aten._softmax.default(t, -1, False), (x,)),
            Case(f"layer_norm {rows}", lambda t, ww, bb: _layer_norm(t, ww, bb), (x, w, b)),
        ]
    cases.append(Case("sigmoid", lambda t: aten.sigmoid.default(t), (make((4096,), F32),)))
    _kernels_of_checked_run(tmp_path, monkeypatch, cases, persistent_max=1024)  # persistent
    kernels = _kernels_of_checked_run(tmp_path, monkeypatch, cases, persistent_max=64)  # looped
    assert "xmask = tl.full([XBLOCK, 1], 1, tl.int1)" in kernels
    assert "xmask = tl.full([XBLOCK], 1, tl.int1)" in kernels
    assert "xmask = xindex < 100" in kernels
    assert "xindex < 64" not in kernels and "xindex < 4096" not in kernels


def test_empty_reductions():
    x = make((0, 5), F32)
    cases = [
        Case("sum", lambda t: aten.sum.dim_IntList(t, [0]), (x,)),
        Case("prod", lambda t: aten.prod.dim_int(t, 0), (x,)),
        Case("sum_keep", lambda t: aten.sum.dim_IntList(t, [1], True), (x,)),
    ]
    results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label])


VIEWS = {
    "permute": lambda x: aten.permute.default(x, [2, 0, 1]),
    "transpose_mul": lambda x: aten.mul.Tensor(aten.transpose.int(x, 0, 2), 2),
    "expand_add": lambda x: aten.add.Tensor(aten.expand.default(aten.slice.Tensor(x, 1, 0, 1), [4, 6, 5]), x),
    "slice_step": lambda x: aten.mul.Tensor(aten.slice.Tensor(x, 2, 1, 5, 2), 3),
    "select": lambda x: aten.add.Tensor(aten.select.int(x, 1, -1), 1),
    "view_noncontig": lambda x: aten.mul.Tensor(
        aten.view.default(aten.clone.default(aten.permute.default(x, [1, 0, 2]), memory_format=torch.contiguous_format), [-1]), 2),
    "split": lambda x: tuple(aten.mul.Tensor(aten.split.Tensor(x, 2, 1)[i], 2) for i in range(3)),
    "t": lambda x: aten.t.default(aten.select.int(x, 0, 0)),
}  # fmt: skip


@pytest.mark.parametrize("dtype", [F32, I64, BF16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("layout", ["contig", "noncontig"])
def test_views(dtype, layout):
    base = make((4, 6, 5), dtype) if layout == "contig" else make((5, 6, 4), dtype).permute(2, 1, 0)
    cases = [Case(n, fn, (base,)) for n, fn in VIEWS.items()]
    results = run_batch(cases)
    for n in VIEWS:
        assert_case(results[n])


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
def test_cat_pad_and_indexing(dtype):
    x, y, e = make((4, 6, 5), dtype), make((4, 2, 5), dtype), make((4, 0, 5), dtype)
    idx = torch.randint(0, 6, (4, 3, 5))
    i1 = torch.randint(-6, 6, (7,))
    table, tokens = make((50, 16), dtype), torch.randint(0, 50, (3, 9))
    cases = [
        Case("cat", lambda a, b, c: aten.cat.default([a, b, c], 1), (x, y, e)),
        Case("stack", lambda a: aten.stack.default([a, a], 1), (x,)),
        Case("pad", lambda a: aten.constant_pad_nd.default(a, [1, 2, 0, 1], 1), (x,)),
        Case("gather", lambda a, i: aten.gather.default(a, 1, i), (x, idx)),
        Case("index", lambda a, i: aten.index.Tensor(a, [None, aten.remainder.Scalar(i, 6)]), (x, i1)),
        Case("index_select", lambda a, i: aten.index_select.default(a, 1, i), (x, torch.randint(0, 6, (4,)))),
        Case("embedding", lambda w, t: aten.embedding.default(w, t), (table, tokens)),
        Case("embedding_scale", lambda w, t: aten.mul.Tensor(aten.embedding.default(w, t), 4.0), (table, tokens)),
    ]  # fmt: skip
    results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label])


@pytest.mark.parametrize("persistent_max", [8192, 64], ids=["persistent", "looped"])
def test_nan_propagates_like_eager(persistent_max):
    x = make((8, 300), F32)
    x[3, 17] = float("nan")
    x[5, 250] = float("nan")
    x[5, 20] = float("nan")
    cases = [
        Case("amax", lambda t: aten.amax.default(t, [1]), (x,)),
        Case("amin", lambda t: aten.amin.default(t, [1]), (x,)),
        Case("argmax", lambda t: aten.argmax.default(t, 1), (x,)),
        Case("argmin", lambda t: aten.argmin.default(t, 1), (x,)),
        Case("max_dim", lambda t: aten.max.dim(t, 1), (x,)),
        Case("maximum", lambda t: aten.maximum.default(t, aten.flip.default(t, [0])), (x,)),
        Case("softmax", lambda t: aten._softmax.default(t, 1, False), (x,)),
    ]
    with settings_scope(persistent_max=persistent_max):
        results = run_batch(cases)
    for c in cases:
        assert_case(results[c.label])
