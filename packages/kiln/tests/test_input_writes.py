"""Inputs a compiled program writes in place are written by the kernels themselves
(kiln-aot marks which graph outputs are new values of which inputs; kiln-inductor computes
each in the input's storage when nothing reads the old value afterwards, at another index or
later), so no buffer is allocated for them and nothing is copied back. Results, the written
inputs and their version counters agree with eager; programs that read the old value after
the write, or read it transposed, still get eager's answers (they keep the copy). An
optimizer step (whose body runs under no_grad while the parameters require grad) compiles
without a backward; the steady state of SGD with momentum and of AdamW allocates nothing
(a value that reads the old input in the same loop as the input's new value is computed
still can: the backends store such outputs after the loop body has read everything)."""

from __future__ import annotations

import pytest
import torch

import kiln
import kiln_inductor.compile as inductor_compile


@pytest.fixture
def wrappers(monkeypatch):
    monkeypatch.setenv("KILN_ARTIFACT_CACHE", "0")  # every graph compiled here, seen
    seen: list[str] = []
    inner = inductor_compile.compile_aten_graph

    def spy(gm, example_inputs):
        compiled = inner(gm, example_inputs)
        seen.append(compiled.wrapper_source)
        return compiled

    monkeypatch.setattr(inductor_compile, "compile_aten_graph", spy)
    return seen


def _in_place_inputs(source: str) -> int:
    return sum("# in place" in line and "= arg" in line for line in source.splitlines())


def _update(x, y):
    x.mul_(0.5).add_(y)
    return x.sum()


def _read_after(x, y):
    old = x * 3
    x.add_(y)
    return old + x.t()  # the old value, and the new one transposed


def _two_writes(x, y):
    # y's value reads the old x at the index where x's new value goes, in the same loop:
    # the backends store x's new value after the block has read it, so both are written
    # in place
    x.add_(1.0)
    y.mul_(x)
    return None


@pytest.mark.parametrize(
    "fn,donated", [(_update, 1), (_read_after, 0), (_two_writes, 2)], ids=lambda v: str(v)
)
def test_written_inputs_match_eager(fn, donated, wrappers):
    torch.manual_seed(0)
    x, y = torch.randn(16, 16), torch.randn(16, 16)
    ex, ey = x.clone(), y.clone()
    kiln.reset()
    compiled = kiln.compile(fn)
    for _ in range(3):
        want = fn(ex, ey)
        v0 = (x._version, y._version)
        got = compiled(x, y)
        if want is not None:
            torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, ex)
        torch.testing.assert_close(y, ey)
        assert x._version > v0[0]
    assert kiln.stats()["graphs"] >= 1 and kiln.stats()["fallbacks"] == 0
    assert wrappers and _in_place_inputs(wrappers[-1]) == donated, wrappers[-1]


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_optimizer_step_writes_parameters_in_place(name, wrappers):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    twin.load_state_dict(model.state_dict())

    def make(m):
        if name == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        return torch.optim.AdamW(m.parameters(), lr=0.01)

    opt, eager_opt = make(model), make(twin)
    kiln.reset()
    step = kiln.compile(opt.step)
    ptrs = [p.data_ptr() for p in model.parameters()]
    for _ in range(4):
        x = torch.randn(5, 8)
        for m in (model, twin):
            m.zero_grad()
            m(x).square().mean().backward()
        step()
        eager_opt.step()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert [p.data_ptr() for p in model.parameters()] == ptrs
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["eager_frames"] == 0
    steady = wrappers[-1]
    params = len(list(model.parameters()))
    assert _in_place_inputs(steady) >= params, steady  # every parameter written in place
    # and the optimizer's state (SGD's momentum, AdamW's two moments): nothing allocated,
    # nothing copied back
    assert "empty_strided" not in steady, steady
    assert _in_place_inputs(steady) >= (2 if name == "sgd" else 3) * params, steady


def test_a_later_backward_through_a_written_parameter_still_raises():
    """Eager's version check survives: a tensor saved for backward and then written by the
    compiled step makes that backward raise, as eager's in-place write does."""
    w = torch.nn.Parameter(torch.randn(4, 4))
    out = (w * w).sum()  # saves w

    @kiln.compile
    def bump():
        with torch.no_grad():
            w.add_(1.0)

    bump()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


def test_an_input_at_a_storage_offset_is_written_where_it_lies(wrappers):
    """A donated input that is a slice of a larger tensor: the kernel writes through the
    input itself (a view rebuilt from offset 0 wrote the base's first rows)."""
    torch.manual_seed(0)
    base, y = torch.randn(5, 16), torch.randn(4, 16)
    twin = base.clone()
    kiln.reset()
    compiled = kiln.compile(_update)
    for _ in range(2):
        got, want = compiled(base[1:], y), _update(twin[1:], y)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(base, twin)  # row 0 untouched, rows 1: updated
    assert _in_place_inputs(wrappers[-1]) == 1, wrappers[-1]
