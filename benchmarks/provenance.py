"""Where a benchmark's figures come from: the commit they were measured at."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def commit() -> str:
    """The checkout's short commit; ``KILN_COMMIT`` where the checkout's git is not the
    source's (the device tool's copy)."""
    if os.environ.get("KILN_COMMIT"):
        return os.environ["KILN_COMMIT"]
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    return out or "unknown"
