"""HF causal LMs with their default cache on (DynamicCache, lazily initialized layers,
configs overriding __getattribute__, partial activations): one graph, no breaks, and the
cache updated exactly as eager updates it, for a prompt and a decode step."""

from __future__ import annotations

import warnings

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
    max_position_embeddings=64,
)
FAMILIES = {
    "gpt2": lambda T: T.GPT2LMHeadModel(
        T.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=300)
    ),
    "llama": lambda T: T.LlamaForCausalLM(T.LlamaConfig(**SMALL)),
    "gemma": lambda T: T.GemmaForCausalLM(T.GemmaConfig(**SMALL, head_dim=16)),
    "mistral": lambda T: T.MistralForCausalLM(T.MistralConfig(**SMALL)),
    "qwen2": lambda T: T.Qwen2ForCausalLM(T.Qwen2Config(**SMALL)),
    "phi": lambda T: T.PhiForCausalLM(T.PhiConfig(**SMALL)),
}
CI_FAMILIES = ("gpt2", "llama", "gemma")


def _layers(cache):
    return [(layer.keys, layer.values) for layer in cache.layers]


def _check(name):
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = FAMILIES[name](transformers).eval()
    ids = torch.randint(3, 300, (1, 8))
    explained = kiln.explain(model, input_ids=ids)
    assert (explained.graph_count, explained.break_count) == (1, 0), explained.breaks
    kiln.reset()
    compiled = kiln.compile(model)
    with torch.no_grad():
        got, want = compiled(input_ids=ids), model(input_ids=ids)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
        for (gk, gv), (wk, wv) in zip(_layers(got.past_key_values), _layers(want.past_key_values)):
            torch.testing.assert_close(gk, wk)
            torch.testing.assert_close(gv, wv)
        step = torch.randint(3, 300, (1, 1))
        got2 = compiled(input_ids=step, past_key_values=got.past_key_values)
        want2 = model(input_ids=step, past_key_values=want.past_key_values)
        torch.testing.assert_close(got2.logits, want2.logits, rtol=1e-4, atol=1e-4)
        assert got2.past_key_values.get_seq_length() == want2.past_key_values.get_seq_length() == 9
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["eager_frames"] == 0


@pytest.mark.parametrize("name", CI_FAMILIES)
def test_causal_lm_with_cache(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in FAMILIES if n not in CI_FAMILIES])
def test_causal_lm_with_cache_more_families(name):
    _check(name)
