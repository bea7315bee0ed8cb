"""Shared set-up of kiln-cpp's tests: a kernel cache private to the test session."""

from __future__ import annotations

import os
import tempfile

# the IR verifier (kiln_inductor.verify) checks every graph the tests compile
os.environ.setdefault("KILN_VERIFY", "1")

# compiled graphs persist across processes by default (kiln-inductor's artifact cache); the
# suites compile afresh so that a test that patches the compiler never meets a graph another
# run compiled unpatched. test_artifact_cache.py turns it on for its own tests.
os.environ.setdefault("KILN_ARTIFACT_CACHE", "0")

# a persistent per-user cache keeps re-runs fast; KILN_CACHE_DIR set by the caller wins
os.environ.setdefault("KILN_CACHE_DIR", os.path.join(tempfile.gettempdir(), "kiln-cpp-test-cache"))

import sys

sys.path.insert(0, os.path.dirname(__file__))  # the tests' helper modules (opbatch)
