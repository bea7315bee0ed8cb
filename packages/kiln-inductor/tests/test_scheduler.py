"""Scheduling decisions on printed IR and schedules (no backend needed)."""

import torch

from kiln_inductor.graph import GraphLowering
from kiln_inductor.ir.nodes import ComputedBuffer, ExternKernel
from kiln_inductor.ir.printer import print_ir
from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
from kiln_inductor.scheduler.memory import plan_memory
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten


def schedule(fn, inputs):
    gm = aten_graph(fn, inputs)
    ir = GraphLowering(gm, inputs).run()
    steps = fuse_nodes(ir)
    return ir, steps


def groups(steps):
    return [s for s in steps if isinstance(s, FusedGroup)]


def test_pointwise_chain_is_one_body_and_one_kernel():
    def f(x, y):
        a = aten.add.Tensor(x, y)
        b = aten.exp.default(a)
        c = aten.mul.Tensor(b, 2.0)
        return (aten.relu.default(c),)

    ir, steps = schedule(f, [torch.randn(8, 16), torch.randn(16)])
    assert len(ir.nodes) == 1  # inlined at lowering: one computed buffer
    text = print_ir(ir)
    for fragment in ("load(arg0", "load(arg1", "add(", "exp(", "mul(", "relu("):
        assert fragment in text
    assert len(groups(steps)) == 1


def test_softmax_is_one_kernel_with_register_reductions():
    ir, steps = schedule(lambda x: (aten._softmax.default(x, -1, False),), [torch.randn(64, 100)])
    (g,) = groups(steps)
    assert [b.kind for b in g.blocks] == ["reduction", "reduction", "pointwise"]
    assert len(g.local) == 2  # max and sum never reach memory
    assert g.outputs == [ir.nodes[-1].name]


def test_layer_norm_decomposed_is_at_most_two_kernels():
    def ln(x, w, b):
        mean = aten.mean.dim(x, [1], True)
        d = aten.sub.Tensor(x, mean)
        var = aten.mean.dim(aten.mul.Tensor(d, d), [1], True)
        r = aten.rsqrt.default(aten.add.Tensor(var, 1e-5))
        return (aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(d, r), w), b),)

    _, steps = schedule(ln, [torch.randn(32, 64), torch.randn(64), torch.randn(64)])
    assert len(groups(steps)) <= 2


def test_welford_layer_norm_shares_one_block():
    _, steps = schedule(
        lambda x, w, b: (aten.native_layer_norm.default(x, [64], w, b, 1e-5)[0],),
        [torch.randn(32, 64), torch.randn(64), torch.randn(64)],
    )
    (g,) = groups(steps)
    assert [b.kind for b in g.blocks] == ["welford", "pointwise"]
    assert len(g.blocks[0].nodes) == 2


def test_transposed_read_of_a_group_member_is_not_fused():
    def f(x):
        a = aten.exp.default(x)
        a = aten.mul.Tensor(a, a)  # costly enough to be shared
        s = aten.sum.dim_IntList(a, [1], True)
        t = aten.permute.default(aten.add.Tensor(a, s), [1, 0])
        return (aten.sum.dim_IntList(t, [1]),)

    ir, steps = schedule(f, [torch.randn(16, 16)])
    # the reduction over the transposed value reads other rows: it cannot share row loops
    reads_transposed = [
        g for g in groups(steps) if any(n.name == ir.nodes[-1].name for n in g.nodes)
    ]
    assert reads_transposed and all(len(g.outer) >= 1 for g in groups(steps))


def test_independent_kernels_sharing_an_iteration_space_fuse():
    def f(x, y):
        return (aten.exp.default(x), aten.sin.default(y))

    _, steps = schedule(f, [torch.randn(8, 32), torch.randn(8, 32)])
    assert len(groups(steps)) == 1


def test_independent_values_sharing_only_the_batch_dimension_stay_apart():
    # a ResNet backward's pair: relu of (N, 16, 8, 8) and a value of (N, 32, 4, 4) share
    # only the loop over N; as one kernel each of N programs would loop over the rest
    def f(x, y):
        return (aten.relu.default(x), aten.mul.Tensor(y, 2.0))

    _, steps = schedule(f, [torch.randn(4, 16, 8, 8), torch.randn(4, 32, 4, 4)])
    kernels = groups(steps)
    assert len(kernels) == 2
    for g in kernels:
        assert [b.inner for b in g.blocks] == [()]  # every loop is parallel


def test_a_row_a_reduction_reduces_stays_fused_with_it():
    def f(x):  # softmax over the last dimension: rows, not a sequential loop
        m = aten.amax.default(x, [-1], True)
        e = aten.exp.default(aten.sub.Tensor(x, m))
        return (aten.div.Tensor(e, aten.sum.dim_IntList(e, [-1], True)),)

    _, steps = schedule(f, [torch.randn(4, 8, 64)])
    assert len(groups(steps)) == 1


def _moves(a, b, y):
    e = aten.exp.default(a)
    m = aten.mm.default(e, b)
    c = aten.mul.Tensor(aten.cos.default(a), 2.0)
    return (e, m, aten.sin.default(y), aten.cos.default(a), aten.mm.default(c, b))


def test_independent_nodes_move_to_an_earlier_kernel_only_to_share_data(monkeypatch):
    # exp(a), a matmul reading it, then sin(y) and cos(a) (graph outputs), and cos(a) * 2
    # (not one): sin(y) shares nothing with the first kernel and stays after the matmul;
    # cos(a), an output alive to the end anyway, joins the first kernel, which reads a too;
    # the intermediate cos(a) * 2 would stay alive longer, so it does not cross the matmul
    # when no move across library calls is allowed (MAX_STEPS_BACK = 0)
    import kiln_inductor.scheduler.fuse as fuse

    monkeypatch.setattr(fuse, "MAX_STEPS_BACK", 0)
    inputs = [torch.randn(8, 16), torch.randn(16, 4), torch.randn(8, 16)]
    ir, steps = schedule(_moves, inputs)
    first, *rest = groups(steps)
    mm = next(k for k, s in enumerate(steps) if isinstance(s, ExternKernel))
    assert steps.index(first) < mm < steps.index(rest[0]) < steps.index(rest[1])
    assert len(first.nodes) == 2, first.nodes
    # the second member is cos(a): it reads a (arg0), not y (arg2)
    assert {b for b, _ in first.bound[first.nodes[1].name][3]} == {"arg0"}
    # cos(a) * 2, the second matmul's operand, is computed after the first matmul
    assert [len(g.nodes) for g in rest] == [1, 1]
    assert {b for b, _ in rest[0].bound[rest[0].nodes[0].name][3]} == {"arg0"}


def test_a_node_joins_a_kernel_a_step_back_that_reads_the_same_data():
    # by default cos(a) * 2 crosses the one matmul back into exp(a)'s kernel (a backward's
    # GELU gradient and the GELU recomputed for a weight gradient, both reading the saved
    # pre-activation): one pass over a instead of two
    inputs = [torch.randn(8, 16), torch.randn(16, 4), torch.randn(8, 16)]
    _, steps = schedule(_moves, inputs)
    first = groups(steps)[0]
    assert len(first.nodes) == 3, first.nodes
    assert all({b for b, _ in first.bound[n.name][3]} == {"arg0"} for n in first.nodes)


def test_extern_kernels_split_groups_and_epilogues_fuse():
    def f(a, b):
        m = aten.mm.default(a, b)
        return (aten.relu.default(aten.add.Tensor(m, 1.0)),)

    ir, steps = schedule(f, [torch.randn(8, 16), torch.randn(16, 4)])
    assert isinstance(steps[0], ExternKernel) and steps[0].kind == "extern"
    assert len(groups(steps)) == 1


def test_memory_plan_reuses_dead_buffers():
    def f(x, w):
        a = aten.exp.default(x)
        b = aten.mm.default(a, w)  # an extern: a dies here
        c = aten.sin.default(b)
        d = aten.mm.default(c, w)
        return (aten.cos.default(d),)

    ir, steps = schedule(f, [torch.randn(16, 16), torch.randn(16, 16)])
    plan = plan_memory(steps, ir)
    assert plan.reused >= 1


def test_unlowered_op_falls_back_and_is_recorded():
    def f(x):
        return (aten.exp.default(aten.sort.default(x, 0)[0]),)

    ir, steps = schedule(f, [torch.randn(8)])
    assert any(isinstance(s, ExternKernel) and s.kind == "fallback" for s in steps)
    assert any(isinstance(n, ComputedBuffer) for n in ir.nodes)


def test_pointwise_output_written_in_place_of_a_dead_input():
    def f(x, w):
        a = aten.exp.default(x)
        m = aten.mm.default(a, w)  # realizes a
        return (aten.add.Tensor(a, m),)  # last reader of a, at the same index

    ir, steps = schedule(f, [torch.randn(16, 16), torch.randn(16, 16)])
    plan = plan_memory(steps, ir)
    kinds = [kind for allocs in plan.allocations.values() for _, _, kind in allocs]
    assert "inplace" in kinds
    (last,) = [s for s in groups(steps) if s.nodes[0].name == ir.nodes[-1].name]
    assert last.aliases  # the kernel is told its argument pointers may alias


def _bf16_layer_norm_stats(x, w, b):
    out, mean, rstd = aten.native_layer_norm.default(x, [64], w, b, 1e-5)
    to_bf16 = torch.bfloat16
    return (
        out,
        aten._to_copy.default(mean, dtype=to_bf16),
        aten._to_copy.default(rstd, dtype=to_bf16),
    )


def test_reduction_read_through_a_size_one_view_stays_local():
    """mean (8,) read as (8, 1) by a later block: the load index carries a loop variable of
    range 1; it is the store index once simplified, so the value stays in registers, and
    every member the kernel reads is an argument or local (was: 'kernel reads buf0, which is
    neither an argument nor computed before it')."""
    inputs = [torch.randn(8, 64).bfloat16(), torch.randn(64).bfloat16(), torch.randn(64).bfloat16()]
    ir, steps = schedule(_bf16_layer_norm_stats, inputs)
    (group,) = groups(steps)
    for name, (_, _, _store, loads) in group.bound.items():
        for b, e in loads:
            if b in group.local:
                assert e == group.bound[b][2], (name, b, e)
    assert {"buf0", "buf1"} <= group.local
    assert set(group.inputs).isdisjoint({n.name for n in group.nodes})


def test_scan_is_a_kernel_of_its_own():
    def f(x):
        return (aten.exp.default(aten.cumsum.default(x, 1)),)

    ir, steps = schedule(f, [torch.randn(6, 40)])
    scans = [g for g in groups(steps) if g.blocks[0].kind == "scan"]
    (scan,) = scans
    assert len(scan.nodes) == 1 and scan.outer == (6,) and scan.blocks[0].rranges == (40,)
    assert "cumulative sum" in print_ir(ir)


def test_size_one_dimensions_get_no_loop_and_do_not_block_fusion():
    """GPT-2 at batch 1: layer_norm statistics over (1, 256) and the (256, 256) output
    they normalize, and softmax statistics over (1, 4, 256) with (4, 256, 256) scores,
    share their outer loops once size-1 dimensions are dropped: one kernel each."""

    def ln(x, w, b):
        out = aten.native_layer_norm.default(x, [256], w, b, 1e-5)[0]
        return (aten.view.default(out, [256, 256]),)

    def sm(s, m):
        scores = aten.add.Tensor(aten.view.default(s, [1, 4, 256, 256]), m)
        return (aten._softmax.default(scores, -1, False),)

    _, steps = schedule(ln, [torch.randn(1, 256, 256), torch.randn(256), torch.randn(256)])
    (group,) = groups(steps)
    assert group.outer == (256,) and [b.kind for b in group.blocks] == ["welford", "pointwise"]
    _, steps = schedule(sm, [torch.randn(4, 256, 256), torch.randn(1, 1, 256, 256)])
    (group,) = groups(steps)
    assert group.outer == (4, 256)
    for index, _, _, _ in group.bound.values():
        assert 0 in index  # the batch dimension of size 1 is indexed by the constant 0


def _embedding_layer_norm(table, ids, w, b):
    x = aten.embedding.default(table, ids)
    return (aten.native_layer_norm.default(x, [64], w, b, 1e-5)[0],)


def test_gathered_rows_fuse_with_the_layer_norm_that_reads_them():
    """An embedding gather (data-dependent index into the table) and the layer_norm of its
    rows are one kernel: only a member read at a data-dependent index would block it."""
    inputs = [
        torch.randn(100, 64),
        torch.randint(0, 100, (1, 32)),
        torch.randn(64),
        torch.randn(64),
    ]
    _, steps = schedule(_embedding_layer_norm, inputs)
    (group,) = groups(steps)
    assert [b.kind for b in group.blocks] == ["welford", "pointwise"]


def test_checked_gather_kept_for_later_runs_right_after_its_inputs():
    """A bounds-checked gather whose result is only a graph output (an index kept for the
    backward, as HF BERT's token type ids) runs first, not after the rest of the graph: a
    GPU wrapper waits for the error rows of the last checked kernel before returning."""

    def f(table, pos, x, w):
        h = aten.mm.default(aten.relu.default(x), w)
        h = aten.mm.default(aten.exp.default(h), w)
        ids = aten.gather.default(table, 1, pos)
        return (aten.tanh.default(h), ids)

    inputs = [
        torch.randint(0, 2, (1, 64)),
        torch.randint(0, 64, (1, 16)),
        torch.randn(16, 32),
        torch.randn(32, 32),
    ]
    ir, steps = schedule(f, inputs)
    gathers = [k for k, s in enumerate(steps) if isinstance(s, FusedGroup) and "arg1" in s.inputs]
    assert gathers == [0], [getattr(s, "inputs", s) for s in steps]
    assert isinstance(steps[1], FusedGroup) and isinstance(steps[2], ExternKernel)
    plan_memory(steps, ir)  # the moved order is a valid one to plan


def test_checked_kernel_stays_after_the_step_it_reads():
    def f(x, w, idx):
        h = aten.mm.default(x, w)
        return (aten.index_select.default(aten.relu.default(h), 0, idx),)

    ir, steps = schedule(f, [torch.randn(16, 8), torch.randn(8, 8), torch.randint(0, 16, (4,))])
    kinds = [type(s).__name__ for s in steps]
    assert kinds == ["ExternKernel", "FusedGroup"], kinds


def _freed_after(plan, name):
    return [k for k, names in plan.frees.items() if name in names]


def test_inputs_of_a_fallback_returning_fresh_tensors_die_at_their_last_read():
    """A fallback whose schema marks no result as an alias (convolution_backward) returns
    fresh tensors: its inputs die at their last read even when a result is a graph output
    (the weight gradient). They were kept to the graph's end as possible aliases: ResNet-50's
    backward held every convolution's gradient input, its peak 95 MB above eager's."""

    def f(g, x, w):
        gin = aten.exp.default(g)  # a kernel output only the convolution backward reads
        gi, gw, _ = aten.convolution_backward.default(
            gin, x, w, [0], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]
        )
        return (aten.sum.dim_IntList(gi, [0]), gw)  # no later buffer takes gin's storage

    inputs = [torch.randn(2, 4, 6, 6), torch.randn(2, 3, 6, 6), torch.randn(4, 3, 1, 1)]
    ir, steps = schedule(f, inputs)
    conv = next(
        k for k, s in enumerate(steps) if isinstance(s, ExternKernel) and s.kind == "fallback"
    )
    gin = steps[conv - 1].outputs[0]
    plan = plan_memory(steps, ir)
    assert _freed_after(plan, gin) == [conv]


def test_pooled_storage_no_buffer_takes_over_is_freed_when_it_dies():
    def f(x, w):
        a = aten.exp.default(x)  # 16x16, dies at the first mm
        b = aten.mm.default(a, w)
        c = aten.sin.default(aten.sum.dim_IntList(b, [0]))  # nothing of a's size follows
        return (c,)

    ir, steps = schedule(f, [torch.randn(16, 16), torch.randn(16, 16)])
    a = groups(steps)[0].outputs[0]
    plan = plan_memory(steps, ir)
    mm = next(k for k, s in enumerate(steps) if isinstance(s, ExternKernel))
    assert _freed_after(plan, a) == [mm]


def test_fresh_library_results_are_reused_in_place():
    """A matmul's result is a tensor only the wrapper references: the pointwise kernel
    that reads it last writes its output over it (HF ConvNeXt's GELU backward over the mm
    before it), and the wrapper allocates nothing for that output."""

    def f(a, w):
        m = aten.mm.default(a, w)
        return (aten.exp.default(aten.sin.default(m)),)

    ir, steps = schedule(f, [torch.randn(16, 16), torch.randn(16, 32)])
    mm = next(s for s in steps if isinstance(s, ExternKernel))
    m = mm.outputs[0].name
    plan = plan_memory(steps, ir)
    reuses = [
        (name, reuse, kind) for allocs in plan.allocations.values() for name, reuse, kind in allocs
    ]
    assert any(reuse == m and kind in ("inplace", "pool") for _, reuse, kind in reuses), reuses


def test_results_of_a_collective_are_not_reused():
    """A functional collective's wait hands back its input: its result is no storage of
    its own, and nothing takes it over."""
    from kiln_inductor.scheduler.memory import _returns_fresh

    mm = ExternKernel("extern0", aten.mm.default, (), {}, "extern")
    assert _returns_fresh(mm)
    view = ExternKernel("fallback0", aten.split.Tensor, (), {}, "fallback")
    assert not _returns_fresh(view)
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "wait_tensor"):
        wait = ExternKernel("extern1", c10d.wait_tensor.default, (), {}, "extern")
        assert not _returns_fresh(wait)


def test_dead_storage_is_not_held_across_a_fresh_allocation():
    """A dead buffer waits in the pool for a later buffer of its size only while nothing
    else allocates: held across a fresh allocation (a matmul's result) it would add to the
    live bytes there. Kept for the graph's next buffers, the FSDP graph's backward held a
    dead unit-sized gradient through each next unit's gather (MLP: 11.3 MB, 8.0 without)."""

    def f(x, w):
        a = aten.exp.default(x)  # 16x16, dies at the first mm
        b = aten.mm.default(a, w)  # a fresh 16x16 result: a's storage is not held over it
        c = aten.sin.default(aten.mm.default(b, w))  # a's size again, after the second mm
        return (c,)

    ir, steps = schedule(f, [torch.randn(16, 16), torch.randn(16, 16)])
    a = groups(steps)[0].outputs[0]
    plan = plan_memory(steps, ir, release_early=True)
    mm = next(k for k, s in enumerate(steps) if isinstance(s, ExternKernel))
    assert _freed_after(plan, a) == [mm]
    reuses = [reuse for allocs in plan.allocations.values() for _, reuse, _ in allocs]
    assert a not in reuses
    # a graph without collectives keeps its dead storage for reuse (the default there)
    kept = plan_memory(steps, ir)
    assert a in [reuse for allocs in kept.allocations.values() for _, reuse, _ in allocs]
