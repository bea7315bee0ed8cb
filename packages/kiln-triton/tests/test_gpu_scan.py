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


def _run(cases):
    results = run_batch([c for c, _ in cases])
    failures = []
    for case, n in cases:
        r = results[case.label]
        if isinstance(r, Exception):
            raise r
        for expected, got in r:
            try:
                _check(got, expected, n, case.label)
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
    ids = torch.randint(0, 50, (4, 32), device=CUDA)[:, :12]
    mask = (torch.rand(4, 12, device=CUDA) > 0.3).long()
    with torch.no_grad():
        compiled = torch.compile(model, backend=kiln_triton.compile_fx)
        torch.testing.assert_close(compiled(ids, mask), model(ids, mask))
        mask2 = (torch.rand(4, 12, device=CUDA) > 0.5).long()
        torch.testing.assert_close(compiled(ids, mask2), model(ids, mask2))
