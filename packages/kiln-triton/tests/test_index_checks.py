"""Bad indices in kiln-triton kernels (under the interpreter here, on the GPU with
``-m gpu``): eager's exception type, never garbage or a crash, and the compiled function
works again afterwards (kiln_inductor.index_check)."""

from __future__ import annotations

import pytest
import torch

import kiln_triton
from kiln_inductor.testing import bad_index_cases, check_bad_index_cases
from kiln_triton.testing import use_triton_for_cpu

LIBRARY_OPS: set[str] = set()  # cases whose op runs as a library call (ATen checks it)


def _assert_checked(name, graphs):
    for g in graphs:
        if name in LIBRARY_OPS:
            continue
        assert g.stats["kernels"] >= 1 and not g.stats["fallbacks"], g.stats
        assert "index_errors.start()" in g.wrapper_source
        assert g.wrapper_source.rstrip().splitlines()[-2].strip() == "index_errors.finish()", (
            g.wrapper_source
        )
        assert g.index_errors is not None


@pytest.mark.parametrize("name", sorted(bad_index_cases()))
def test_bad_index_raises_eagers_error(name):
    with use_triton_for_cpu():
        graphs = check_bad_index_cases([name])[name]
    _assert_checked(name, graphs)


def test_failed_check_is_reported_once_and_cleared():
    fn, good, bad = bad_index_cases()["index_past_end"]
    with use_triton_for_cpu():
        compiled = kiln_triton.compile_fx(fn, bad)
        with pytest.raises(
            IndexError, match="index 7 is out of bounds for dimension 0 with size 4"
        ):
            compiled(*bad)
        with pytest.raises(IndexError):  # the error row was cleared and written again
            compiled(*bad)
        ok = [bad[0], torch.tensor([0, 3, -1])]
        torch.testing.assert_close(compiled(*ok), fn(*ok))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(bad_index_cases()))
def test_bad_index_raises_eagers_error_on_gpu(name):
    graphs = check_bad_index_cases([name], device="cuda")[name]
    _assert_checked(name, graphs)
    torch.cuda.synchronize()  # the context is alive: no device-side assert fired


@pytest.mark.gpu
def test_bad_index_under_cuda_graphs():
    """reduce-overhead: the check is skipped during capture and read after each replay."""
    fn, good, bad = bad_index_cases("cuda")["embedding_huge_id"]
    compiled = kiln_triton.compile_fx(fn, good, mode="reduce-overhead")
    for _ in range(3):
        torch.testing.assert_close(compiled(*good), fn(*good))
    bad_same_shape = [good[0].clone(), good[1]]
    bad_same_shape[0][0, 1] = 10**8
    with pytest.raises(IndexError):
        compiled(*bad_same_shape)
    torch.testing.assert_close(compiled(*good), fn(*good))
    assert compiled.replays >= 3  # the calls replayed the CUDA graph, bad one included
