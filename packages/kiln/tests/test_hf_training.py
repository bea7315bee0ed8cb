"""HF models trained as users train them: ``model(input_ids, labels=labels).loss`` (the
model computes its loss; transformers' ``loss_function`` warns once through an
``lru_cache``d ``logger.warning_once``) compiles into one graph with no break, and the
gradients equal eager's."""

from __future__ import annotations

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")

SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4)


def _model(name: str, use_cache: bool | None = False):
    """``use_cache=None``: the config's default (on for T5 and BART)."""
    T = transformers
    cache = {} if use_cache is None else {"use_cache": use_cache}
    if name == "gpt2":
        cfg = T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
        return T.GPT2LMHeadModel(cfg)
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**SMALL, num_key_value_heads=2, vocab_size=128))
    if name == "t5":
        cfg = T.T5Config(
            num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, d_ff=128, num_heads=4,
            vocab_size=128, decoder_start_token_id=0, dropout_rate=0.0, **cache,
        )  # fmt: skip
        return T.T5ForConditionalGeneration(cfg)
    if name == "bart":
        cfg = T.BartConfig(
            d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=2, decoder_layers=2,
            vocab_size=128, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
            **cache,
        )  # fmt: skip
        return T.BartForConditionalGeneration(cfg)
    return T.BertForMaskedLM(T.BertConfig(**SMALL, vocab_size=128))


def _pair(name: str, use_cache: bool | None):
    """The eager model and a copy of its weights, in train mode, with dropout off."""
    torch.manual_seed(0)
    eager = _model(name, use_cache)
    model = _model(name, use_cache)
    model.load_state_dict(eager.state_dict())
    for m in [*eager.modules(), *model.modules()]:
        # dropout draws differ between eager and compiled code (functional dropout: the
        # configs say 0)
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    eager.train()
    model.train()
    kiln.reset()
    return eager, model


@pytest.mark.parametrize(
    "name,use_cache",
    [("gpt2", None), ("llama", None), ("bert", None), ("t5", False), ("bart", False)]
    # T5's and BART's default (None): the decoder builds an EncoderDecoderCache, whose
    # DynamicCache deep-copies the config (get_text_config) and deletes attributes of the copy
    + [("t5", None), ("bart", None)],
)
def test_training_with_labels_is_one_graph(name, use_cache):
    eager, model = _pair(name, use_cache)
    compiled = kiln.compile(model)
    ids = torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    want = eager(ids, labels=ids).loss
    got = compiled(ids, labels=ids).loss
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want)
    for (pname, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=pname)
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0, stats
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "bert"])
def test_training_under_bf16_autocast_is_one_graph(name):
    """As people train with mixed precision: the step under ``torch.autocast`` (bf16), the
    backward outside it. One graph, no break or fallback, the loss and gradients close to
    eager's (bf16 rounding). The H200's first bf16 run found breaks per attention, a
    compile error and wrong rotary values here; the CPU path shares their fixes."""
    eager, model = _pair(name, False if name in ("t5", "bart") else None)
    compiled = kiln.compile(model)
    ids = torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = eager(ids, labels=ids).loss
        got = compiled(ids, labels=ids).loss
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for (pname, p), q in zip(eager.named_parameters(), model.parameters()):
        assert q.grad.dtype == p.grad.dtype == torch.float32, pname
        scale = p.grad.abs().max().item() + 1e-3
        assert (q.grad - p.grad).abs().max().item() <= 5e-2 * scale, pname
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0, stats
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats
