"""Forward hooks registered inside captured code (variables/modules.py,
``ModuleVar._register_hook``), behind a threading lock: the module's later calls in the
same trace run them, the registration is replayed after the graph. This is how
transformers (5.x) installs its output-capturing hooks, lazily, on the first call that
asks for ``output_hidden_states`` / ``output_attentions``."""

import copy
import threading

import pytest
import torch
from helpers import CountingBackend, assert_same

import kiln_capture

_LOCK = threading.Lock()


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x, collect=False):
        seen = []
        if collect and not getattr(self, "_hooked", False):
            with _LOCK:  # installed once, as transformers does
                if not getattr(self, "_hooked", False):
                    for layer in self.layers:
                        layer.register_forward_hook(_record)
                    layer.register_forward_pre_hook(_shift)
                    self._hooked = True
        _STATE.active = seen if collect else None
        try:
            for layer in self.layers:
                x = torch.relu(layer(x))
        finally:
            _STATE.active = None
        return x, tuple(seen)


class _State:  # what the hooks read: the list collecting outputs, while one is active
    def __init__(self):
        self.active = None


_STATE = _State()


def _record(module, args, output):
    if _STATE.active is not None:
        _STATE.active.append(output * 2)


def _shift(module, args):
    if _STATE.active is not None:
        return (args[0] + 1,)
    return None


def test_hooks_registered_in_the_trace_run_in_it_and_stay():
    torch.manual_seed(0)
    net = _Net()
    eager = copy.deepcopy(net)
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(net)
    x = torch.randn(2, 4)
    for _ in range(3):  # installs, then runs the installed hooks (a recompile), then hits
        report_before = kiln_capture.stats()
        assert_same(compiled(x, collect=True), eager(x, collect=True))
        assert kiln_capture.stats()["breaks"] == report_before["breaks"]
    assert kiln_capture.stats()["eager_frames"] == 0
    assert len(backend.graphs) == 2
    assert [len(layer._forward_hooks) for layer in net.layers] == [1, 1, 1]
    assert len(net.layers[2]._forward_pre_hooks) == 1
    assert_same(compiled(x), eager(x))


def _hf_pair(family: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=64, attn_implementation="eager"
        )
        model = transformers.GPT2Model(cfg)
    else:
        cfg = transformers.BertConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=64,
            attn_implementation="eager",
        )
        model = transformers.BertModel(cfg)
    model.eval()
    return model, copy.deepcopy(model)


def _tensors(out) -> list:
    out = out.to_tuple() if hasattr(out, "to_tuple") else out
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [t for item in out for t in _tensors(item)]
    return []


@pytest.mark.parametrize("family", ["gpt2", "bert"])
@pytest.mark.parametrize("flag", ["output_hidden_states", "output_attentions"])
def test_transformers_output_capturing_is_one_graph(family, flag):
    model, eager = _hf_pair(family)
    ids = torch.randint(0, 64, (2, 6))
    kiln_capture.reset()
    report = kiln_capture.explain(model)(ids, **{flag: True})  # the first call installs the hooks
    expected = eager(ids, **{flag: True})
    assert (report.graph_count, report.break_count, len(report.eager_frames)) == (1, 0, 0), str(
        report
    )
    captured = getattr(report.result, flag.removeprefix("output_"))
    assert len(captured) == (3 if flag == "output_hidden_states" else 2)
    assert_same(_tensors(report.result), _tensors(expected))
    compiled = kiln_capture.optimize(CountingBackend())(model)
    assert_same(_tensors(compiled(ids, **{flag: True})), _tensors(expected))
    assert kiln_capture.stats()["breaks"] == 0 and kiln_capture.stats()["eager_frames"] == 0
