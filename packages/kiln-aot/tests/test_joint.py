import torch

import kiln_aot
from kiln_aot.joint import trace_joint
from kiln_aot.partition.graph_split import placeholders, tangent_dependent


def test_joint_graph_layout():
    def f(x, w, k):
        y = (x @ w).tanh()
        return y, y.sum() * k, x.t()

    x, w, k = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True), torch.randn(())
    joint, info = trace_joint(f, [x, w, k], [False, True, False])
    kiln_aot.verify_graph(joint)
    assert [n.name for n in placeholders(joint.graph, "primals")] == [
        "primals_1",
        "primals_2",
        "primals_3",
    ]
    # two differentiable outputs get tangents; the view of x is an alias output, not a graph output
    assert len(placeholders(joint.graph, "tangents")) == 2
    assert [o.kind for o in info.trace.outputs] == ["tensor", "tensor", "alias"]
    assert info.num_fwd_outputs == 2 and info.grad_inputs == (1,)
    outs = joint.graph.output_node().args[0]
    assert len(outs) == 3
    # the gradient depends on the tangents, the forward outputs do not
    backward = tangent_dependent(joint.graph)
    assert outs[2] in backward and outs[0] not in backward and outs[1] not in backward


def test_joint_graph_computes_forward_and_gradients():
    def f(x, w):
        return torch.nn.functional.layer_norm(x @ w, (5,)).relu()

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    joint, info = trace_joint(f, [x, w], [True, True])
    t = torch.randn(3, 5)
    out, gx, gw = joint(x.detach(), w.detach(), t)
    ref = f(x, w)
    ref.backward(t)
    torch.testing.assert_close(out, ref.detach())
    torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, w.grad, rtol=1e-5, atol=1e-5)


def test_unused_inputs_get_no_gradient_output():
    joint, info = trace_joint(lambda a, b: a * 2, [torch.randn(2), torch.randn(2)], [True, True])
    assert info.grad_inputs == (0,)


def test_backward_scatter_of_embedded_ids_is_marked_checked():
    """embedding_dense_backward of ids the forward's embedding read from the same table is
    marked (its compiler may skip the bounds check); a scatter of other ids is not."""

    def f(ids, w, other):
        return torch.nn.functional.embedding(ids, w), torch.nn.functional.embedding(other, w * 2)

    def scatter_only(ids, g):  # a backward-style scatter with no forward read of the ids
        return (torch.ops.aten.embedding_dense_backward(g, ids, 10, -1, False),)

    w = torch.randn(10, 4)
    ids, other = torch.randint(0, 10, (3,)), torch.randint(0, 10, (2,))
    joint, _ = trace_joint(f, [ids, w, other], [False, True, False])
    scatters = [
        n for n in joint.graph.nodes if n.target is torch.ops.aten.embedding_dense_backward.default
    ]
    assert len(scatters) == 2 and all(n.meta.get("kiln_indices_checked") for n in scatters)
    joint, _ = trace_joint(scatter_only, [ids, torch.randn(3, 4)], [False, True])
    scatters = [
        n for n in joint.graph.nodes if n.target is torch.ops.aten.embedding_dense_backward.default
    ]
    assert scatters and not any(n.meta.get("kiln_indices_checked") for n in scatters)
