"""HF Whisper with its default cache on: the decoder deep-copies its config and builds an
EncoderDecoderCache of two DynamicCaches (whose ``get_text_config`` copies that copy
again), and its attention tests ``if cache and ...`` on a cache made in the trace. One
graph, no breaks, outputs and caches equal to eager (issue #16)."""

from __future__ import annotations

import warnings

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")


def _whisper():
    cfg = transformers.WhisperConfig(
        encoder_layers=2, decoder_layers=2, d_model=64, encoder_ffn_dim=128,
        decoder_ffn_dim=128, encoder_attention_heads=4, decoder_attention_heads=4,
        vocab_size=300, num_mel_bins=16, max_source_positions=16, max_target_positions=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
    )  # fmt: skip
    return transformers.WhisperForConditionalGeneration(cfg).eval()


def _layers(cache):
    return [(layer.keys, layer.values) for layer in cache.layers]


def test_whisper_forward_with_cache_is_one_graph():
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = _whisper()
    inputs = {
        "input_features": torch.randn(2, 16, 32),
        "decoder_input_ids": torch.randint(3, 300, (2, 5)),
    }
    explained = kiln.explain(model, **inputs)
    assert (explained.graph_count, explained.break_count) == (1, 0), explained.breaks
    kiln.reset()
    compiled = kiln.compile(model, backend="eager")
    with torch.no_grad():
        got, want = compiled(**inputs), model(**inputs)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.encoder_last_hidden_state, want.encoder_last_hidden_state)
    for side in ("self_attention_cache", "cross_attention_cache"):
        pairs = zip(
            _layers(getattr(got.past_key_values, side)),
            _layers(getattr(want.past_key_values, side)),
        )
        for (gk, gv), (wk, wv) in pairs:
            torch.testing.assert_close(gk, wk)
            torch.testing.assert_close(gv, wv)
    stats = kiln.stats()
    assert (stats["graphs"], stats["breaks"], stats["eager_frames"]) == (1, 0, 0), stats
