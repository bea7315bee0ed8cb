"""kiln_triton.compile_fx: modes and options, the torch.compile backend protocol, training
graphs, and CUDA graphs skipped (with a logged reason) for CPU tensors — all on CPU
tensors through Triton's interpreter, compared with eager."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

import kiln_triton
from kiln_inductor import get_backend, register_backend, registered_backends, unregister_backend
from kiln_triton.compile import resolve_options
from kiln_triton.cudagraphs import CudaGraphRunner
from kiln_triton.testing import Block, use_triton_for_cpu


def test_modes_and_options():
    assert resolve_options(None, None) == {"triton.cudagraphs": False, "max_autotune": False}
    assert resolve_options("reduce-overhead", None)["triton.cudagraphs"]
    assert resolve_options("max-autotune", None) == {
        "triton.cudagraphs": True,
        "max_autotune": True,
    }
    assert not resolve_options("max-autotune", {"triton.cudagraphs": False})["triton.cudagraphs"]
    with pytest.raises(ValueError, match="unknown mode"):
        resolve_options("fastest", None)
    with pytest.raises(ValueError, match="unknown options"):
        resolve_options(None, {"epilogue_fusion": True})


def test_torch_compile_backend_on_a_transformer_block():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 8, 32)
    with use_triton_for_cpu(), torch.no_grad():
        compiled = torch.compile(model, backend=kiln_triton.compile_fx)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        x2 = torch.randn(2, 8, 32)  # new values, same graph
        torch.testing.assert_close(compiled(x2), model(x2), rtol=1e-4, atol=1e-5)


def test_training_forward_and_backward_match_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))
    ref = nn.Sequential(*[m for m in model])  # same parameters
    x = torch.randn(6, 16)
    with use_triton_for_cpu():
        compiled = torch.compile(model, backend=kiln_triton.compile_fx)
        out = compiled(x)
        out.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = ref(x)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for g, p in zip(grads, ref.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)


def test_reduce_overhead_on_cpu_tensors_runs_without_cuda_graphs(caplog):
    def fn(x, y):
        return torch.softmax(x * y + 1, dim=-1)

    x, y = torch.randn(4, 40), torch.randn(40)
    with use_triton_for_cpu(), caplog.at_level(logging.WARNING, logger="kiln_inductor"):
        gm = torch.fx.symbolic_trace(fn)
        compiled = kiln_triton.compile_fx(gm, [x, y], mode="reduce-overhead")
        assert isinstance(compiled, CudaGraphRunner)
        out = compiled(x, y)
        out2 = compiled(x * 2, y)
    first = out[0] if isinstance(out, (tuple, list)) else out
    second = out2[0] if isinstance(out2, (tuple, list)) else out2
    torch.testing.assert_close(first, fn(x, y))
    torch.testing.assert_close(second, fn(x * 2, y))
    assert compiled.graphs == {} and compiled.replays == 0
    assert len(compiled.checked) == 1  # one signature, decided once
    assert "CUDA graphs skipped: inputs are not all CUDA tensors" in caplog.text


def test_use_triton_for_cpu_restores_the_previous_backend():
    before = registered_backends().get("cpu")
    sentinel = object()
    register_backend("cpu", sentinel)  # type: ignore[arg-type]
    try:
        with use_triton_for_cpu() as backend:
            assert get_backend("cpu") is backend
        assert get_backend("cpu") is sentinel
    finally:
        if before is None:
            unregister_backend("cpu")
        else:
            register_backend("cpu", before)


def test_use_triton_for_cpu_leaves_no_backend_where_there_was_none():
    before = unregister_backend("cpu")
    try:
        with use_triton_for_cpu():
            pass
        assert "cpu" not in registered_backends()
    finally:
        if before is not None:
            register_backend("cpu", before)


def test_importing_registers_the_cuda_backend():
    assert isinstance(get_backend("cuda"), kiln_triton.TritonBackend)


def test_bf16_masked_lm_head_backward_reordered_block_in_a_persistent_kernel(monkeypatch):
    """DistilBERT's masked-LM head trained under bf16 autocast: its backward fuses the
    bias gradient's column sum with the layer-norm and GELU backward, a block whose index
    is an expression of its own variables (an access order refined): those were looked up,
    not substituted, and the kernel named variables it never defined (H200 bf16 training:
    ``NameError: y1_0``)."""
    import copy

    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.DistilBertConfig(n_layers=1, dim=256, n_heads=4, hidden_dim=1024, vocab_size=512)
    cfg.dropout = cfg.attention_dropout = 0.0
    model = T.DistilBertForMaskedLM(cfg).train()
    ids = torch.randint(0, 512, (2, 128))

    def step(m, run):
        m.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = run(input_ids=ids).logits
        out.float().square().mean().backward()
        return {n: p.grad for n, p in m.named_parameters()}

    from kiln_inductor.testing import record_compiled_graphs

    graphs = record_compiled_graphs(monkeypatch)  # (kernels, fallback ops) of each graph
    want = step(model, model)
    trained = copy.deepcopy(model)
    with use_triton_for_cpu():
        got = step(trained, torch.compile(trained, backend=kiln_triton.compile_fx))
    for name, g in want.items():
        torch.testing.assert_close(got[name].float(), g.float(), rtol=2e-2, atol=2e-2)
    # the forward and the backward, each compiled to Triton kernels, nothing left to ATen
    assert len(graphs) >= 2 and all(k > 0 and not fb for k, fb in graphs), graphs
