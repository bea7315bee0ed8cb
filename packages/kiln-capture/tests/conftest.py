import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("KILN_CAPTURE_RAISE_INTERNAL", "1")


@pytest.fixture(autouse=True)
def _fresh_caches():
    import kiln_capture

    kiln_capture.reset()
    yield
    kiln_capture.reset()
