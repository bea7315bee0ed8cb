"""Regional reuse (kiln-inductor's regions.py): repeated blocks compiled once.

HF GPT-2, BERT and LLaMA (small configs) with reuse on and off: the same outputs and
gradients as eager, each transformer layer's block compiled once (kiln-inductor's
``regions.STATS`` and the ATen graphs compiled), no fallback, kernels generated, the same
graph and break counts; ``explain`` lists the reused blocks. Blocks that differ (shapes,
a config value) never share one compiled block, also when a layer changes after the
first compile.
"""

from __future__ import annotations

import pytest
import torch

import kiln
import kiln_inductor.compile as inductor_compile
from kiln_inductor.regions import STATS, plan_regions

transformers = pytest.importorskip("transformers")
LAYERS = 3


def _hf(name: str) -> torch.nn.Module:
    T = transformers
    small = dict(
        num_hidden_layers=LAYERS, hidden_size=64, intermediate_size=128, num_attention_heads=4
    )
    if name == "gpt2":
        cfg = T.GPT2Config(
            n_layer=LAYERS, n_embd=64, n_head=4, vocab_size=128, n_positions=64, use_cache=False
        )
        model = T.GPT2LMHeadModel(cfg)
    elif name == "llama":
        cfg = T.LlamaConfig(**small, num_key_value_heads=2, vocab_size=128, use_cache=False)
        model = T.LlamaForCausalLM(cfg)
    else:
        model = T.BertModel(T.BertConfig(**small, vocab_size=128))
    for m in model.modules():  # dropout draws differ between eager and compiled code
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


LAYER_CLASS = {"gpt2": "GPT2Block", "bert": "BertLayer", "llama": "LlamaDecoderLayer"}


@pytest.fixture
def aten_graphs(monkeypatch):
    """Every ATen graph kiln-inductor compiles: (ops, kernels, fallback ops)."""
    seen: list[tuple[int, int, list]] = []
    inner = inductor_compile.compile_aten_graph

    def counting(gm, example_inputs):
        compiled = inner(gm, example_inputs)
        ops = sum(n.op == "call_function" for n in gm.graph.nodes)
        seen.append((ops, compiled.stats["kernels"], compiled.stats["fallbacks"]))
        return compiled

    monkeypatch.setattr(inductor_compile, "compile_aten_graph", counting)
    return seen


def _first(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else next(iter(out.values()))


def _run(name: str, reuse: bool, train: bool, eager: torch.nn.Module, aten_graphs):
    model = _hf(name)
    model.load_state_dict(eager.state_dict())
    model.train(train)
    kiln.reset()
    aten_graphs.clear()
    compiled = kiln.compile(model, options={"regional_reuse": reuse})
    ids = torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.set_grad_enabled(train):
        got = _first(compiled(ids))
        want = _first(eager(ids))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    if train:
        eager.zero_grad()
        (want.float() ** 2).mean().backward()
        (got.float() ** 2).mean().backward()
        for (pname, p), q in zip(eager.named_parameters(), model.parameters()):
            # BERT's pooler is not in the loss: eager leaves None, kiln's whole graph zeros
            want_grad = p.grad if p.grad is not None else torch.zeros_like(p)
            got_grad = q.grad if q.grad is not None else torch.zeros_like(q)
            torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-5, msg=pname)
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0, stats
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats
    assert all(kernels > 0 for ops, kernels, _ in aten_graphs if ops > 4), aten_graphs
    assert not any(fallbacks for *_, fallbacks in aten_graphs), aten_graphs
    return got, list(aten_graphs)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hf_layers_compiled_once(name, train, aten_graphs):
    torch.manual_seed(0)
    eager = _hf(name)
    eager.train(train)
    whole, whole_graphs = _run(name, False, train, eager, aten_graphs)
    assert STATS.graphs_split == 0
    reused, reused_graphs = _run(name, True, train, eager, aten_graphs)
    torch.testing.assert_close(reused, whole, rtol=1e-5, atol=1e-6)
    # one block for every layer: compiled once (forward and backward once when training)
    assert STATS.blocks_compiled == 1 and STATS.instances == LAYERS, STATS
    assert STATS.blocks[0].startswith(f"{LAYER_CLASS[name]}: compiled once"), STATS.blocks
    per_piece = 2 if train else 1
    assert len(whole_graphs) == per_piece
    # the pieces before, between and after the layers, and the layers' block once
    assert len(reused_graphs) <= 3 * per_piece, reused_graphs
    assert sum(ops for ops, *_ in reused_graphs) < sum(ops for ops, *_ in whole_graphs)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_mask_made_inside_each_block_runs_causal(name, aten_graphs, monkeypatch):
    """transformers builds a decoder's causal mask from ``arange``s outside the layers:
    under regional reuse it reached every layer's block as an input, where kiln-aot could
    not see it is a constant, so attention ran with a mask. Made inside each block (a
    constant input every instance shares), it is folded: attention runs ``is_causal``
    with no mask, and the results and gradients equal eager's."""
    import kiln_aot.redirects as redirects

    folded = []
    real = redirects._causal
    monkeypatch.setattr(redirects, "_causal", lambda *a: folded.append(real(*a)) or folded[-1])
    torch.manual_seed(0)
    eager = _hf(name)
    eager.train(True)
    _run(name, True, True, eager, aten_graphs)
    assert STATS.blocks_compiled == 1 and STATS.instances == LAYERS, STATS
    assert folded and all(folded), folded  # every traced attention: a causal constant
    ids = torch.randint(1, 128, (2, 16))
    model = _hf(name)
    from kiln_capture import explain

    gm = explain(model)(ids).graphs[0]
    plan = plan_regions(getattr(gm, "gm", gm))
    blocks = [p for p in plan.pieces if p.group is not None]
    assert all(p.consts and not any(c in p.inputs for c in p.consts) for p in blocks)


def test_explain_lists_reused_blocks():
    model = _hf("gpt2").eval()
    ids = torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = kiln.explain(model, ids)
    assert out.graph_count == 1 and out.break_count == 0
    assert len(out.reused_blocks) == 1, out.reused_blocks
    line = out.reused_blocks[0]
    assert f"GPT2Block: compiled once, reused for {LAYERS} instances" in line, line
    assert "reused blocks" in str(out)


class Block(torch.nn.Module):
    def __init__(self, width: int, eps: float = 1e-5, act: bool = True) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width, eps=eps)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(self.norm(x))
        h = torch.nn.functional.gelu(h) if self.act else torch.tanh(h)
        return x + h * 0.5


class Stack(torch.nn.Module):
    def __init__(self, blocks: list[torch.nn.Module], width: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _check(model: torch.nn.Module, x: torch.Tensor, train: bool = False) -> None:
    torch.manual_seed(0)
    compiled = kiln.compile(model)
    with torch.set_grad_enabled(train):
        got = compiled(x)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats


def test_blocks_that_differ_do_not_share():
    torch.manual_seed(0)
    # the third block differs in its norm's eps, the fourth in its activation (an
    # attribute read by forward): neither may run the first blocks' compiled code
    blocks = [Block(16), Block(16), Block(16, eps=1e-3), Block(16, act=False), Block(16)]
    model = Stack(blocks, 16).eval()
    x = torch.randn(4, 16)
    kiln.reset()
    _check(model, x)
    assert STATS.blocks_compiled == 1 and STATS.instances == 3, STATS
    with torch.no_grad():  # as compiled above (with grad, block 0's input needs none)
        gm = kiln.explain(model, x).graphs[0]
    plan = plan_regions(gm)
    paths = plan.groups[0].paths
    assert len(paths) == 3 and not any("'2'" in p or "'3'" in p for p in paths), paths


def test_prefetched_collectives_keep_the_graph_whole():
    """A graph holding collectives fetched ahead of their use (FSDP2's all-gathers,
    tagged ``collective_group``) is not split: a piece boundary would make each block wait
    on its own gather at its start instead of gathering it under the previous block."""
    torch.manual_seed(0)
    model = Stack([Block(16) for _ in range(4)], 16).eval()
    with torch.no_grad():
        gm = kiln.explain(model, torch.randn(4, 16)).graphs[0]
    assert plan_regions(gm) is not None  # the blocks repeat
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    first.meta["collective_group"] = ("all_gather", "blocks.1")
    assert plan_regions(gm) is None


def test_blocks_of_other_shapes_do_not_share():
    torch.manual_seed(0)

    class Widening(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.ModuleList([Block(8), Block(8)])
            self.up = torch.nn.Linear(8, 16)
            self.b = torch.nn.ModuleList([Block(16), Block(16)])

        def forward(self, x):
            for blk in self.a:
                x = blk(x)
            x = self.up(x)
            for blk in self.b:
                x = blk(x)
            return x

    kiln.reset()
    _check(Widening().eval(), torch.randn(3, 8))
    assert STATS.blocks_compiled == 2 and STATS.instances == 4, STATS


def test_changed_layer_recompiles_and_never_reuses_a_stale_block():
    torch.manual_seed(0)
    model = Stack([Block(16) for _ in range(4)], 16).eval()
    x = torch.randn(4, 16)
    kiln.reset()
    compiled = kiln.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        model.blocks[2].act = False  # one layer's config changes: guards fail, recompile
        torch.testing.assert_close(compiled(x), model(x))
    assert kiln.stats()["recompiles"] == 1, kiln.stats()
    assert STATS.blocks_compiled == 2 and STATS.instances == 4 + 3, STATS


def test_training_with_mutated_buffers():
    """BatchNorm blocks in training write their running statistics: each instance its
    own buffers, through the one compiled block."""
    torch.manual_seed(0)

    class ConvBlock(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(x + self.bn(self.conv(torch.relu(x))))

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), *[ConvBlock() for _ in range(3)])

    eager, model = make(), make()
    x = torch.randn(2, 3, 8, 8)
    kiln.reset()
    compiled = kiln.compile(model)
    got = compiled(x)
    want = eager(x)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for (pname, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4, msg=pname)
    for (bname, b), c in zip(eager.named_buffers(), model.buffers()):
        torch.testing.assert_close(c, b, msg=bname)
    assert STATS.blocks_compiled == 1 and STATS.instances == 3, STATS
    assert kiln.stats()["fallbacks"] == 0


def test_switch_off(monkeypatch):
    torch.manual_seed(0)
    model = Stack([Block(16) for _ in range(3)], 16).eval()
    x = torch.randn(4, 16)
    monkeypatch.setenv("KILN_REGIONAL_REUSE", "0")
    kiln.reset()
    _check(model, x)
    assert STATS.graphs_split == 0 and STATS.blocks_compiled == 0
    with torch.no_grad():
        assert kiln.explain(model, x).reused_blocks == []


def test_report_shows_reused_blocks(monkeypatch):
    import logging

    from kiln import report

    page = report.Report("model.py", [])
    handler = report._Collector(page)
    logger = logging.getLogger("kiln_inductor")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    monkeypatch.setenv("KILN_LOG", "graphs,timings")
    try:
        torch.manual_seed(0)
        kiln.reset()
        _check(Stack([Block(16) for _ in range(3)], 16).eval(), torch.randn(4, 16))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    html = report.render(page)
    reuse = html[html.index("id='regional-reuse'") :]
    assert "Block: compiled once, reused for 3 instances" in reuse
    assert "regional reuse (find blocks, stitch)" in html


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_artifact_cache_keeps_the_pieces(tmp_path, monkeypatch, train):
    """With the artifact cache on, each distinct piece (the block once) is saved; a fresh
    capture loads them all without tracing or lowering."""
    import kiln_aot.api
    from kiln_inductor.runtime import artifacts

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_ARTIFACT_CACHE", "1")
    torch.manual_seed(0)
    model = Stack([Block(16) for _ in range(4)], 16).train(train)
    x = torch.randn(4, 16, requires_grad=train)

    def run() -> None:
        kiln.reset()
        compiled = kiln.compile(model)
        with torch.set_grad_enabled(train):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        assert STATS.blocks_compiled == 1 and STATS.instances == 4, STATS

    saves, hits = artifacts.STATS.saves, artifacts.STATS.hits
    run()
    pieces = artifacts.STATS.saves - saves
    assert pieces == 2  # the block, and the head after the blocks
    traced = []
    monkeypatch.setattr(kiln_aot.api, "trace", lambda *a, **k: traced.append(1))
    monkeypatch.setattr(kiln_aot.api, "trace_joint", lambda *a, **k: traced.append(1))
    run()
    assert artifacts.STATS.hits - hits == pieces and not traced


class _OnCuda(torch.Tensor):
    """A CPU tensor that reports a CUDA device: what the device policy reads."""

    @property
    def device(self):  # type: ignore[override]
        return torch.device("cuda", 0)


def test_cuda_graphs_compile_whole_unless_asked(monkeypatch):
    cpu = [torch.randn(2)]
    cuda = [torch.Tensor._make_subclass(_OnCuda, torch.randn(2)), torch.randn(2)]
    assert inductor_compile.regional_reuse_applies(cpu)
    assert not inductor_compile.regional_reuse_applies(cuda)
    monkeypatch.setenv("KILN_REGIONAL_REUSE_GPU", "1")
    assert inductor_compile.regional_reuse_applies(cuda)
    monkeypatch.setenv("KILN_REGIONAL_REUSE", "0")
    assert not inductor_compile.regional_reuse_applies(cpu)
    assert not inductor_compile.regional_reuse_applies(cuda)


def test_gpu_option_reaches_the_compiler(monkeypatch):
    seen = []
    inner = inductor_compile.regional_reuse_applies

    def spy(example_inputs):
        seen.append(inductor_compile.read_config().regional_reuse_gpu)
        return inner(example_inputs)

    monkeypatch.setattr(inductor_compile, "regional_reuse_applies", spy)
    torch.manual_seed(0)
    model = Stack([Block(16) for _ in range(3)], 16).eval()
    kiln.reset()
    compiled = kiln.compile(model, options={"regional_reuse_gpu": True})
    with torch.no_grad():
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert seen and all(seen), seen
    assert STATS.blocks_compiled == 1
