"""Shared set-up of the tests."""

from __future__ import annotations

import os

# the IR verifier (kiln_inductor.verify) checks every graph the tests compile
os.environ.setdefault("KILN_VERIFY", "1")

# compiled graphs persist across processes by default (kiln-inductor's artifact cache); the
# suites compile afresh so that a test that patches the compiler never meets a graph another
# run compiled unpatched. test_artifact_cache.py turns it on for its own tests.
os.environ.setdefault("KILN_ARTIFACT_CACHE", "0")
