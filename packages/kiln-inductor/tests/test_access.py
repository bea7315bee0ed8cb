"""Loop order (scheduler.access.loop_order): a kernel's loops follow the stride order of the
buffer it writes, so NHWC outputs iterate with C fastest; contiguous outputs keep the
logical order; the members of a group share one order."""

import sympy
import torch

from kiln_inductor.graph import GraphLowering
from kiln_inductor.ir.symbols import contiguous_strides
from kiln_inductor.scheduler.access import loop_order, node_access
from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten
N, C, H, W = 2, 8, 5, 6


def _nhwc(*size):
    return torch.randn(*size).contiguous(memory_format=torch.channels_last)


def _schedule(fn, inputs):
    ir = GraphLowering(aten_graph(fn, inputs), inputs).run()
    return ir, [s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]


def _flat(group):
    return sum(
        (v * st for v, st in zip(group.outer_vars, contiguous_strides(group.outer))),
        sympy.Integer(0),
    )


def test_loop_order_is_decreasing_stride():
    ints = [sympy.Integer(s) for s in (N, C, H, W)]
    nhwc = [sympy.Integer(s) for s in (H * W * C, 1, W * C, C)]
    assert loop_order(ints, nhwc) == (0, 2, 3, 1)
    assert loop_order(ints, contiguous_strides(ints)) == (0, 1, 2, 3)
    assert loop_order(ints[:2], [sympy.Integer(1), sympy.Integer(N)]) == (1, 0)  # transposed
    # symbolic strides and empty tensors keep the logical order
    s = sympy.Symbol("s", positive=True, integer=True)
    assert loop_order([s, s], [sympy.Integer(1), s]) == (0, 1)
    assert loop_order(
        [sympy.Integer(0), sympy.Integer(3)], [sympy.Integer(1), sympy.Integer(0)]
    ) == (
        0,
        1,
    )


def test_nhwc_pointwise_loops_in_memory_order():
    def f(x, y):
        return (aten.relu.default(aten.add.Tensor(aten.mul.Tensor(x, 2.0), y)),)

    ir, (group,) = _schedule(f, [_nhwc(N, C, H, W), _nhwc(N, C, H, W)])
    assert group.outer == (N, H, W, C)
    (node,) = group.nodes
    assert node_access(node).reordered
    _, _, store, loads = group.bound[node.name]
    # the store and both loads walk memory contiguously: their index is the flat loop index
    assert sympy.expand(store - _flat(group)) == 0
    assert all(sympy.expand(e - _flat(group)) == 0 for _, e in loads)


def test_contiguous_output_keeps_logical_order():
    def f(x, y):
        return (aten.relu.default(aten.add.Tensor(x, y)),)

    _, (group,) = _schedule(f, [torch.randn(N, C, H, W), _nhwc(N, C, H, W)])
    # eager's output of (contiguous + channels-last) is contiguous: logical loops, and the
    # channels-last operand is read strided (as it always was)
    assert group.outer == (N, C, H, W)
    (node,) = group.nodes
    assert not node_access(node).reordered
    assert sympy.expand(group.bound[node.name][2] - _flat(group)) == 0


def test_members_of_one_size_share_the_first_ones_loop_order():
    """An NHWC output and a contiguous one of the same size: one flat loop, in the order of
    the first (a tie of votes); the second is written strided."""

    def f(x):
        e = aten.exp.default(x)
        return (
            aten.clone.default(e, memory_format=torch.channels_last),
            aten.mul.Tensor(e, 2.0),
        )

    _, groups = _schedule(f, [torch.randn(N, C, H, W)])
    (group,) = groups
    assert len(group.nodes) == 2 and len(group.blocks) == 1
    nhwc, contiguous = group.nodes
    assert nhwc.layout.stride[1] == 1 and contiguous.layout.is_contiguous()
    assert group.outer == (N, H, W, C)
    assert sympy.expand(group.bound[nhwc.name][2] - _flat(group)) == 0
    assert sympy.expand(group.bound[contiguous.name][2] - _flat(group)) != 0


def test_the_order_most_members_write_in_wins():
    def f(x):
        e = aten.exp.default(x)
        return (
            aten.clone.default(e, memory_format=torch.channels_last),
            aten.mul.Tensor(e, 2.0),
            aten.mul.Tensor(e, 3.0),
        )

    _, (group,) = _schedule(f, [torch.randn(N, C, H, W)])
    assert len(group.nodes) == 3 and group.outer == (N, C, H, W)


def test_mean_over_channels_of_nhwc_is_one_row_kernel():
    def f(x):
        return (aten.mul.Tensor(x, aten.mean.dim(x, [1], True)),)

    _, (group,) = _schedule(f, [_nhwc(N, C, H, W)])
    assert group.outer == (N, H, W)
    assert [(b.kind, b.inner, b.rranges) for b in group.blocks] == [
        ("reduction", (), (C,)),
        ("pointwise", (C,), ()),
    ]


def test_reduction_over_hw_keeps_its_ranges_and_parallel_outer_loops():
    """A reduction over (H, W) of an NHWC value: the outer loops are its output's (N, C),
    the reduction ranges stay (H, W). The NHWC producer (its own loops (N, H, W, C)) shares
    only N with it, which would leave one parallel loop: the two fuse in logical order
    instead, as rows over (N, C), the value read once (stored strided)."""

    def f(x):
        y = aten.relu.default(aten.mul.Tensor(x, 3.0))
        return (y, aten.sum.dim_IntList(y, [2, 3]))

    _, (group,) = _schedule(f, [_nhwc(N, C, H, W)])
    assert group.outer == (N, C)
    assert [(b.kind, b.inner, b.rranges) for b in group.blocks] == [
        ("reduction", (), (H, W)),
        ("pointwise", (H, W), ()),
    ]


def test_groups_of_disagreeing_orders_that_give_no_rows_stay_apart():
    """Pooling windows of two sizes over one NHWC input: in memory order the outputs share
    only N, in logical order (N, C) with inner loops of different sizes; neither is rows,
    so they are two kernels, each flat in memory order."""

    def f(x):
        return (
            aten.avg_pool2d.default(x, [2, 2], [2, 2]),
            aten.avg_pool2d.default(x, [3, 3], [3, 3]),
        )

    _, groups = _schedule(f, [_nhwc(N, C, 6, 6)])
    assert len(groups) == 2
    for g in groups:
        (node,) = g.nodes
        assert [(b.kind, b.inner) for b in g.blocks] == [("pointwise", ())]
        assert sympy.expand(g.bound[node.name][2] - _flat(g)) == 0  # flat in memory order
    assert (N, 3, 3, C) in [g.outer for g in groups]
