"""Activation checkpointing (``torch.utils.checkpoint.checkpoint``, non-reentrant) under
kiln.compile: the checkpointed function is traced into the graph (one graph, no break),
its nodes tagged as a recompute region; kiln-aot's partitioner then saves only what eager
checkpointing saves (the regions' inputs and outputs) and the backward recomputes the
rest. Gradients equal eager's; HF's ``gradient_checkpointing_enable()`` (a
``functools.partial`` of ``checkpoint`` around each layer) compiles the same way."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import kiln


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.b(F.gelu(self.a(x))).tanh() + x


class Stack(torch.nn.Module):
    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.checkpointed = checkpointed

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.checkpointed else b(x)
        return x.sum()


def _saved_by_partitions(monkeypatch) -> list[list]:
    """Patch kiln-aot's min-cut choice to record the values each partition saves."""
    from kiln_aot.partition import min_cut

    seen: list[list] = []
    choose = min_cut.choose_saved

    def recording(joint, num_fwd_outputs):
        saved = choose(joint, num_fwd_outputs)
        seen.append(saved)
        return saved

    monkeypatch.setattr(min_cut, "choose_saved", recording)
    return seen


def _train(checkpointed: bool, monkeypatch):
    torch.manual_seed(0)
    eager, model = Stack(checkpointed), Stack(checkpointed)
    model.load_state_dict(eager.state_dict())
    kiln.reset()
    saved = _saved_by_partitions(monkeypatch)
    # one partition of the whole graph (regional reuse would partition each block apart)
    monkeypatch.setenv("KILN_REGIONAL_REUSE", "0")
    compiled = kiln.compile(model)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        x = torch.randn(4, 32, generator=g)
        eager(x).backward()
        compiled(x).backward()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0, stats
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats
    (first,) = saved[:1]
    return [n for n in first if n.op != "placeholder"]


def test_checkpointed_blocks_save_only_their_boundaries(monkeypatch):
    """Without checkpointing the partition saves activations inside the blocks; with it,
    only the outputs of the first two blocks (the next blocks' inputs) besides inputs and
    weights, all three blocks in one graph with gradients equal to eager's."""
    plain = _train(False, monkeypatch)
    checkpointed = _train(True, monkeypatch)
    assert len(checkpointed) == 2, checkpointed
    assert all(tuple(n.meta["val"].shape) == (4, 32) for n in checkpointed), checkpointed
    assert len(plain) > len(checkpointed), (plain, checkpointed)


def test_hf_gradient_checkpointing_is_one_graph():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    eager, model = transformers.GPT2LMHeadModel(cfg), transformers.GPT2LMHeadModel(cfg)
    model.load_state_dict(eager.state_dict())
    for m in (eager, model):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.train()
    kiln.reset()
    compiled = kiln.compile(model)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    eager(ids).logits.square().mean().backward()
    compiled(ids).logits.square().mean().backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0 and stats["fallbacks"] == 0, stats


def _assert_grads_like_eager(eager: torch.nn.Module, model: torch.nn.Module) -> None:
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_checkpoint_around_a_compiled_block():
    """A block compiled on its own and called under checkpoint() from eager code (the
    checkpoint outside the compiled code, as around an FSDP2 unit): its first call, where
    capture and compilation run, is inside checkpoint's saved-tensor hooks. Capture runs
    with them suspended, so the forward saves what its recomputation saves; gradients
    equal eager's over two steps, one graph, nothing eager."""
    torch.manual_seed(0)
    eager, block = Block(), Block()
    block.load_state_dict(eager.state_dict())
    kiln.reset()
    compiled = kiln.compile(block)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        x = torch.randn(4, 32, generator=g)
        for b in (eager, compiled):
            checkpoint(b, x, use_reentrant=False).square().sum().backward()
        _assert_grads_like_eager(eager, block)
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0, stats
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats


def test_checkpoint_wrapper_is_one_graph():
    """torch.distributed's checkpoint_wrapper around each block: its forward is traced as
    the Python around checkpoint() it is (its CheckpointImpl enum compared as a constant),
    so the model is one graph with no break; gradients equal eager's."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    torch.manual_seed(0)
    eager, model = Stack(False), Stack(False)
    model.load_state_dict(eager.state_dict())
    for m in (eager, model):
        apply_activation_checkpointing(m, check_fn=lambda s: isinstance(s, Block))
    kiln.reset()
    compiled = kiln.compile(model)
    g = torch.Generator().manual_seed(4)
    for _ in range(2):
        x = torch.randn(4, 32, generator=g)
        eager(x).backward()
        compiled(x).backward()
        _assert_grads_like_eager(eager, model)
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["breaks"] == 0, stats
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats
