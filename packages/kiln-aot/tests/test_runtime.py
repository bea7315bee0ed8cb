"""Runtime wrapper: autograd.Function behaviour, non-differentiable outputs, write-back."""

import pytest
import torch
from kiln_aot_testing import assert_close

from kiln_aot import DoubleBackwardError, aot_function


def test_double_backward_raises_a_clear_error(compiler):
    cf = aot_function(lambda x: (x.sin() * x).sum(), compiler)
    x = torch.randn(5, requires_grad=True)
    (g,) = torch.autograd.grad(cf(x), x, create_graph=True)
    assert_close(g, x.cos() * x + x.sin())  # first-order gradients are still right
    with pytest.raises(RuntimeError) as e:
        g.sum().backward()
    assert "double backward" in str(e.value)
    assert DoubleBackwardError.MESSAGE.splitlines()[0] in str(e.value)


def test_non_differentiable_outputs(compiler):
    def f(x):
        y = x * 2
        return y, y > 0, y.argmax(), x.shape[0]

    cf = aot_function(f, compiler)
    x = torch.randn(6, requires_grad=True)
    y, mask, idx, n = cf(x)
    assert n == 6 and mask.dtype == torch.bool and not mask.requires_grad
    assert torch.equal(mask, (x * 2) > 0) and int(idx) == int((x * 2).argmax())
    y.sum().backward()
    assert_close(x.grad, torch.full((6,), 2.0))


def test_inputs_that_do_not_require_grad_get_no_gradient(compiler):
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)
    cf = aot_function(lambda x, w: (x @ w).tanh(), compiler)
    cf(x, w).sum().backward()
    assert x.grad is None
    assert_close(w.grad, x.t() @ (1 - (x @ w).tanh() ** 2))


def test_unused_output_gradients_are_zero(compiler):
    cf = aot_function(lambda x: (x * 3, x * 5), compiler)
    x = torch.randn(4, requires_grad=True)
    a, _ = cf(x)
    a.sum().backward()
    assert_close(x.grad, torch.full((4,), 3.0))


def test_non_contiguous_upstream_gradient(compiler):
    cf = aot_function(lambda x: x.exp(), compiler)
    x = torch.randn(4, 6, requires_grad=True)
    out = cf(x)
    g = torch.randn(6, 4).t()  # non-contiguous
    out.backward(g)
    assert_close(x.grad, x.exp() * g)


def test_saved_input_that_is_overwritten_keeps_its_old_value(compiler):
    def f(x, w):
        h = x.expand(3, 5).exp()  # min-cut saves x (5 floats) rather than h (15)
        x.add_(1)
        return h * w

    x, w = torch.randn(5), torch.randn(3, 5, requires_grad=True)
    x0 = x.clone()
    out = aot_function(f, compiler)(x, w)
    fw = compiler.graphs[0]
    saved = fw.graph.output_node().args[0][1 + 1 :]  # after the output and x's new value
    assert [n.name for n in saved] == ["primals_1"]
    out.sum().backward()
    assert_close(x, x0 + 1)
    assert_close(w.grad, x0.exp().expand(3, 5))


def test_in_place_writes_to_an_activation_that_requires_grad_like_eager(compiler):
    """A graph often receives activations (non-leaf, requiring grad) and writes to them in
    place (``h += r``, ``h.relu_()``): values and gradients follow eager."""

    def f(h, w):
        h.mul_(2)
        h[0].add_(w)
        return (h.relu() * w).sum(), h[1]

    cf = aot_function(f, compiler)
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    h = x * 1
    loss, view = cf(h, w)
    (loss + view.sum()).backward()
    got = [x.grad.clone(), w.grad.clone()]
    h_after = h.detach().clone()
    x.grad = w.grad = None
    h_ref = x * 1
    loss_ref, view_ref = f(h_ref, w)
    (loss_ref + view_ref.sum()).backward()
    assert_close(loss, loss_ref)
    assert_close(h_after, h_ref.detach())
    assert view.untyped_storage().data_ptr() == h.untyped_storage().data_ptr()
    assert_close(got[0], x.grad)
    assert_close(got[1], w.grad)


def test_in_place_write_with_grad_to_a_leaf_errors_like_eager(compiler):
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        aot_function(lambda x: x.mul_(2), compiler)(x)


def test_recompiles_per_signature_and_reuses_cache(compiler):
    cf = aot_function(lambda x: x.relu() + 1, compiler)
    with torch.no_grad():
        cf(torch.randn(3))
        cf(torch.randn(3))
        assert len(compiler.graphs) == 1
        cf(torch.randn(4, 2))
        assert len(compiler.graphs) == 2


def test_grad_mode_off_at_call_time_compiles_forward_only(compiler):
    cf = aot_function(lambda x: x.sigmoid(), compiler)
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        out = cf(x)
    assert not out.requires_grad and len(compiler.graphs) == 1
    assert all(not n.name.startswith("tangents") for n in compiler.graphs[0].graph.nodes)


def test_aliased_inputs_with_a_write_run_eagerly_with_a_warning(compiler):
    def f(a, b):
        a.add_(1)
        return b * 2

    cf = aot_function(f, compiler)
    x = torch.randn(3)
    y = x.clone()
    with pytest.warns(UserWarning, match="running eagerly"):
        out = cf(x, x)
    expected = f(y, y)  # eager on the same aliased input
    assert_close(out, expected)
    assert_close(x, y)


def test_parameter_written_under_no_grad_like_eager(compiler):
    """A module clamping its own weight in place under no_grad: the write is carried back to
    the parameter and the gradient flows to it, as in eager."""
    import copy

    from kiln_aot import aot_module

    class Clamped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            with torch.no_grad():
                self.w.clamp_(-0.5, 0.5)
            return (x @ self.w).tanh()

    m = Clamped()
    ref = copy.deepcopy(m)
    x = torch.randn(3, 4)
    out, expected = aot_module(m, compiler)(x), ref(x)
    assert_close(out, expected)
    assert_close(m.w.detach(), ref.w.detach())
    out.sum().backward()
    expected.sum().backward()
    assert_close(m.w.grad, ref.w.grad)


@pytest.mark.parametrize(
    "fn, plain",
    [
        (lambda x: (x.sin(), x.cos()), True),
        (lambda x: x.sin(), False),  # a bare tensor, not a tuple
        (lambda x: {"s": x.sin()}, False),
        (lambda x: (x.view(2, 2), x.sin()), False),  # an alias of the input
        (lambda x: (x.sin(), 3), False),  # a constant output
        (lambda x: (x.mul_(2).sin(),), False),  # a written input
    ],
)
def test_plans_return_graph_outputs_as_they_are_only_when_finish_would(compiler, fn, plain):
    from kiln_aot import api

    x = torch.randn(4)
    with torch.no_grad():
        compiled = api.AotCompiled(fn, compiler, None, None, None)
        plan = compiled.plan_for([x.clone()])
        assert plan.plain is plain
        a, b = x.clone(), x.clone()
        got, expected = compiled.run([a]), fn(b)
    assert type(got) is type(expected)
    for g, e in zip(pytree_leaves(got), pytree_leaves(expected), strict=True):
        if isinstance(e, torch.Tensor):
            assert_close(g, e)
        else:
            assert g == e
    assert_close(a, b)


def pytree_leaves(out):
    from torch.utils import _pytree

    return _pytree.tree_leaves(out)


def test_dtype_changing_views_of_inputs_are_real_views(compiler):
    """view_as_complex/view_as_real of an input (or of a view of it) returned: rebuilt by
    replaying the views on the caller's tensor (as_strided cannot change the dtype), so
    the output shares its storage as eager's does, and gradients flow through it."""

    def f(x, z):
        return torch.view_as_complex(x[1:]), torch.view_as_real(z).transpose(0, 1), x.sum()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 2, generator=g)
    z = torch.randn(3, 4, dtype=torch.complex64, generator=g)
    cf = aot_function(f, compiler)
    out, ref = cf(x, z), f(x, z)
    for o, r in zip(out, ref):
        assert_close(o, r)
        assert o.dtype == r.dtype and o.stride() == r.stride()
    assert out[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert out[1].untyped_storage().data_ptr() == z.untyped_storage().data_ptr()
    x[1, 0, 0] = 100.0  # a view: the caller's writes show through it, as in eager
    assert out[0][0, 0].real == 100.0

    w = torch.arange(16.0).view(2, 4, 2)
    grads = []
    for fn in (cf, f):
        xg = x.clone().requires_grad_()
        (torch.view_as_real(fn(xg, z)[0]) * w).sum().backward()
        grads.append(xg.grad)
    assert_close(grads[0], grads[1])
    assert_close(grads[0], torch.cat([torch.zeros(1, 4, 2), w]))


def rotary_like(inv_freq, pos, x, w):
    """A matmul under the caller's autocast, then a region that turns autocast off (as
    rotary embeddings do) around a matmul whose float32 result feeds cos."""
    h = x @ w
    with torch.autocast("cpu", enabled=False):
        freqs = (inv_freq[None, :, None].float() @ pos[:, None, :].float()).transpose(1, 2)
        cos = torch.cat((freqs, freqs), -1).cos()
    return h * cos.to(h.dtype)[0, :, :1], cos


def _rotary_inputs(requires_grad=False):
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    pos = torch.arange(300)[None].expand(2, 300)
    x, w = torch.randn(300, 8), torch.randn(8, 8, requires_grad=requires_grad)
    return inv, pos, x, w


@pytest.mark.parametrize("requires_grad", [False, True])
def test_compiled_code_runs_without_the_callers_autocast(compiler, requires_grad):
    """The traced graph holds autocast's casts; its compiled code runs with autocast off,
    else the matmul of the disabled region, called again at run time, would be cast to
    bfloat16 and its consumer read a bf16 buffer as float32."""
    cf = aot_function(rotary_like, compiler)
    args = _rotary_inputs(requires_grad)
    ref = (*args[:3], args[3].detach().clone().requires_grad_(requires_grad))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = cf(*args), rotary_like(*ref)
    assert [t.dtype for t in got] == [t.dtype for t in want] == [torch.bfloat16, torch.float32]
    assert_close(got[1], want[1])
    assert_close(got[0].float(), want[0].float())
    if requires_grad:
        got[0].float().sum().backward()
        want[0].float().sum().backward()
        assert_close(args[3].grad, ref[3].grad)
    # the same function outside autocast: its own plan, float32 throughout
    out = cf(*args)
    assert out[0].dtype == torch.float32
    assert_close(out[0], rotary_like(*args)[0])
