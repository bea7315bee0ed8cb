"""Shared set-up of the tests."""

from __future__ import annotations

import os

# the IR verifier (kiln_inductor.verify) checks every graph the tests compile
os.environ.setdefault("KILN_VERIFY", "1")
