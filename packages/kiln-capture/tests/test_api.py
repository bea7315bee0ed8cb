"""The public API: optimize (functions and modules), fullgraph, explain, logging, and the
backend protocol shared with torch.compile."""

import logging

import pytest
import torch
import torch.nn.functional as F
from helpers import CountingBackend
from torch import nn

import kiln_capture
from kiln_capture import GraphBreakError
from kiln_capture.config import config


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.register_buffer("shift", torch.randn(8))

    def forward(self, x):
        return F.gelu(self.norm(self.fc(x))) + self.shift


def with_print(x):
    y = x.cos()
    print("hello")
    return y + 1


def test_fullgraph_raises_naming_reason_and_line():
    f = kiln_capture.optimize(CountingBackend(), fullgraph=True)(with_print)
    with pytest.raises(GraphBreakError) as info:
        f(torch.randn(2))
    msg = str(info.value)
    assert "print()" in msg and 'print("hello")' in msg and "test_api.py" in msg


def test_explain_reports_graphs_breaks_guards():
    out = kiln_capture.explain(with_print)(torch.randn(3))
    assert out.graph_count == 2 and out.break_count == 1
    brk = out.breaks[0]
    assert brk.kind.id == "B001" and brk.line.strip() == 'print("hello")'
    assert brk.filename == __file__
    assert any("float32[3]" in g for g in out.guards)
    text = str(out)
    assert "graphs: 2, graph breaks: 1" in text and "torch.cos" in text or "cos" in text
    assert kiln_capture.explain(with_print, torch.randn(3)).graph_count == 2


def test_module_parameters_are_lifted_and_nodes_carry_meta():
    torch.manual_seed(0)
    m = Net()
    b = CountingBackend()
    om = kiln_capture.optimize(b)(m)
    x = torch.randn(2, 4)
    torch.testing.assert_close(om(x), m(x))
    gm = b.graphs[0]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert (
        len(placeholders) == len(b.example_inputs[0]) == 6
    )  # x, fc.w, fc.b, norm.w, norm.b, shift
    params = {id(p) for p in m.parameters()} | {id(m.shift)}
    assert sum(id(t) in params for t in b.example_inputs[0]) == 5
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "call_function", "call_method"):
            val = node.meta["val"]
            assert isinstance(val, torch.Tensor) and val.device.type == "meta"
            assert node.meta["device"] == torch.device("cpu")
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert F.layer_norm in targets and F.gelu in targets


def test_gradients_flow_through_captured_graph():
    torch.manual_seed(0)
    m = Net()
    om = kiln_capture.optimize(CountingBackend())(m)
    x = torch.randn(2, 4, requires_grad=True)
    om(x).sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    gx = x.grad.clone()
    m.zero_grad()
    x.grad = None
    m(x).sum().backward()
    for g, p in zip(grads, m.parameters()):
        torch.testing.assert_close(g, p.grad)
    torch.testing.assert_close(gx, x.grad)


def interpreter_backend(gm, example_inputs):
    """A torch-style backend: runs the graph node by node through torch.fx.Interpreter."""
    interp = torch.fx.Interpreter(gm)
    return lambda *args: interp.run(*args)


def jit_trace_backend(gm, example_inputs):
    """A torch-style backend that traces the captured graph with TorchScript."""
    return torch.jit.trace(gm, tuple(example_inputs), check_trace=False)


@pytest.mark.parametrize("backend", [interpreter_backend, jit_trace_backend])
def test_drives_torch_style_backends(backend):
    torch.manual_seed(0)
    m = Net().eval()
    om = kiln_capture.optimize(backend)(m)
    x = torch.randn(3, 4)
    torch.testing.assert_close(om(x), m(x))
    torch.testing.assert_close(om(x), m(x))


def test_same_backend_works_under_torch_compile_and_kiln():
    """The backend protocol is torch.compile's: one backend, both capture engines."""
    ours, theirs = CountingBackend(), CountingBackend()
    x = torch.randn(4, 4)
    a = kiln_capture.optimize(ours)(with_print)(x)
    torch._dynamo.reset()
    c = torch.compile(with_print, backend=theirs)(x)
    torch.testing.assert_close(a, c)
    assert len(ours.graphs) == len(theirs.graphs) == 2


def test_kiln_log_topics(monkeypatch, caplog):
    monkeypatch.setattr(
        config, "log_topics", frozenset({"graphs", "guards", "breaks", "recompiles"})
    )
    caplog.set_level(logging.INFO, logger="kiln_capture")
    f = kiln_capture.optimize(CountingBackend())(with_print)
    f(torch.randn(2))
    f(torch.randn(3))
    text = caplog.text
    assert "captured graph" in text and "guards for with_print" in text
    assert "[B001] print()" in text and "recompiling with_print" in text


def test_reset_forgets_entries():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(with_print)
    f(torch.randn(2))
    kiln_capture.reset()
    f(torch.randn(2))
    assert len(b.graphs) == 4


def test_optimized_module_keeps_parameters():
    m = Net()
    om = kiln_capture.optimize(CountingBackend())(m)
    assert dict(om._orig_mod.named_parameters()).keys() == dict(m.named_parameters()).keys()
    assert isinstance(om, kiln_capture.OptimizedModule)


def test_backend_failure_propagates_as_backend_error():
    def broken_backend(gm, example_inputs):
        raise ValueError("cannot compile this")

    f = kiln_capture.optimize(broken_backend)(with_print)
    with pytest.raises(kiln_capture.BackendError) as info:
        f(torch.randn(2))
    assert isinstance(info.value.cause, ValueError) and "broken_backend" in str(info.value)
