"""The frame hook: on only while an optimized function runs, per thread; skips torch and
the standard library; safe under recursion, exceptions and threads."""

import threading

import pytest
import torch
from helpers import CountingBackend

import kiln_capture
from kiln_capture import _C, hook


def test_hook_is_off_outside_optimized_calls():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(lambda x: x + 1)
    assert not _C.is_enabled()
    f(torch.randn(2))
    assert not _C.is_enabled()


def test_skip_list():
    assert hook.skipped_file(torch.__file__)
    assert hook.skipped_file(threading.__file__)
    assert hook.skipped_file(kiln_capture.__file__)
    assert not hook.skipped_file(torch.nn.modules.linear.__file__)
    assert hook.skipped_file(torch.nn.modules.module.__file__)
    assert not hook.skipped_file(__file__)


def test_torch_module_constructors_run_eagerly():
    """A torch.nn module built while compiled code runs (after a break) is built eagerly:
    its ``__init__`` frame is never captured, so a new module per call does not recompile
    the constructor against each new ``self`` until the cache limit."""

    def f(x):
        y = x * 2
        print(end="")  # a break: the rest runs as a continuation
        layer = torch.nn.Linear(4, 4)
        return layer(y).shape

    compiled = kiln_capture.optimize(CountingBackend())(f)
    for _ in range(10):
        assert compiled(torch.randn(3, 4)) == (3, 4)
    assert hook.cache_entries(torch.nn.Linear.__init__.__code__) == []


def raises_in_graph(x, y):
    return (x @ y) * 2


def test_exceptions_propagate_from_captured_code():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(raises_in_graph)
    with pytest.raises(RuntimeError):
        f(torch.randn(2, 3), torch.randn(2, 3))
    assert not _C.is_enabled()
    torch.testing.assert_close(
        f(torch.ones(2, 3), torch.ones(3, 2)), (torch.ones(2, 3) @ torch.ones(3, 2)) * 2
    )


def eager_error_after_break(x):
    y = x + 1
    print("about to fail")
    raise ValueError(f"user error {y.shape}")


def test_exception_raised_after_a_break():
    f = kiln_capture.optimize(CountingBackend())(eager_error_after_break)
    with pytest.raises(ValueError, match="user error"):
        f(torch.randn(2))


def fact(x, n):
    if n == 0:
        return x
    return fact(x * n, n - 1)


def test_recursion_is_safe():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(fact)
    x = torch.randn(3)
    torch.testing.assert_close(f(x, 4), fact(x, 4))


def test_other_threads_are_not_captured():
    b = CountingBackend()
    seen = []

    def worker():
        seen.append(_C.is_enabled())
        seen.append(torch.relu(torch.randn(2)).shape)

    def f(x):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        return x * 2

    of = kiln_capture.optimize(b)(f)
    of(torch.randn(2))
    assert seen[0] is False


def test_nested_optimize_is_traced_into_the_caller():
    """An optimized function called from captured code is traced there (as torch.compile
    inlines an inner compiled function): the caller's graph holds its ops; called on its
    own, it uses its own backend."""
    outer, inner = CountingBackend(), CountingBackend()

    def g(x):
        return x * 3

    og = kiln_capture.optimize(inner)(g)

    def f(x):
        y = x + 1
        print("a break: g is called from the resumed frame")
        return og(y)

    of = kiln_capture.optimize(outer)(f)
    x = torch.randn(2)
    torch.testing.assert_close(of(x), (x + 1) * 3)
    assert len(inner.graphs) == 0
    assert any("mul" in str(n.target) for gm in outer.graphs for n in gm.graph.nodes)
    torch.testing.assert_close(og(x), x * 3)
    assert len(inner.graphs) == 1


def test_disable_runs_eagerly():
    b = CountingBackend()

    @kiln_capture.disable
    def f(x):
        return x + 1

    of = kiln_capture.optimize(b)(f)
    torch.testing.assert_close(of(torch.ones(2)), torch.full((2,), 2.0))
    assert b.graphs == []


def test_region_boundary_is_not_a_break():
    """A call of a module whose forward is marked ``_kiln_region`` (kiln's FSDP2 units)
    ends the graph and resumes after it, counted as a region boundary, not a break, and
    allowed under fullgraph=True."""

    class Inner(torch.nn.Module):
        def forward(self, x):
            return x * 3

    inner = Inner()
    region = kiln_capture.optimize(CountingBackend())(inner.forward)
    region._kiln_region = True
    inner.forward = region

    def f(x):
        return inner(x.sin()) + 1

    for fullgraph in (False, True):
        kiln_capture.reset()
        b = CountingBackend()
        of = kiln_capture.optimize(b, fullgraph=fullgraph)(f)
        x = torch.randn(4)
        torch.testing.assert_close(of(x), x.sin() * 3 + 1)
        stats = kiln_capture.stats()
        assert stats["breaks"] == 0 and stats["region_boundaries"] == 1, stats
        assert len(b.graphs) == 2  # before and after the call
    explained = kiln_capture.explain(f, torch.randn(4))
    assert explained.break_count == 0 and len(explained.region_boundaries) == 1


def test_many_calls_stay_consistent():
    b = CountingBackend()

    def f(x, i):
        return x * i

    of = kiln_capture.optimize(b)(f)
    x = torch.randn(3)
    for i in range(3):
        for _ in range(50):
            torch.testing.assert_close(of(x, i), x * i)


def test_lambda_is_captured():
    backend = CountingBackend()
    f = kiln_capture.optimize(backend)(lambda x: torch.relu(x) * 2)
    x = torch.randn(4)
    torch.testing.assert_close(f(x), torch.relu(x) * 2)
    assert len(backend.graphs) == 1


def test_capture_in_another_thread_while_a_cache_hit_runs():
    """A cache hit turns the hook off for its thread (and uninstalls it when no other
    thread has it on) while the generated code runs; a thread that enables capture
    meanwhile still has its frames captured, and the hook is back on afterwards."""
    inner = CountingBackend()
    og = kiln_capture.optimize(inner)(double_minus_one)
    seen = []

    def backend(gm, example_inputs):
        def run(*args):
            seen.append(_C.is_enabled())  # off while the cache entry's code runs
            t = threading.Thread(target=lambda: seen.append(og(args[0])))
            t.start()
            t.join()
            return gm.forward(*args)

        return run

    def f(x):
        y = x + 1
        return y, _C.is_enabled()  # a constant of the trace: True at capture

    of = kiln_capture.optimize(backend)(f)
    x = torch.randn(3)
    for _ in range(3):
        y, _ = of(x)
        torch.testing.assert_close(y, x + 1)
    assert len(inner.graphs) == 1
    flags = [s for s in seen if isinstance(s, bool)]
    results = [s for s in seen if isinstance(s, torch.Tensor)]
    assert flags == [False] * 3 and len(results) == 3
    for r in results:
        torch.testing.assert_close(r, x * 2 - 1)
    assert not _C.is_enabled()


def double_minus_one(x):
    return x * 2 - 1


def test_a_frame_capture_gives_up_on_is_warned_counted_and_explained(monkeypatch):
    """A frame capture chooses to leave to Python (a SkipFrame: a break it cannot resume,
    arguments it cannot wrap) warns once with its line, counts in stats()["eager_frames"]
    and is listed by explain(); its result is eager's."""
    from kiln_capture import capture

    def give_up(code, func, args, ctx, frame_shapes):
        return capture.SkipFrame("a reason capture gave")

    monkeypatch.setattr(hook, "compile_frame", give_up)

    def f(x):
        return x * 2

    kiln_capture.reset()
    x = torch.randn(3)
    with pytest.warns(RuntimeWarning, match="runs eagerly: a reason capture gave"):
        out = kiln_capture.explain(f, x)
    torch.testing.assert_close(out.result, x * 2)
    assert out.eager_frames and "a reason capture gave" in out.eager_frames[0]
    assert "runs eagerly" in str(out)
    assert kiln_capture.stats()["eager_frames"] == 1
