"""Exceptions raised and handled inside captured code (variables/exceptions.py): try/except,
finally, with-blocks left by an exception, contextmanager generators, exceptions crossing
inlined calls, user exception classes. Each program runs eagerly and captured; results,
side effects and raised exceptions must be equal, with the graphs and breaks expected.

PYTEST_DONT_REWRITE: the programs' own ``assert`` statements must stay plain bytecode."""

import contextlib
import functools
import math

import pytest
import torch
from helpers import CountingBackend, assert_same, clone_args

import kiln_capture

PROGRAMS = []


def program(graphs=1, breaks=0):
    def register(fn):
        PROGRAMS.append(pytest.param(fn, graphs, breaks, id=fn.__name__))
        return fn

    return register


class MyError(Exception):
    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


class Plain(Exception):
    pass


def _raise_my(x):
    raise MyError("bad input", 3)


def _middle(x, log):
    try:
        return _raise_my(x)
    finally:
        log.append("middle finally")


@program()
def key_error_caught(x):
    d = {"a": 1}
    try:
        y = x * d["b"]
    except KeyError as e:
        y = x + len(e.args)
    return y


class Box:
    def __init__(self):
        self.a = 1


@program()
def attribute_error_caught(x):
    box = Box()
    try:
        return x * box.missing
    except AttributeError as e:
        return x * 2, str(e)


@program()
def tensor_attribute_left_to_eager(x):
    # a tensor may carry Python attributes the trace does not see: no AttributeError is
    # assumed; the lookup is a graph break
    try:
        return x.no_such_attribute
    except AttributeError:
        return x * 2


@program()
def index_error_caught(x):
    items = [1, 2]
    try:
        k = items[5]
    except IndexError:
        k = -1
    return x + k


@program()
def user_exception_across_frames(x):
    log = []
    try:
        _middle(x, log)
    except MyError as e:
        return x * e.code, e.args, str(e), log
    return x, log


@program()
def except_tuple_and_else(x):
    out = []
    for key in ("a", "z"):
        try:
            v = {"a": 2}[key]
        except (IndexError, KeyError):
            out.append("missing")
        else:
            out.append(v)
    return x * len(out), out


@program()
def finally_runs_then_propagates(x):
    log = []
    try:
        try:
            raise ValueError("v")
        finally:
            log.append("finally")
    except ValueError as e:
        log.append(str(e))
    return x + len(log), log


@program()
def reraise_and_raise_from(x):
    try:
        try:
            raise KeyError("inner")
        except KeyError as e:
            raise ValueError("outer") from e
    except ValueError as e:
        cause = e.__cause__
        return x - 1, type(cause) is KeyError, cause.args


@program()
def bare_reraise(x):
    try:
        try:
            {}["k"]
        except KeyError:
            x = x + 1
            raise
    except LookupError as e:
        return x * 2, e.args


@program()
def stop_iteration_ends_loop(x):
    it = iter([1, 2, 3])
    total = 0
    while True:
        try:
            total += next(it)
        except StopIteration:
            break
    return x + total


@program()
def assertion_caught(x):
    try:
        assert x.shape[0] == 3, "need 3 rows"
    except AssertionError as e:
        return x - 1, str(e)
    return x


@program()
def grad_mode_restored_by_exception(x):
    with torch.no_grad():
        try:
            with torch.enable_grad():
                raise KeyError("k")
        except KeyError:
            pass
        return x * 2, torch.is_grad_enabled()


class Suppress:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, typ, value, tb):
        self.log.append((typ.__name__ if typ else None, str(value) if value else None))
        return typ is not None and issubclass(typ, ValueError)


@program()
def with_exit_sees_exception(x):
    log = []
    with Suppress(log):
        x = x + 1
        raise ValueError("inside")
    try:
        with Suppress(log):
            raise KeyError("not suppressed")
    except KeyError:
        log.append("caught outside")
    return x * 2, log


@contextlib.contextmanager
def handling(log):
    log.append("setup")
    try:
        yield 5
    except ValueError as e:
        log.append(("handled", str(e)))
    finally:
        log.append("teardown")


@contextlib.contextmanager
def passing(log):
    log.append("setup")
    try:
        yield 7
    finally:
        log.append("teardown")


@program()
def contextmanager_gets_exception(x):
    log = []
    with handling(log) as v:
        y = x + v
        raise ValueError("boom")
    try:
        with passing(log) as w:
            y = y * w
            raise KeyError("through")
    except KeyError:
        log.append("outer")
    return y, log


def _gen(log):
    try:
        yield 1
        yield 2
    except ValueError:
        log.append("thrown in")
        yield 10
    finally:
        log.append("gen done")


@program()
def generator_throw(x):
    log = []
    g = _gen(log)
    a = next(g)
    b = g.throw(ValueError("t"))
    g.close()
    return x + a + b, log


def _stopping():
    yield 1
    raise StopIteration  # PEP 479: a RuntimeError leaves the generator


@program()
def stop_iteration_in_generator(x):
    try:
        return x + sum(_stopping())
    except RuntimeError as e:
        return x - 1, str(e)


class Lazy:
    def __init__(self):
        self.known = 1

    @property
    def missing(self):
        raise AttributeError("computed later")

    def __getattr__(self, name):
        if name == "dynamic":
            return 4
        raise AttributeError(name)


@program()
def hasattr_and_getattr_default(x):
    o = Lazy()
    return x + o.dynamic, hasattr(o, "missing"), getattr(o, "other", "dflt")


@program()
def dict_pop_missing(x):
    d = {"a": 1}
    try:
        d.pop("b")
    except KeyError as e:
        return x + d.pop("a"), e.args


@program()
def functools_wraps_builtin(x):
    @functools.wraps(torch.sin)
    def w(t):
        return torch.sin(t) + 1

    return w(x), w.__name__, w.__wrapped__ is torch.sin


@program()
def exception_in_loop_continue(x):
    out = x
    for k in ("a", "b", "c"):
        try:
            out = out * {"a": 2, "c": 3}[k]
        except KeyError:
            continue
        finally:
            out = out + 1
    return out


@program()
def int_parse_error_caught(x):
    try:
        n = int("seven")
    except ValueError:
        n = 7
    return x * n


@program()
def tensor_op_error_caught(x):
    # the shape error comes from eager's own kernel: the matmul is a graph break
    try:
        y = x @ torch.ones(3, 3)
    except RuntimeError:
        y = x.sum()
    return y + 1


@pytest.mark.parametrize("fn,graphs,breaks", PROGRAMS)
def test_program(fn, graphs, breaks):
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    expected = fn(x.clone())
    report = kiln_capture.explain(fn)(x.clone())
    assert_same(report.result, expected)
    if fn in (
        tensor_op_error_caught,
        tensor_attribute_left_to_eager,
    ):  # the matmul broke the graph; everything else is captured
        assert report.break_count >= 1
        return
    assert (report.graph_count, report.break_count) == (graphs, breaks), str(report)
    # a warm call hits the cache and gives the same answer
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(fn)
    compiled(x.clone())
    n = len(backend.graphs)
    assert_same(compiled(x.clone()), expected)
    assert len(backend.graphs) == n


# -- exceptions leaving the captured frame: as eager ------------------------------------------


def validate(x, log):
    log.append("checked")
    if x.dim() != 2:
        raise ValueError(f"expected a matrix, got {x.dim()} dims")
    return x * 2


def inner_raises(x, log):
    y = x + 1
    log.append("before")
    _middle(y, log)
    return y


def shape_error(x):
    y = x * 2
    return y @ torch.ones(3, 3)


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except Exception as e:
        return type(e), str(e)


@pytest.mark.parametrize(
    "fn,make",
    [
        (validate, lambda: (torch.randn(3), [])),
        (validate, lambda: (torch.randn(3, 3), [])),
        (inner_raises, lambda: (torch.randn(3), [])),
        (shape_error, lambda: (torch.randn(2, 2),)),
    ],
)
def test_escaping_exception_as_eager(fn, make):
    args = make()
    eager_args, captured_args = clone_args(args), clone_args(args)
    want = _outcome(fn, *eager_args)
    compiled = kiln_capture.optimize(CountingBackend())(fn)
    for _ in range(2):  # cold and warm
        got_args = clone_args(captured_args)
        got = _outcome(compiled, *got_args)
        assert got[0] == want[0]
        if want[0] == "ok":
            assert_same(got[1], want[1])
        else:
            assert got[1] == want[1]
        assert_same(got_args, eager_args, "args")


def test_validation_raise_keeps_the_frame_compiled():
    """A frame that raises on a bad input still compiles for good inputs (the raise is
    generated code after the graph, not a reason to run the frame eagerly)."""
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(validate)
    with pytest.raises(ValueError, match="expected a matrix, got 1 dims"):
        compiled(torch.randn(3), [])
    log: list = []
    x = torch.randn(3, 3)
    assert_same(compiled(x, log), x * 2)
    assert log == ["checked"]
    assert kiln_capture.stats()["eager_frames"] == 0


def _undefined_global_caught(x):
    try:
        kiln_not_defined_anywhere.sqrt(4)
        return x + 1
    except NameError as e:
        return x - 1, str(e)


def _undefined_global_raised(x):
    y = x * 2
    return kiln_not_defined_anywhere(y)  # noqa: F821


def test_an_undefined_global_raises_name_error_in_the_trace():
    """eager's NameError, caught by the frame's handler in the graph; the name is guarded
    to stay undefined (defined later: recompiled, its value used)."""
    backend = CountingBackend()
    fast = kiln_capture.optimize(backend, fullgraph=True)(_undefined_global_caught)
    x = torch.randn(3)
    assert_same(fast(x), _undefined_global_caught(x))
    assert len(backend.graphs) == 1
    raising = kiln_capture.optimize(CountingBackend(), fullgraph=True)(_undefined_global_raised)
    with pytest.raises(NameError, match="kiln_not_defined_anywhere"):
        raising(x)
    globals()["kiln_not_defined_anywhere"] = math
    try:
        assert_same(fast(x), x + 1)
    finally:
        del globals()["kiln_not_defined_anywhere"]
    assert kiln_capture.stats()["eager_frames"] == 0
