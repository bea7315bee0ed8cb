"""kiln-cpp's op sweeps use kiln-inductor's shared batch helpers (kiln_inductor.op_batch)."""

from __future__ import annotations

import functools

from kiln_inductor.op_batch import (  # noqa: F401  (re-exported for the sweeps)
    Case,
    CaseResult,
    assert_case,
    build_graph,
    factory,
    make,
    run_batch,
    tolerance,
)

cached_batch = functools.lru_cache(maxsize=None)
