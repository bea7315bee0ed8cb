"""A tensor operation that raises inside ``try:`` (issue #16): the operation (or attribute
read) is a graph break (its error comes from eager's kernel), the frame stays compiled
around it, and the
``except`` branch runs with eager's exception, captured in a graph of its own (the
re-raising continuation; variables/exceptions.py, ``RaisingVar``).

PYTEST_DONT_REWRITE"""

import traceback

import pytest
import torch
from helpers import CountingBackend, assert_same, clone_args

import kiln_capture


def matmul_caught(x, y):
    x = x * 2
    try:
        z = x @ y
    except RuntimeError as e:
        z = x.sum() + len(e.args)
    return z + 1


def matmul_caught_reads_message(x, y):
    try:
        z = x @ y
    except RuntimeError as e:
        return x.cos(), str(e)
    return z, ""


def inplace_add_caught(x, y):
    x = x + 0
    try:
        x += y
    except RuntimeError:
        x = x - 1
    return x.sin()


def compare_caught(x, y):
    try:
        z = x < y
    except RuntimeError:
        z = x > 0
    return z.float() * x


def attribute_error_caught(x, y):
    x = x * 2
    try:
        z = x.no_such_attribute  # a tensor may carry Python attributes: read eagerly
    except AttributeError as e:
        z = x + y.sum() + len(e.args)
    return z * 3


def method_error_caught(x, y):
    x = x * 2
    try:
        z = x.no_such_method(y)
    except AttributeError:
        z = x - y.sum()
    return z * 3


def not_caught_here(x, y):
    try:
        z = x @ y
    except ValueError:
        z = x
    return z


def finally_then_propagates(x, y, log):
    try:
        z = x @ y
    finally:
        log.append("finally")
    return z


def _outcome(fn, args):
    try:
        return "ok", fn(*args)
    except Exception as e:
        return type(e), str(e)


# (fn, args, graphs, breaks) for the failing inputs
_BAD = [
    (matmul_caught, lambda: (torch.randn(4, 4), torch.randn(3, 3)), 2, 1),
    (matmul_caught_reads_message, lambda: (torch.randn(4, 4), torch.randn(3, 3)), 1, 1),
    (inplace_add_caught, lambda: (torch.randn(4, 4), torch.randn(3, 3)), 2, 1),
    (compare_caught, lambda: (torch.randn(4, 4), torch.randn(3, 3)), 1, 1),
    (attribute_error_caught, lambda: (torch.randn(4, 4), torch.randn(3, 3)), 2, 1),
    (method_error_caught, lambda: (torch.randn(4, 4), torch.randn(3, 3)), 2, 1),
]


@pytest.mark.parametrize("fn,make,graphs,breaks", _BAD, ids=lambda v: getattr(v, "__name__", ""))
def test_except_branch_runs_with_eagers_exception(fn, make, graphs, breaks):
    torch.manual_seed(0)
    args = make()
    expected = fn(*clone_args(args))
    report = kiln_capture.explain(fn)(*clone_args(args))
    assert_same(report.result, expected)
    assert (report.graph_count, report.break_count) == (graphs, breaks), str(report)
    assert report.eager_frames == []
    assert report.breaks[0].resumed and report.breaks[0].lineno > 0
    # warm: cache hits (the re-raising continuation's guards hold), same answer
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(fn)
    compiled(*clone_args(args))
    n = len(backend.graphs)
    assert_same(compiled(*clone_args(args)), expected)
    assert len(backend.graphs) == n
    assert kiln_capture.stats()["eager_frames"] == 0


def test_good_inputs_stay_one_graph():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    report = kiln_capture.explain(matmul_caught)(x, y)
    assert_same(report.result, matmul_caught(x, y))
    assert (report.graph_count, report.break_count) == (1, 0)


def test_another_message_recompiles_the_handler():
    """The exception's arguments are guarded: another shape error's message is seen."""
    compiled = kiln_capture.optimize(CountingBackend())(matmul_caught_reads_message)
    for n in (3, 5):
        x, y = torch.randn(4, 4), torch.randn(n, n)
        assert_same(compiled(x, y), matmul_caught_reads_message(x, y))


@pytest.mark.parametrize(
    "fn,make",
    [
        (not_caught_here, lambda: (torch.randn(4, 4), torch.randn(3, 3))),
        (finally_then_propagates, lambda: (torch.randn(4, 4), torch.randn(3, 3), [])),
    ],
)
def test_uncaught_error_propagates_as_eager(fn, make):
    args = make()
    eager_args = clone_args(args)
    want = _outcome(fn, eager_args)
    assert want[0] is RuntimeError
    compiled = kiln_capture.optimize(CountingBackend())(fn)
    for _ in range(2):  # cold and warm
        got_args = clone_args(args)
        assert _outcome(compiled, got_args) == want
        assert_same(got_args, eager_args, "args")
    assert kiln_capture.stats()["eager_frames"] == 0


def test_the_propagating_exception_is_eagers_object():
    """Re-raised after the handler ran in the trace, it is the kernel's own exception
    (its traceback holds the eager step's line), not a copy made after the graph."""

    def fn(x, y):
        try:
            return x @ y
        except ValueError:
            return x

    compiled = kiln_capture.optimize(CountingBackend())(fn)
    with pytest.raises(RuntimeError) as info:
        compiled(torch.randn(4, 4), torch.randn(3, 3))
    steps = [
        f.line
        for f in traceback.extract_tb(info.value.__traceback__)
        if f.filename == "<kiln __run>"
    ]
    # the frame's code, the re-raising continuation's code, and the step that raised
    assert len(steps) == 3, steps


def reads_the_traceback(x, y):
    try:
        return x @ y
    except RuntimeError as e:
        return x + (e.__traceback__ is not None)


def raise_from_none(x, y):
    try:
        return x @ y
    except RuntimeError as e:
        raise e from None


def wrap_in_another(x, y):
    try:
        return x @ y
    except RuntimeError as e:
        raise ValueError("bad shapes") from e


def test_the_eager_exceptions_own_state_is_not_invented():
    """Its traceback is the real object's: reading it breaks (the trace has none), it is
    never a made-up None."""
    x, y = torch.randn(4, 4), torch.randn(3, 3)
    report = kiln_capture.explain(reads_the_traceback)(x, y)
    assert_same(report.result, reads_the_traceback(x, y))
    assert [b.kind.id for b in report.breaks] == ["B010", "B009"]


@pytest.mark.parametrize("fn", [raise_from_none, wrap_in_another])
def test_raise_from_in_the_handler_as_eager(fn):
    def outcome(f):
        try:
            f(torch.randn(4, 4), torch.randn(3, 3))
        except Exception as e:
            cause = e.__cause__
            return type(e), str(e), type(cause), e.__suppress_context__
        return None

    want = outcome(fn)
    compiled = kiln_capture.optimize(CountingBackend())(fn)
    assert outcome(compiled) == want and outcome(compiled) == want
    assert kiln_capture.stats()["eager_frames"] == 0
