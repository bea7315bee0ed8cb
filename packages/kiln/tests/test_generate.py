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
    elif name == "phi":
        cfg = transformers.PhiConfig(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            vocab_size=256,
        )  # fmt: skip
        model = transformers.PhiForCausalLM(cfg)
    else:  # qwen2, mistral, gemma: LLaMA-like configs
        config_cls, model_cls = {
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
            "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
        }[name]
        cfg = config_cls(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256,
        )  # fmt: skip
        model = model_cls(cfg)
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.mark.parametrize(
    "name",
    [
        "gpt2",
        "llama",
        "qwen2",
        "mistral",
        "gemma",
        "phi",
    ],
)
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


def _seq2seq(name: str):
    torch.manual_seed(0)
    small = dict(d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=2, decoder_layers=2,
                 vocab_size=256)  # fmt: skip
    if name == "t5":
        cfg = transformers.T5Config(
            num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, d_ff=128, num_heads=4,
            vocab_size=256, decoder_start_token_id=0,
        )  # fmt: skip
        model = transformers.T5ForConditionalGeneration(cfg)
    elif name == "bart":
        model = transformers.BartForConditionalGeneration(transformers.BartConfig(**small))
    else:
        cfg = transformers.WhisperConfig(
            **small, num_mel_bins=16, max_source_positions=32, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=1, suppress_tokens=[], begin_suppress_tokens=[],
        )  # fmt: skip
        model = transformers.WhisperForConditionalGeneration(cfg)
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.mark.parametrize("name", ["t5", "bart", "whisper"])
def test_encoder_decoder_generate_matches_eager_without_breaks(name):
    """The encoder's output reaches the decoder step as a ModelOutput argument, the caches
    as an EncoderDecoderCache whose truth value is its length: read through their protocols,
    no graph break. Graphs: three cache states (empty, one token: size 1 specializes, then
    symbolic), each compiled again once when the second prompt length makes the encoder's
    length symbolic; a third length compiles nothing."""
    eager, model = _seq2seq(name), _seq2seq(name)
    kiln.reset()
    model.forward = kiln.compile(model.forward)
    g = torch.Generator().manual_seed(2)
    for n in (7, 11, 5):
        if name == "whisper":
            inputs = {"input_features": torch.randn(2, 16, 64, generator=g)}
        else:
            ids = torch.randint(1, 256, (2, n), generator=g)
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        kw = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False)
        with torch.no_grad():
            want = eager.generate(**inputs, **kw)
            got = model.generate(**inputs, **kw)
        assert torch.equal(got, want), (name, got, want)
        if n == 11:
            graphs = kiln.stats()["graphs"]
    stats = kiln.stats()
    assert stats["graphs"] == graphs and 1 <= graphs <= 6, stats
    assert stats["breaks"] == 0 and stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats


def test_generate_with_a_static_cache():
    """``cache_implementation="static"``: the cache is preallocated and written in place
    at the current positions; the prompt and the decode step are one graph each."""
    eager, model = _model("llama"), _model("llama")
    kiln.reset()
    model.forward = kiln.compile(model.forward)
    ids = torch.randint(1, 256, (2, 7), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        want = eager.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        got = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    assert torch.equal(got, want)
    stats = kiln.stats()
    assert stats["graphs"] <= 2 and stats["breaks"] == 0 and stats["fallbacks"] == 0, stats
