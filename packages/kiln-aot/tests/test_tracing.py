import operator

import pytest
import torch

import kiln_aot
from kiln_aot import CORE_ATEN_OPS, KEPT_OPS, FakeTensor, Unsupported, trace


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_placeholders_are_the_flat_inputs_and_graph_returns_a_tuple():
    def f(xs, scale):
        return xs[0] * scale + xs[1]

    a, b = torch.randn(3, 4), torch.randn(3, 4)
    gm = trace(f, [[a, b], 2.0])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 3
    out = gm(a, b, 2.0)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out[0], f([a, b], 2.0))


def test_every_node_is_core_or_kept_with_meta_val():
    def f(x, w, b):
        h = torch.nn.functional.linear(x, w, b)
        h = torch.nn.functional.layer_norm(h, (6,))
        return torch.softmax(torch.nn.functional.silu(h), dim=-1).mean()

    x, w, b = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6)
    gm = trace(f, [x, w, b])
    kiln_aot.verify_graph(gm)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            assert n.target in CORE_ATEN_OPS or n.target in KEPT_OPS or n.target is operator.getitem
        if n.op != "output":
            assert isinstance(n.meta["val"], FakeTensor)
    torch.testing.assert_close(gm(x, w, b)[0], f(x, w, b))


def test_meta_val_reports_shape_stride_dtype_and_real_device():
    x = torch.randn(4, 6).t()
    gm = trace(lambda x: (x * 2, x.to(torch.float64)), [x])
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_function"]
    ph = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"]
    assert ph.shape == x.shape and ph.stride() == x.stride() and ph.device == x.device
    assert any(v.dtype == torch.float64 for v in vals)
    assert all(v.device.type == "cpu" for v in vals)


def test_tracing_does_no_real_compute():
    calls = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            for a in torch.utils._pytree.tree_leaves((args, kwargs)):
                if (
                    isinstance(a, torch.Tensor)
                    and a.device.type == "cpu"
                    and not isinstance(a, FakeTensor)
                ):
                    calls.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(64, 64)
    # The spy sits below the tracer: it sees every kernel the tracer itself runs.
    with Spy():
        gm = trace(lambda x: torch.nn.functional.gelu(x @ x).softmax(-1).sum(), [x])
    assert len(list(gm.graph.nodes)) > 5
    assert calls == []


def test_fake_inputs_report_cuda_without_cuda():
    meta = torch.empty(2, 3, device="meta")
    fake = FakeTensor(meta, torch.device("cuda", 0))
    gm = trace(lambda x: (x + 1).sum(0), [fake])
    out_val = [n for n in gm.graph.nodes if n.op == "call_function"][-1].meta["val"]
    assert out_val.device == torch.device("cuda", 0)
    assert tuple(out_val.shape) == (3,)


def test_closed_over_tensors_are_get_attr_constants():
    c = torch.randn(5)
    gm = trace(lambda x: x + c, [torch.randn(5)])
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    x = torch.randn(5)
    torch.testing.assert_close(gm(x)[0], x + c)


@pytest.mark.parametrize(
    "fn, name",
    [
        (lambda x: torch.nonzero(x), "nonzero"),
        (lambda x: x[x > 0], "nonzero"),
        (lambda x: torch.unique(x), "_unique2"),
        (lambda x: x.sum().item(), "_local_scalar_dense"),
        (lambda x: torch.masked_select(x, x > 0), "masked_select"),
    ],
)
def test_data_dependent_ops_are_library_calls_sized_by_unbacked_symbols(fn, name):
    """kiln_shapes' unbacked symbols: the op stays whole, its result's size (or value) is
    read back by a node (sym_size.int, or the .item() node itself)."""
    gm = trace(fn, [torch.randn(8)])
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert any(name in str(n.target) and n.meta.get("kiln_library_op") for n in calls)
    x = torch.randn(8)
    want = fn(x)
    got = gm(x)[0]
    torch.testing.assert_close(got, want)


def test_an_op_with_an_unknown_output_size_raises_unsupported_naming_it():
    with pytest.raises(Unsupported) as info:
        trace(lambda x: torch.bincount(x), [torch.arange(8)])
    assert "bincount" in str(info.value.op)
    assert "test_tracing.py" in str(info.value)  # points at the user's source line


def test_non_tensor_outputs_are_kept_in_trace_info():
    gm = trace(lambda x: (x + 1, 3, None), [torch.randn(2)])
    info = gm.meta["kiln_aot"]
    assert [o.kind for o in info.outputs] == ["tensor", "constant", "constant"]


def test_module_parameters_and_buffers_become_leading_graph_inputs():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).train()
    x = torch.randn(5, 4)
    gm = trace(m, [x])
    info = gm.meta["kiln_aot"]
    assert info.state_names == (
        "0.weight",
        "0.bias",
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    )
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(info.state_names) + 1
    assert not any(n.op == "get_attr" for n in gm.graph.nodes)
    # BatchNorm's running stats and counter are written: extra outputs, in eager order
    written = {info.state_names[i] for i in info.mutated_inputs}
    assert written == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    state = [t.detach().clone() for t in (*m.parameters(), *m.buffers())]
    out = gm(*state, x)
    torch.testing.assert_close(out[0], m(x))
    for idx, value in zip(info.mutated_inputs, out[1:]):
        torch.testing.assert_close(
            value, dict(m.named_buffers())[info.state_names[idx]].to(value.dtype)
        )
