"""Random draws inside torch's fused functions keep their place among the calls that
seed or restore the generator (OpInfo's ``wrapper_set_seed``: ``freeze_rng_state()``
around ``torch.manual_seed(42)`` and the op). kiln-capture runs generator writes before the
graph only while the graph has no random op yet; ``rrelu`` with training, fractional max
pooling, and attention with dropout are random ops too (their restore used to run before
the graph, so they drew from the restored state). ``rrelu_with_noise`` writes its noise
argument: kiln-aot computes it with ``rrelu_with_noise_functional``."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import kiln


@contextlib.contextmanager
def freeze_rng_state():
    """What torch's test utility of that name does to the CPU generator (it needs
    expecttest, which the test environment does not install)."""
    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)


def _seeded(op):
    def run(*args, **kwargs):
        with freeze_rng_state():
            torch.manual_seed(42)
            return op(*args, **kwargs)

    return run


CASES = {
    "rrelu_train": (lambda x: F.rrelu(x, 0.0, 1.0, training=True), (20,)),
    "rrelu_eval": (lambda x: F.rrelu(x, 0.1, 0.3, training=False), (20,)),
    "fractional_max_pool2d": (
        lambda x: F.fractional_max_pool2d(x, 2, output_size=(3, 3)),
        (1, 2, 7, 7),
    ),
    "sdpa_dropout": (
        lambda x: F.scaled_dot_product_attention(x, x, x, dropout_p=0.5),
        (2, 3, 4, 8),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_seeded_random_ops_draw_what_eager_draws(name):
    op, shape = CASES[name]
    fn = _seeded(op)
    x = torch.randn(shape)
    kiln.reset()
    compiled = kiln.compile(fn, options={"raise_on_error": True})
    for _ in range(2):
        torch.manual_seed(0)
        want = fn(x.clone())
        after_eager = torch.rand(3)
        torch.manual_seed(0)
        got = compiled(x.clone())
        after_compiled = torch.rand(3)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(after_compiled, after_eager)  # the state restored too
    assert kiln.stats()["graphs"] >= 1
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["eager_frames"] == 0
