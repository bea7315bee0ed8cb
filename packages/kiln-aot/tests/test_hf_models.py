"""Small random-weight Hugging Face models trained one step: loss, logits and gradients
equal eager (dropout on). Skipped where transformers is not installed."""

import copy

import pytest
import torch
from kiln_aot_testing import assert_close

from kiln_aot import aot_module

transformers = pytest.importorskip("transformers")


def _gpt2():
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=128,
            n_positions=32,
            bos_token_id=0,
            eos_token_id=0,
        )
    )


def _bert():
    return transformers.BertForMaskedLM(
        transformers.BertConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=128,
            max_position_embeddings=32,
        )
    )


def _llama():
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=128,
            max_position_embeddings=32,
        )
    )


@pytest.mark.parametrize("make", [_gpt2, _bert, _llama], ids=["gpt2", "bert", "llama"])
def test_one_training_step_matches_eager(make, compiler):
    model = make().train()
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 128, (2, 16))
    torch.manual_seed(1)
    out = aot_module(model, compiler)(input_ids=ids, labels=ids)
    torch.manual_seed(1)
    expected = ref(input_ids=ids, labels=ids)
    assert_close(out.logits, expected.logits)
    assert_close(out.loss, expected.loss)
    out.loss.backward()
    expected.loss.backward()
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        if b.grad is not None:
            assert_close(a.grad, b.grad), name
