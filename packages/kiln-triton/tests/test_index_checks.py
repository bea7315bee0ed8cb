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


def test_error_rows_survive_the_artifact_cache(tmp_path, monkeypatch):
    """A graph loaded from the persistent artifact cache gets fresh error rows, and its
    kernels write the rows its reader reads: the bad index still raises eager's error."""
    import kiln_inductor.compile as kiln_compile
    from kiln_inductor.runtime import artifacts

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_ARTIFACT_CACHE", "1")
    fn, good, bad = bad_index_cases()["embedding_huge_id"]
    gm = torch.fx.symbolic_trace(fn)  # the cache keeps compiled FX graphs
    built = []  # every CompiledGraph made, freshly or from the cache (wrapper_graph)
    real = kiln_compile.wrapper_graph

    def recording(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(kiln_compile, "wrapper_graph", recording)
    monkeypatch.setattr(artifacts, "wrapper_graph", recording)
    with use_triton_for_cpu():
        cold = kiln_triton.compile_fx(gm, good)
        hits = artifacts.STATS.hits
        warm = kiln_triton.compile_fx(gm, good)
        assert artifacts.STATS.hits == hits + 1  # loaded, not compiled
        # both the compiled graph and the one rebuilt from the cache run checked kernels
        assert len(built) == 2, built
        _assert_checked("embedding_huge_id", built)
        for compiled in (cold, warm):
            with pytest.raises(IndexError):
                compiled(*bad)
            torch.testing.assert_close(compiled(*good), fn(*good))


def test_device_index_errors_pickle_to_fresh_rows():
    import pickle

    from kiln_inductor.index_check import DeviceIndexErrors

    errors = DeviceIndexErrors(torch.device("cpu"), [((), ()), ((), ("#0",))])
    errors.tensor.fill_(3)
    copy = pickle.loads(pickle.dumps(errors))
    assert copy.kernels == errors.kernels and copy.tensor.shape == (2, 2)
    assert not copy.tensor.any()  # fresh rows, zeroed
    copy.rows[1][0] = 5  # the rows are views of the tensor the reader reads
    assert copy.tensor[1, 0] == 5


def test_native_error_reader_needs_the_driver_only_when_used():
    _launch = pytest.importorskip("kiln_triton._launch")
    host = torch.zeros(2, 2, dtype=torch.int64)
    reader = _launch.ErrorReader(host.data_ptr(), host.data_ptr(), 32, 2, lambda d: 0, 0)
    assert reader.finish() is None  # nothing queued yet
    with pytest.raises(ValueError):
        _launch.ErrorReader(host.data_ptr(), host.data_ptr(), 16, 2, lambda d: 0, 0)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="libcuda"):
            reader.start()
