"""HF ``generate()`` with the KV cache (transformers' default DynamicCache), compiled as
users do it: ``model.forward = kiln.compile(model.forward)``. Over several prompt lengths
and many new tokens the tokens equal eager's, with at most 4 graphs (prompt and decode,
each specialized once and then symbolic) and no graph break or fallback."""

from __future__ import annotations

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")


def _model(name: str):
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256)
        model = transformers.GPT2LMHeadModel(cfg)
    elif name == "llama":
        cfg = transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256,
        )  # fmt: skip
        model = transformers.Qwen2ForCausalLM(cfg)
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2"])
def test_generate_matches_eager_with_few_graphs(name):
    eager, model = _model(name), _model(name)
    kiln.reset()
    model.forward = kiln.compile(model.forward)
    g = torch.Generator().manual_seed(1)
    for prompt in (5, 9, 17):
        ids = torch.randint(1, 256, (2, prompt), generator=g)
        kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False)
        with torch.no_grad():
            want = eager.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            got = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        assert torch.equal(got, want), (prompt, got, want)
    stats = kiln.stats()
    assert 1 <= stats["graphs"] <= 4, stats
    assert stats["breaks"] == 0 and stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats
