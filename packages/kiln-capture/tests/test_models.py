"""Real model code: HF transformers GPT-2, BERT and a LLaMA-style model (tiny configs,
random weights) and timm models, captured for inference with zero graph breaks."""

import pytest
import torch
from helpers import CountingBackend

import kiln_capture

transformers = pytest.importorskip("transformers")


def _gpt2():
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=128,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2Model(cfg)


def _bert():
    cfg = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=32,
    )
    return transformers.BertModel(cfg)


def _llama():
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=128,
        max_position_embeddings=32,
    )
    return transformers.LlamaModel(cfg)


HF_MODELS = {
    "gpt2": (_gpt2, {"use_cache": False}),
    "bert": (_bert, {}),
    "llama": (_llama, {"use_cache": False}),
}


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_hf_model_captured_without_breaks(name):
    make, kwargs = HF_MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, 128, (2, 12))

    def run(ids):
        return model(input_ids=ids, **kwargs)

    with torch.no_grad():
        ref = run(ids)
        out = kiln_capture.explain(run)(ids)
    assert (out.graph_count, out.break_count) == (1, 0), str(out.breaks)
    assert type(out.result) is type(ref)
    torch.testing.assert_close(out.result.last_hidden_state, ref.last_hidden_state)

    backend = CountingBackend()
    fast = kiln_capture.optimize(backend)(run)
    new_ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        fast(ids)
        again = fast(new_ids)
        expected = run(new_ids)
    assert len(backend.graphs) == 1, "a second call with new ids recompiled"
    torch.testing.assert_close(again.last_hidden_state, expected.last_hidden_state)


@pytest.mark.parametrize("name", list(HF_MODELS))
@pytest.mark.parametrize("dynamic", [True, None])
def test_hf_model_one_graph_for_every_sequence_length(name, dynamic):
    """dynamic=True: one graph, symbolic batch and length; None: the second length
    recompiles once with the length symbolic. Both match eager at every length."""
    make, kwargs = HF_MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    backend = CountingBackend()
    fast = kiln_capture.optimize(backend, dynamic=dynamic)(model)
    with torch.no_grad():
        for length in (7, 12, 5, 19, 31):
            ids = torch.randint(0, 128, (2, length))
            got = fast(input_ids=ids, **kwargs).last_hidden_state
            torch.testing.assert_close(got, model(input_ids=ids, **kwargs).last_hidden_state)
    assert len(backend.graphs) == (1 if dynamic else 2)
    assert kiln_capture.stats()["breaks"] == 0
    (ids,) = [n for n in backend.graphs[-1].graph.nodes if n.op == "placeholder"][:1]
    symbolic = [isinstance(s, torch.SymInt) for s in ids.meta["val"].shape]
    assert symbolic == [bool(dynamic), True]


def _more_models():
    tf = transformers
    small = dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=128,
    )
    return {
        "mistral": lambda: tf.MistralModel(
            tf.MistralConfig(num_key_value_heads=2, max_position_embeddings=64, **small)
        ),
        "qwen2": lambda: tf.Qwen2Model(
            tf.Qwen2Config(num_key_value_heads=2, max_position_embeddings=64, **small)
        ),
        "gpt_neox": lambda: tf.GPTNeoXModel(tf.GPTNeoXConfig(max_position_embeddings=64, **small)),
        "roberta": lambda: tf.RobertaModel(tf.RobertaConfig(max_position_embeddings=66, **small)),
        "opt": lambda: tf.OPTModel(
            tf.OPTConfig(
                num_hidden_layers=2,
                hidden_size=64,
                num_attention_heads=4,
                ffn_dim=128,
                vocab_size=128,
                max_position_embeddings=64,
                word_embed_proj_dim=64,
            )
        ),
        "distilbert": lambda: tf.DistilBertModel(
            tf.DistilBertConfig(
                n_layers=2,
                dim=64,
                n_heads=4,
                hidden_dim=128,
                vocab_size=128,
                max_position_embeddings=64,
            )
        ),
        "t5": lambda: tf.T5Model(
            tf.T5Config(num_layers=2, d_model=64, num_heads=4, d_ff=128, d_kv=16, vocab_size=128)
        ),
    }


@pytest.mark.parametrize(
    "name", ["mistral", "qwen2", "gpt_neox", "roberta", "opt", "distilbert", "t5"]
)
def test_more_hf_models_captured_without_breaks(name):
    torch.manual_seed(0)
    try:
        model = _more_models()[name]().eval()
    except (AttributeError, TypeError, ValueError) as e:
        pytest.skip(f"this transformers version cannot build {name}: {e}")
    ids = torch.randint(3, 128, (2, 10))
    kwargs = {} if name in ("roberta", "distilbert") else {"use_cache": False}
    if name == "t5":
        kwargs["decoder_input_ids"] = ids

    def run(ids):
        return model(input_ids=ids, **kwargs)

    with torch.no_grad():
        ref = run(ids)
        out = kiln_capture.explain(run)(ids)
    assert (out.graph_count, out.break_count) == (1, 0), str(out.breaks)
    torch.testing.assert_close(out.result.last_hidden_state, ref.last_hidden_state)


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_hf_train_mode_with_dropout_matches_eager(name):
    """Train mode (dropout on): one graph, and the same loss and gradients as eager
    under the same seed (the graph draws random numbers in eager's order)."""
    make, kwargs = HF_MODELS[name]
    torch.manual_seed(0)
    model = make().train()
    ids = torch.randint(0, 128, (2, 12))

    def run(ids):
        return model(input_ids=ids, **kwargs).last_hidden_state.sum()

    torch.manual_seed(5)
    out = kiln_capture.explain(run)(ids)
    out.result.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    torch.manual_seed(5)
    ref = run(ids)
    ref.backward()
    assert (out.graph_count, out.break_count) == (1, 0), str(out.breaks)
    torch.testing.assert_close(out.result, ref)
    ref_grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_hf_training_step_matches_eager():
    """A training step (loss and gradients) matches eager, whatever breaks it needs."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=128,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, 128, (2, 12))

    def step(ids):
        return model(input_ids=ids, labels=ids, use_cache=False).loss

    loss = kiln_capture.optimize(CountingBackend())(step)(ids)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = step(ids)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad)


TIMM_MODELS = ["resnet50", "convnext_tiny", "vit_small_patch16_224"]


@pytest.mark.slow
@pytest.mark.parametrize("name", TIMM_MODELS)
def test_timm_model_captured_without_breaks(name):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        ref = model(x)
        out = kiln_capture.explain(model)(x)
    assert (out.graph_count, out.break_count) == (1, 0), str(out.breaks)
    torch.testing.assert_close(out.result, ref)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hf_model_under_cpu_autocast_matches_eager(name):
    """The caller's bf16 autocast applies inside the captured graph (LLaMA's rotary
    embedding also opens its own ``autocast(enabled=False)`` block)."""
    make, kwargs = HF_MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, 128, (2, 12))

    def run(ids):
        return model(input_ids=ids, **kwargs).last_hidden_state

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = run(ids)
        out = kiln_capture.explain(run)(ids)
    assert (out.graph_count, out.break_count) == (1, 0), str(out.breaks)
    dtypes = {
        n.meta["val"].dtype
        for n in out.graphs[0].graph.nodes
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
    }
    assert torch.bfloat16 in dtypes  # matmuls ran in bf16
    assert out.result.dtype == ref.dtype and torch.equal(out.result, ref)
