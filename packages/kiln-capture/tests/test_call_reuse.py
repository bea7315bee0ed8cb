"""Module calls replayed from an earlier identical call's trace (call_reuse.py): the
captured graph, its node metadata and its guards are those of evaluating every call, a
call that differs in anything the trace read is evaluated, and the installed guards check
every replayed call's own objects."""

import copy
import re

import pytest
import torch
from helpers import CountingBackend, assert_same
from torch import nn

import kiln_capture
from kiln_capture import call_reuse, meta_reuse
from kiln_capture.config import config


def _capture(model, *args, reuse=True, grad=False, autocast=False, **kwargs):
    """(graphs, result, stats) of one capture of ``model(*args)``, calls reused or not."""
    kiln_capture.reset()
    call_reuse.REPLAYED.clear()
    backend = CountingBackend()
    with config.scope(reuse_calls=reuse, capture_frames=False):
        compiled = kiln_capture.optimize(backend)(model)
        with (
            torch.set_grad_enabled(grad),
            torch.autocast("cpu", torch.bfloat16, enabled=autocast),
        ):
            out = compiled(*args, **kwargs)
    return backend.graphs, out, kiln_capture.stats()


def _blocks_replayed() -> list[str]:
    """Which ``blocks[i]`` calls of the last capture replayed an earlier call's trace."""
    found = [
        re.match(r"self\._modules\['blocks'\]\._modules\['(\d+)'\] \(", line)
        for line in call_reuse.REPLAYED
    ]
    return [m.group(1) for m in found if m]


def _stack(node) -> list[str]:
    """A node's nn_module_stack without the per-call ids."""
    return [
        f"{re.sub(r'@[0-9]+$', '', k)}|{path}|{cls.__name__}"
        for k, (path, cls) in node.meta.get("nn_module_stack", {}).items()
    ]


def _assert_same_graphs(a, b):
    assert len(a) == len(b)
    for ga, gb in zip(a, b):
        assert ga.code == gb.code
        for x, y in zip(ga.graph.nodes, gb.graph.nodes):
            assert (x.op, x.name, str(x.target)) == (y.op, y.name, str(y.target))
            assert _stack(x) == _stack(y), x.name
            assert x.meta.get("stack_trace") == y.meta.get("stack_trace"), x.name
            vx, vy = x.meta.get("val"), y.meta.get("val")
            assert type(vx) is type(vy), x.name
            if isinstance(vx, torch.Tensor):
                assert (vx.shape, vx.stride(), vx.dtype, vx.requires_grad) == (
                    vy.shape,
                    vy.stride(),
                    vy.dtype,
                    vy.requires_grad,
                ), x.name
                # views alias their own input, never an earlier layer's
                assert (vx._base is None) == (vy._base is None), x.name


class Block(nn.Module):
    def __init__(self, width=8, scale=0.5, act=None, fn=torch.tanh):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.act = act if act is not None else nn.GELU()
        self.scale = scale
        self.fn = fn

    def forward(self, x, mask=None):
        h = self.act(self.lin(self.norm(x))) * self.scale
        if mask is not None:
            h = h.masked_fill(mask, 0.0)
        return x + self.fn(h).transpose(0, 1).transpose(0, 1)


class Stack(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x, mask=None):
        for block in self.blocks:
            x = block(x, mask=mask)
        return x


def _same_stack(n=4, **kw):
    torch.manual_seed(0)
    return Stack([Block(**kw) for _ in range(n)])


@pytest.mark.parametrize("grad", [False, True])
def test_identical_layers_replay_and_give_the_evaluated_graph(grad, monkeypatch):
    model = _same_stack()
    x = torch.randn(3, 8, requires_grad=grad)
    mask = torch.rand(3, 8) > 0.7
    a, out_a, stats_a = _capture(model, x, mask, reuse=False, grad=grad)
    known = []  # replayed ops whose meta result came from the recorded op's key
    get_known = meta_reuse.MetaResults.get_known

    def counted(self, *args):
        got = get_known(self, *args)
        known.append(got is not None)
        return got

    monkeypatch.setattr(meta_reuse.MetaResults, "get_known", counted)
    b, out_b, stats_b = _capture(model, x, mask, grad=grad)
    # without grad every replayed op's result is kept by meta_reuse: none runs a meta
    # kernel; with grad the results require grad (not kept): each op runs as evaluated
    assert known and all(known) if not grad else not any(known)
    assert stats_a["reused_calls"] == 0
    # block 0, the first of its class, is evaluated; block 1 is recorded (a computed
    # input: a key of its own), blocks 2 and 3 replay it
    assert stats_b["reused_calls"] >= 2
    assert _blocks_replayed() == ["2", "3"]
    _assert_same_graphs(a, b)
    with torch.set_grad_enabled(grad):
        assert_same(out_b, model(x, mask))
    if grad:
        (g_b,) = torch.autograd.grad(out_b.sum(), x)
        (g_e,) = torch.autograd.grad(model(x, mask).sum(), x)
        assert_same(g_b, g_e)


def test_a_layer_that_reads_differently_is_evaluated():
    torch.manual_seed(0)
    blocks = [
        Block(),
        Block(),  # recorded: the key of a computed input
        Block(scale=2.0),  # a constant the trace bakes in
        Block(act=nn.ReLU()),  # a submodule of another class
        Block(fn=torch.sigmoid),  # a function attribute: compared by identity
        Block(width=8),
    ]
    model = Stack(blocks)
    x = torch.randn(3, 8)
    a, _, _ = _capture(model, x, reuse=False)
    b, out, stats = _capture(model, x)
    # the last block is block 1 again (its Linear, LayerNorm... replay others' too)
    assert _blocks_replayed() == ["5"]
    assert stats["reused_calls"] > 1
    _assert_same_graphs(a, b)
    with torch.no_grad():
        assert_same(out, model(x))


def test_guards_of_replayed_layers_check_their_own_objects():
    with config.scope(capture_frames=False):  # every compile traces (none kept on disk)
        _guards_of_replayed_layers()


def _guards_of_replayed_layers():
    model = _same_stack()
    eager = copy.deepcopy(model)
    x = torch.randn(3, 8)
    kiln_capture.reset()
    call_reuse.REPLAYED.clear()
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(model)
    assert_same(compiled(x), eager(x))
    assert _blocks_replayed() == ["2", "3"]
    assert_same(compiled(x), eager(x))
    assert len(backend.graphs) == 1
    # a replayed layer's constant changes: its re-rooted guard fails, the frame recompiles
    model.blocks[2].scale = 3.0
    eager.blocks[2].scale = 3.0
    assert_same(compiled(x), eager(x))
    assert len(backend.graphs) == 2
    # so does a replayed layer's submodule class, and its parameter's shape
    model.blocks[3].act = nn.ReLU()
    eager.blocks[3].act = nn.ReLU()
    assert_same(compiled(x), eager(x))
    assert len(backend.graphs) == 3
    report = kiln_capture.explain(model)(x)
    assert _blocks_replayed() == []  # blocks 2 and 3 now differ from block 1
    assert report.reused_calls  # their Linears and LayerNorms still replay
    assert "calls traced once, replayed" in str(report)
    model.blocks[3].act = nn.GELU()
    report = kiln_capture.explain(model)(x)
    assert _blocks_replayed() == ["3"]


def test_the_same_module_called_again_replays():
    class Loop(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            for _ in range(4):
                x = self.block(x)
            return x

    torch.manual_seed(0)
    model = Loop()
    x = torch.randn(3, 8)
    a, _, _ = _capture(model, x, reuse=False)
    b, out, stats = _capture(model, x)
    # the first call reads the frame's input, the second a computed tensor: the third
    # and fourth replay the second
    assert [line.split(" (")[0] for line in call_reuse.REPLAYED].count(
        "self._modules['block']"
    ) == 2
    _assert_same_graphs(a, b)
    with torch.no_grad():
        assert_same(out, model(x))
    assert len([n for n in b[0].graph.nodes if n.op == "placeholder"]) == len(
        [n for n in a[0].graph.nodes if n.op == "placeholder"]
    )


def test_a_call_with_other_input_metadata_is_evaluated():
    class TwoWidths(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = Block()
            self.b = Block()

        def forward(self, x):
            return self.a(x), self.b(x.double().float().t().contiguous().t())

    model = TwoWidths()
    x = torch.randn(3, 8)
    a, _, _ = _capture(model, x, reuse=False)
    b, out, stats = _capture(model, x)
    # the second input has other strides: b is evaluated (its Linear reads a contiguous
    # copy and replays a's)
    assert not any(line.startswith("self._modules['b'] (") for line in call_reuse.REPLAYED)
    _assert_same_graphs(a, b)
    with torch.no_grad():
        assert_same(out, model(x))


class Counting(Block):
    def forward(self, x, mask=None):
        self.calls = getattr(self, "calls", 0) + 1  # a side effect: never replayed
        return super().forward(x, mask)


def test_side_effects_and_hooks_are_never_replayed():
    torch.manual_seed(0)
    model = Stack([Counting() for _ in range(3)])
    eager = copy.deepcopy(model)
    x = torch.randn(3, 8)
    _, out, stats = _capture(model, x)
    assert _blocks_replayed() == []
    with torch.no_grad():
        assert_same(out, eager(x))
    assert [b.calls for b in model.blocks] == [b.calls for b in eager.blocks] == [1, 1, 1]

    seen = []
    model = _same_stack(3)
    model.blocks[1].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    x = torch.randn(3, 8)
    _, out, stats = _capture(model, x)
    with torch.no_grad():
        assert_same(out, model(x))
    assert _blocks_replayed() == []  # block 1 has a hook; block 2's input is block 1's
    assert len(seen) == 2  # the compiled call ran the hook, then eager did


def test_checkpointed_calls_inside_a_layer_are_not_replayed():
    class Ckpt(Block):
        def forward(self, x, mask=None):
            return torch.utils.checkpoint.checkpoint(super().forward, x, use_reentrant=False)

    torch.manual_seed(0)
    model = Stack([Ckpt() for _ in range(3)])
    x = torch.randn(3, 8, requires_grad=True)
    a, _, _ = _capture(model, x, reuse=False, grad=True)
    b, out, _ = _capture(model, x, grad=True)
    _assert_same_graphs(a, b)
    for ga, gb in zip(a, b):
        assert _regions(ga) == _regions(gb)
    assert _blocks_replayed() == []
    assert_same(out, model(x))


def _regions(gm) -> list:
    """Each node's checkpoint region, numbered in order of appearance."""
    ids: dict = {}
    return [
        ids.setdefault(n.meta["recompute"], len(ids)) if "recompute" in n.meta else None
        for n in gm.graph.nodes
    ]


def test_switched_off():
    model = _same_stack()
    x = torch.randn(3, 8)
    _, out, stats = _capture(model, x, reuse=False)
    assert stats["reused_calls"] == 0 and not call_reuse.REPLAYED
    with torch.no_grad():
        assert_same(out, model(x))


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
@pytest.mark.parametrize(("grad", "autocast"), [(False, False), (True, False), (True, True)])
def test_transformers_layers_replay_to_the_evaluated_graph(family, grad, autocast):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=64)
        model = transformers.GPT2LMHeadModel(cfg)
    elif family == "bert":
        cfg = transformers.BertConfig(
            num_hidden_layers=3,
            hidden_size=32,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=64,
        )
        model = transformers.BertModel(cfg)
    else:
        cfg = transformers.LlamaConfig(
            num_hidden_layers=3,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            vocab_size=64,
        )
        model = transformers.LlamaForCausalLM(cfg)
    model.train(grad)  # dropout of 0.1 in GPT-2 and BERT: random ops in the graph
    ids = torch.randint(0, 64, (2, 6))
    a, _, _ = _capture(model, ids, reuse=False, grad=grad, autocast=autocast, use_cache=False)
    b, out, stats = _capture(model, ids, grad=grad, autocast=autocast, use_cache=False)
    assert stats["reused_calls"] >= 2  # layers 1 and 2 at least
    assert stats["breaks"] == 0
    _assert_same_graphs(a, b)
    if not grad:
        with torch.no_grad():
            want = model(ids, use_cache=False)
        assert_same(out.to_tuple()[0], want.to_tuple()[0])
