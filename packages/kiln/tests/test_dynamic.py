"""Dynamic shapes end to end (kiln.compile on the CPU): every program of the corpus
(dynamic_programs.py), called at six sizes including odd and prime ones, compiles into one
graph with ``dynamic=True`` and at most two by default, with results (and gradients of the
training programs) equal to eager at every size, no graph break and no fallback."""

from __future__ import annotations

import copy
import pathlib
import sys

import pytest
import torch

import kiln

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from dynamic_programs import PROGRAMS, Program, loss_of


def _leaves(out):
    if isinstance(out, (tuple, list)):
        return [o for x in out for o in _leaves(x)]
    return [out]


def _run(program: Program, dynamic):
    torch.manual_seed(0)
    eager = program.make()
    compiled_model = copy.deepcopy(eager) if isinstance(eager, torch.nn.Module) else eager
    kiln.reset()
    compiled = kiln.compile(compiled_model, dynamic=dynamic)
    for n in program.sizes:
        args = program.inputs(n)
        mine = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
        want = eager(*args)
        got = compiled(*mine)
        for g, w in zip(_leaves(got), _leaves(want), strict=True):
            torch.testing.assert_close(g, w, **program.tol)
        if program.train:
            loss_of(want).backward()
            loss_of(got).backward()
            for a, b in zip(mine, args):
                torch.testing.assert_close(a.grad, b.grad, **program.tol)
            if isinstance(eager, torch.nn.Module):
                for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
                    torch.testing.assert_close(q.grad, p.grad, **program.tol, msg=name)
                    p.grad = q.grad = None
    return kiln.stats()


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_dynamic_true_builds_one_graph_for_every_size(program: Program):
    stats = _run(program, dynamic=True)
    assert stats["graphs"] == 1, stats
    assert stats["breaks"] == 0 and stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_default_builds_at_most_two_graphs(program: Program):
    stats = _run(program, dynamic=None)
    assert 1 <= stats["graphs"] <= 2, stats
    assert stats["breaks"] == 0 and stats["fallbacks"] == 0, stats


def test_static_compiles_per_size():
    program = PROGRAMS[0]
    stats = _run(program, dynamic=False)
    assert stats["graphs"] == len(set(program.sizes)), stats


def test_a_row_sliced_from_a_batch_is_symbolic_whatever_its_size_1_stride():
    """The stride of a size-1 dimension is never read: a row sliced from a wider batch
    (shape (1, n), strides (64, 1)) gets a symbolic length like a contiguous row."""
    kiln.reset()
    f = kiln.compile(lambda x: x.softmax(-1) * 2 + x.shape[-1], dynamic=True)
    base = torch.randn(4, 64)
    for n in (5, 9, 17, 33):
        x = base[:1, :n]
        torch.testing.assert_close(f(x), x.softmax(-1) * 2 + n)
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["fallbacks"] == 0, stats


def test_fuzzer_findings_with_symbolic_sizes():
    """Programs the differential fuzzer found wrong or failing under dynamic=True:
    an output that is a view of an input (its geometry computed per call), a size guarded
    to 1 by a broadcast (a stride-2 slice of 2 elements), a slice write with symbolic
    bounds (slice_scatter)."""

    def view_out(a):
        return a.unsqueeze(0), a * 2

    def broadcast_guarded_one(a):
        return torch.maximum(a, a[:, :, ::2])

    def slice_write(a, b):
        x = a.clone()
        x[:, 1:3] = b
        return x

    cases = [
        (view_out, lambda n: (torch.randn(n, 3),)),
        (broadcast_guarded_one, lambda n: (torch.randn(3, n, 2),)),
        (slice_write, lambda n: (torch.randn(4, n), torch.randn(4, 2))),
    ]
    for fn, make in cases:
        kiln.reset()
        compiled = kiln.compile(fn, dynamic=True)
        for n in (5, 9, 13):
            args = make(n)
            got, want = compiled(*args), fn(*args)
            for g, w in zip(_leaves(got), _leaves(want), strict=True):
                torch.testing.assert_close(g, w)
            if fn is view_out:
                assert got[0].data_ptr() == args[0].data_ptr()  # a view, as eager returns
        stats = kiln.stats()
        assert stats["graphs"] == 1 and stats["fallbacks"] == 0, (fn.__name__, stats)


def test_an_int_tensor_plus_a_symbolic_size_stays_an_int():
    """``arange(n) + n`` is int64 (a size is an int scalar in type promotion): its kernel
    computes in int64, which the IR verifier checks, and indexes with it (T5's relative
    positions in a decode step had been computed in float32)."""

    def f(x, w):
        n = x.shape[1]
        pos = torch.arange(n) + n
        return w[pos], pos

    kiln.reset()
    compiled = kiln.compile(f, dynamic=True, options={"raise_on_error": True})
    w = torch.randn(64, 3)
    for n in (5, 9, 13):
        x = torch.randn(2, n)
        got, want = compiled(x, w), f(x, w)
        assert got[1].dtype == torch.int64
        torch.testing.assert_close(got, want)
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0


def test_an_element_read_at_the_kernel_start_is_guarded_by_run_time_sizes():
    """x * s[0] with symbolic sizes: kiln-cpp reads s[0] once at the kernel's start, only
    when the loops run, so sizes of 0 rows read nothing (the read of an empty input
    segfaulted before)."""
    kiln.reset()
    f = kiln.compile(lambda x, s: x * s[0], dynamic=True)
    for rows in (5, 0, 3):
        x, s = torch.randn(rows, 3), torch.randn(1)
        torch.testing.assert_close(f(x, s), x * s[0])
        x0 = torch.randn(rows, 0)
        torch.testing.assert_close(f(x0, torch.randn(1).expand(1)), x0 * 0)
    assert kiln.stats()["fallbacks"] == 0
