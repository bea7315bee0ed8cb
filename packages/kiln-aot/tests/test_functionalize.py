"""Functionalization: graphs before/after, compared structurally and against eager."""

import pytest
import torch

import kiln_aot
from kiln_aot import Unsupported, trace
from kiln_aot.functionalize import functional_variant

aten = torch.ops.aten


def _ops(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _run_and_compare(fn, *inputs):
    """Trace, then run the graph + write-back by hand and compare with eager."""
    gm = trace(fn, list(inputs))
    kiln_aot.verify_graph(gm)
    info = gm.meta["kiln_aot"]
    eager_inputs = [t.clone() for t in inputs]
    graph_inputs = [t.clone() for t in inputs]
    expected = fn(*eager_inputs)
    outs = gm(*graph_inputs)
    n_user = info.num_tensor_outputs
    for idx, value in zip(info.mutated_inputs, outs[n_user:]):
        graph_inputs[idx].copy_(value)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, exp in zip(outs[:n_user], expected):
        torch.testing.assert_close(got, exp)
    for got, exp in zip(graph_inputs, eager_inputs):
        torch.testing.assert_close(got, exp)
    return gm


def test_inplace_on_input_becomes_functional_op_plus_mutation_output():
    def f(x):
        x.mul_(2)
        return x + 1

    gm = _run_and_compare(f, torch.randn(3))
    assert _ops(gm) == ["aten.mul.Tensor", "aten.add.Tensor"]
    assert gm.meta["kiln_aot"].mutated_inputs == (0,)


def test_write_through_slice_view_becomes_slice_scatter():
    def f(x):
        x[1:3].add_(10)
        return x.sum(0)

    gm = _run_and_compare(f, torch.randn(5, 4))
    ops = _ops(gm)
    assert "aten.slice_scatter.default" in ops
    assert ops.index("aten.slice_scatter.default") < ops.index("aten.sum.dim_IntList")


def test_nested_views_select_of_transpose():
    def f(x):
        x.t()[2].zero_()
        return x * 1

    gm = _run_and_compare(f, torch.randn(4, 5))
    assert "aten.select_scatter.default" in _ops(gm)


def test_other_views_of_the_base_see_the_write():
    def f(x):
        a = x.view(-1)
        row = x[0]
        a.add_(1)  # write through one alias
        return row * 2  # read through another, created before the write

    _run_and_compare(f, torch.randn(3, 4))


def test_intermediate_mutation_and_view_chain():
    def f(x):
        y = x.clone()
        v = y.unsqueeze(0).permute(0, 2, 1)
        v.mul_(3)
        v[0, 0].fill_(7)
        return y, v.sum()

    _run_and_compare(f, torch.randn(4, 6))


def test_copy_into_view_with_broadcast_and_dtype_change():
    def f(x, src):
        x[:, :2].copy_(src)  # src: float64, broadcast over rows
        return x.relu()

    _run_and_compare(f, torch.randn(3, 5), torch.randn(2, dtype=torch.float64))


def test_out_variant_is_functionalized():
    def f(a, b, out):
        torch.add(a, b, out=out)
        return out * 2

    gm = _run_and_compare(f, torch.randn(4), torch.randn(4), torch.randn(4))
    assert gm.meta["kiln_aot"].mutated_inputs == (2,)


def test_write_back_order_is_order_of_first_write():
    def f(a, b):
        b.add_(1)
        a.add_(2)
        b.mul_(3)
        return a + b

    gm = _run_and_compare(f, torch.randn(3), torch.randn(3))
    assert gm.meta["kiln_aot"].mutated_inputs == (1, 0)


def test_returning_the_mutated_input_is_an_alias_output():
    gm = trace(lambda x: x.add_(1), [torch.randn(3)])
    (out_info,) = gm.meta["kiln_aot"].outputs
    assert out_info.kind == "alias" and out_info.input_index == 0


def test_metadata_mutation_of_an_input_is_unsupported():
    """The caller's tensor would change shape after the call: the graph does not."""
    with pytest.raises(Unsupported) as e:
        trace(lambda x: x.t_(), [torch.randn(2, 3)])
    assert "t_" in str(e.value.op)
    with pytest.raises(Unsupported):
        trace(lambda x: x.clone().resize_(6), [torch.randn(2, 3)])


def test_inplace_views_of_intermediates_turn_the_tensor_into_the_view():
    """t_/transpose_/squeeze_/unsqueeze_ on a tensor the graph made: later reads see the
    view, writes through it reach the storage (and views taken before), the result is
    returned in the view's shape."""

    def f(x):
        y = x * 2
        before = y[0]  # a view taken before the in-place transpose
        y.t_()
        y[0] += 1  # a write through the transposed tensor
        z = x + 1
        z.unsqueeze_(0).transpose_(1, 2).squeeze_(0)
        z[:, 1] *= 3
        return y, before, y.sum(0), z

    gm = _run_and_compare(f, torch.randn(3, 4))
    ops = _ops(gm)
    assert "aten.permute.default" in ops and "aten.select_scatter.default" in ops


def test_functional_variants():
    assert functional_variant(aten.add_.Tensor) is aten.add.Tensor
    assert functional_variant(aten.add.out) is aten.add.Tensor
    assert functional_variant(aten.bernoulli_.float) is aten.bernoulli.p
    assert functional_variant(aten.index_put_.default) is aten.index_put.default


def test_index_put_inplace():
    def f(x, idx, v):
        x[idx] = v
        return x.sum()

    _run_and_compare(f, torch.randn(6, 3), torch.tensor([0, 4]), torch.randn(2, 3))


def test_foreach_inplace_ops_on_lists_of_inputs():
    def sgd_step(p1, p2, g1, g2):
        torch._foreach_add_([p1, p2], [g1, g2], alpha=-0.1)
        torch._foreach_mul_([p1, p2], 0.5)
        return p1.sum()

    gm = _run_and_compare(sgd_step, torch.randn(3), torch.randn(4), torch.randn(3), torch.randn(4))
    assert gm.meta["kiln_aot"].mutated_inputs == (0, 1)


def test_write_to_a_closed_over_tensor_is_unsupported():
    state = torch.zeros(3)

    def f(x):
        state.add_(x)
        return x * 2

    with pytest.raises(Unsupported, match="not an input"):
        trace(f, [torch.randn(3)])


def test_masked_assignment_becomes_where():
    def f(x, m):
        x[m] = -1.0
        x[x > 1] = 5.0
        return x * 2

    gm = _run_and_compare(f, torch.randn(4, 5), torch.rand(4) > 0.5)
    assert "aten.where.self" in _ops(gm)


def test_masked_gather_is_an_index_by_nonzero():
    """x[mask] reads: a library call of nonzero (sized by an unbacked symbol) and an index
    by its columns (kiln_shapes.unbacked)."""
    gm = trace(lambda x: x[x > 0] * 2, [torch.randn(5)])
    ops = _ops(gm)
    assert "aten.nonzero.default" in ops and "aten.index.Tensor" in ops
    x = torch.randn(5)
    torch.testing.assert_close(gm(x)[0], x[x > 0] * 2)


def _assert_in_order(text, fragments):
    pos = 0
    for frag in fragments:
        found = text.find(frag, pos)
        assert found >= 0, f"{frag!r} not found (in order) in:\n{text}"
        pos = found + len(frag)


def test_printed_graph_of_a_write_through_a_view():
    """Before: x[1:3].add_(10); return x.sum(0). After: slice, add, slice_scatter back into
    x, the sum reads the scattered value, and x's new value is the last output."""

    def f(x):
        x[1:3].add_(10)
        return x.sum(0)

    gm = trace(f, [torch.randn(5, 4)])
    _assert_in_order(
        gm.code,
        [
            "slice_tensor = torch.ops.aten.slice.Tensor(arg_1, 0, 1, 3",
            "add_tensor = torch.ops.aten.add.Tensor(slice_tensor, 10",
            "slice_scatter_default = torch.ops.aten.slice_scatter.default(arg_1, add_tensor, 0, 1, 3",
            "sum_dim_int_list = torch.ops.aten.sum.dim_IntList(slice_scatter_default, [0])",
            "return (sum_dim_int_list, slice_scatter_default)",
        ],
    )


def test_views_between_real_and_complex_of_intermediates_are_library_copies():
    """view_as_real/view_as_complex of a tensor the graph made: their copy forms as library
    calls, with writes through either carried back (torch.complex writes ``.real``)."""

    def f(x):
        c = torch.complex(x, x + 1)
        r = torch.view_as_real(c)
        r.mul_(2)  # reaches c
        return c * 1j, r + 1, torch.view_as_complex(r * 3)

    gm = _run_and_compare(f, torch.randn(4, 3))
    library = [n.target for n in gm.graph.nodes if n.meta.get("kiln_library_op")]
    assert aten.view_as_real_copy.default in library
    assert aten.view_as_real.default not in [n.target for n in gm.graph.nodes]
