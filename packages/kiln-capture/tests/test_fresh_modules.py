"""torch.nn modules built inside the captured frame (variables/fresh_modules.py): one
graph for every call, no recompiles, parameters initialized as eager initializes them."""

import pytest
import torch
from helpers import CountingBackend, assert_same
from torch import nn

import kiln_capture


def _run(fn, make_args, calls=20, seeded=True):
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(fn)
    before = kiln_capture.stats()
    for i in range(calls):
        args = make_args(i)
        torch.manual_seed(i)
        expected = fn(*args)
        torch.manual_seed(i)
        got = compiled(*args)
        assert_same(got, expected)
    after = kiln_capture.stats()
    return backend, {k: after[k] - before.get(k, 0) for k in after}


def _x(i):
    return (torch.randn(2, 4),)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return nn.Sequential(nn.ReLU())(self.lin(x))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: nn.Sequential(nn.ReLU(), nn.Tanh())(x) * 2,
        lambda x: nn.Linear(4, 3)(x).relu(),
        lambda x: nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2))(x),
        lambda x: nn.LayerNorm(x.shape[-1])(x) + nn.Linear(x.shape[-1], 4, bias=False)(x),
        _Block(),
    ],
    ids=["parameterless", "linear", "nested", "sized-by-input", "in-module-forward"],
)
def test_module_built_each_call_is_one_graph(fn):
    backend, delta = _run(fn, _x)
    assert len(backend.graphs) == 1
    assert delta["recompiles"] == 0 and delta["breaks"] == 0 and delta["eager_frames"] == 0


def test_fresh_parameters_get_gradients_and_the_module_escapes():
    def f(x):
        lin = nn.Linear(4, 3)
        return lin(x).sum(), lin

    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(f)
    seen = []  # the modules themselves: a freed one's id could be reused
    for i in range(3):
        x = torch.randn(2, 4, requires_grad=True)
        torch.manual_seed(i)
        ref_loss, ref_lin = f(x)
        torch.manual_seed(i)
        x2 = x.detach().clone().requires_grad_(True)
        loss, lin = compiled(x2)
        assert type(lin) is nn.Linear and all(lin is not s for s in seen)  # new each call
        seen.append(lin)
        assert_same(lin.weight, ref_lin.weight)
        ref_loss.backward()
        loss.backward()
        assert_same(lin.weight.grad, ref_lin.weight.grad)
        assert_same(x2.grad, x.grad)
    assert len(backend.graphs) == 1  # captured once, not run eagerly nor recompiled


def test_random_op_before_the_module_keeps_eager_order():
    def f(x):
        noise = torch.rand(4)
        return nn.Linear(4, 4)(x + noise)

    _run(f, _x, calls=3)


def test_default_dtype_is_guarded():
    def f(x):
        return nn.Linear(4, 2)(x.to(torch.get_default_dtype()))

    backend, _ = _run(f, _x, calls=2)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _run(f, _x, calls=1)
    finally:
        torch.set_default_dtype(old)


def test_stateless_module_from_trace_no_identity_guard():
    report = kiln_capture.explain(lambda x: nn.Dropout(0.0)(nn.ReLU()(x)))(torch.randn(3))
    assert (report.graph_count, report.break_count) == (1, 0)
    assert "is the object seen at capture (ReLU)" not in str(report)


class _Joined(nn.Module):  # no constructor of its own: nn.Module.__init__ builds it
    def forward(self, x, y):
        return torch.relu(torch.cat((x, y), dim=1))


def _builds_user_modules(x):
    return _Joined()(x, x * 2)


def test_user_module_without_a_constructor_is_built_fresh():
    backend, stats = _run(_builds_user_modules, _x, calls=5)
    assert len(backend.graphs) == 1
    assert stats["recompiles"] == 0 and stats["eager_frames"] == 0 and stats["breaks"] == 0
