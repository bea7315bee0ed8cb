"""Scans (cumsum, cumprod) through kiln-triton on a real GPU (``-m gpu``; skipped without
CUDA or under the interpreter): the scan sweep of test_scan.py on CUDA tensors, with
persistent and looped kernels and autotuned launch configurations, long rows, and HF-style
position ids through ``torch.compile(backend=kiln_triton.compile_fx)``, all compared with
eager.

    KILN_TRITON_TEST_GPU=1 python -m pytest packages/kiln-triton/tests/test_gpu_scan.py -m gpu
"""

from __future__ import annotations

import pytest
import torch
from batch import Case, make, run_batch
from test_scan import PositionIds, _check, _sweep_cases, factors

import kiln_triton
from kiln_triton.config import settings_scope

pytestmark = pytest.mark.gpu
aten = torch.ops.aten
CUDA = "cuda"


LOW = (torch.bfloat16, torch.float16)


def _float32_reference(case: Case) -> list[torch.Tensor]:
    """Eager on the inputs widened to float32, rounded to the low-precision result type.

    Eager CUDA scans bfloat16/float16 in that type (``scan_dim<scalar_t>`` with
    ``std::plus<scalar_t>``: the running value is rounded at every step), so over 4096
    bfloat16 terms it drifts up to ~45 from the exact sum (reproduced on the CPU by a
    stepwise-rounded loop). kiln accumulates in float32, as eager does on the CPU, and is
    compared with this reference instead."""
    wide = [x.float() if x.dtype in LOW else x for x in case.inputs]
    r = case.fn(*wide)
    return [t.to(case.inputs[0].dtype) for t in (r if isinstance(r, (tuple, list)) else (r,))]


def _run(cases):
    results = run_batch([c for c, _ in cases])
    failures = []
    for case, n in cases:
        r = results[case.label]
        if isinstance(r, Exception):
            raise r
        refs = _float32_reference(case) if r[0][0].dtype in LOW else [None] * len(r)
        for (expected, got), ref in zip(r, refs, strict=True):
            try:
                if ref is None:
                    _check(got, expected, n, case.label)
                    continue
                _check(got, ref, n, case.label)
                # and never further from the float32 result than eager is
                ours = (got.float() - ref.float()).abs().max()
                eager = (expected.float() - ref.float()).abs().max()
                assert ours <= eager + 2**-7 * ref.float().abs().max(), (ours, eager)
            except AssertionError as e:
                failures.append(f"{case.label}: {e}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "n,persistent_max",
    [(37, 8192), (4000, 8192), (4000, 64), (70000, 8192)],
    ids=["short", "persistent-4000", "looped-4000", "looped-70000"],
)
def test_scan_sweep_on_gpu(n, persistent_max):
    with settings_scope(persistent_max=persistent_max):
        _run(_sweep_cases(long=n > 64, device=CUDA, n=n))


def test_large_scans_on_gpu():
    cumsum, cumprod = aten.cumsum.default, aten.cumprod.default
    cases = [
        (Case("cumsum/4096x4096/last", lambda t: cumsum(t, 1), (make((4096, 4096), torch.float32, device=CUDA),)), 4096),
        (Case("cumsum/4096x4096/first", lambda t: cumsum(t, 0), (make((4096, 4096), torch.bfloat16, device=CUDA),)), 4096),
        (Case("cumprod/64x100000", lambda t: cumprod(t, 1), (factors((64, 100000), torch.float32, CUDA),)), 100000),
        (Case("cumsum/int64/1M", lambda t: cumsum(t, 0), (make((1 << 20,), torch.int64, device=CUDA),)), 1 << 20),
    ]  # fmt: skip
    _run(cases)


def test_position_ids_on_gpu():
    torch.manual_seed(0)
    model = PositionIds().to(CUDA).eval()
    ids = torch.randint(0, 50, (4, 32), device=CUDA)[:, :12]  # a strided graph input
    masks = [(torch.rand(4, 12, device=CUDA) > p).long() for p in (0.3, 0.5, 0.0, 1.0)]
    masks[0][0, :5] = 0  # left padding
    with torch.no_grad():
        compiled = torch.compile(model, backend=kiln_triton.compile_fx)
        for k, mask in enumerate(masks):  # new values, same graph
            got, expected = compiled(ids, mask), model(ids, mask)
            torch.cuda.synchronize()
            assert torch.equal(got, expected), f"call {k}: mask\n{mask}\ndiffers at " + str(
                (got != expected).any(-1).nonzero().tolist()
            )
