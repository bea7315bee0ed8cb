"""Shared set-up of kiln-triton's tests: Triton's interpreter (CPU tensors) unless a test
needs a GPU, and a kernel cache private to the test session."""

from __future__ import annotations

import os
import sys
import tempfile

# the IR verifier (kiln_inductor.verify) checks every graph the tests compile
os.environ.setdefault("KILN_VERIFY", "1")

# compiled graphs persist across processes by default (kiln-inductor's artifact cache); the
# suites compile afresh so that a test that patches the compiler never meets a graph another
# run compiled unpatched. test_artifact_cache.py turns it on for its own tests.
os.environ.setdefault("KILN_ARTIFACT_CACHE", "0")

import pytest

# before triton is imported anywhere: run kernels on CPU tensors through the interpreter,
# unless the GPU tests are run on a machine with a GPU (benchmarks/gpu/run_all.sh)
if os.environ.get("KILN_TRITON_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault(
    "KILN_CACHE_DIR", os.path.join(tempfile.gettempdir(), "kiln-triton-test-cache")
)
sys.path.insert(0, os.path.dirname(__file__))  # the tests' helper modules (batch)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (and TRITON_INTERPRET unset)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
