"""Fixtures of kiln-aot's tests."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from kiln_aot_testing import RecordingCompiler


@pytest.fixture
def compiler() -> RecordingCompiler:
    return RecordingCompiler()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
