"""Every corpus program runs eagerly and captured; outputs, argument mutations, graph and
break counts, and the cache hit on the second call are checked."""

import importlib

import pytest
import torch
from corpus import CASES
from helpers import CountingBackend, assert_same, clone_args

import kiln_capture

for _mod in (
    "arith",
    "containers",
    "control",
    "calls",
    "modules",
    "breaking",
    "effects",
    "contexts",
    "patterns",
    "withs",
    "generators",
    "functions",
):
    importlib.import_module(f"corpus.{_mod}")


_XFAIL = importlib.import_module("corpus.functions").EXPECTED_FAILURES
_PARAMS = [
    pytest.param(c, marks=pytest.mark.xfail(reason=_XFAIL[c.name], strict=True))
    if c.name in _XFAIL
    else c
    for c in CASES
]


def test_corpus_is_large_enough():
    assert len(CASES) >= 150


@pytest.mark.parametrize("case", _PARAMS, ids=lambda c: c.name)
def test_program(case):
    torch.manual_seed(1234)
    args = case.args()
    eager_args = clone_args(args)
    captured_args = clone_args(args)
    again_args = clone_args(args)
    snapshot = {k: v for k, v in case.fn.__globals__.items() if isinstance(v, int | dict)}
    torch.manual_seed(0)
    expected = case.fn(*eager_args)
    eager_globals = {k: case.fn.__globals__[k] for k in snapshot}
    case.fn.__globals__.update(
        {k: (v.copy() if isinstance(v, dict) else v) for k, v in snapshot.items()}
    )

    report = kiln_capture.explain(case.fn)
    torch.manual_seed(0)
    out = report(*captured_args)
    assert torch.is_grad_enabled(), "the captured program leaked a grad mode"
    assert_same(out.result, expected)
    assert_same(captured_args, eager_args, "args")
    for k in snapshot:
        assert_same(case.fn.__globals__[k], eager_globals[k], f"global {k}")
    assert (out.graph_count, out.break_count) == (case.graphs, case.breaks), str(out)

    # second call with the same kinds of inputs: cache hits, same answer, no recompiles
    case.fn.__globals__.update(
        {k: (v.copy() if isinstance(v, dict) else v) for k, v in snapshot.items()}
    )
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(case.fn)
    torch.manual_seed(0)
    fn(*clone_args(args))
    n = len(backend.graphs)
    case.fn.__globals__.update(
        {k: (v.copy() if isinstance(v, dict) else v) for k, v in snapshot.items()}
    )
    torch.manual_seed(0)
    again = fn(*again_args)
    assert torch.is_grad_enabled(), "the cache hit leaked a grad mode"
    assert_same(again, expected)
    if not snapshot or case.fn.__name__ not in ("write_global",):
        assert len(backend.graphs) == n, "second call recompiled"
    case.fn.__globals__.update(snapshot)
