import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _fresh_caches(monkeypatch):
    import kiln_capture
    from kiln_capture.config import config

    # a bug in kiln-capture must fail the test, not silently run the frame eagerly
    monkeypatch.setattr(config, "raise_internal", True)
    kiln_capture.reset()
    yield
    kiln_capture.reset()
