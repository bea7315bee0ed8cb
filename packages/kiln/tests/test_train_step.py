"""A whole training step compiled: ``opt.zero_grad(); loss = ...; loss.backward();
opt.step()`` with torch.optim SGD, Adam and AdamW (kiln-capture's variables/optimizers.py,
"optimizer steps"). The optimizer runs as a graph: the first step (lazy state) is a graph of
its own, every later step reuses one; parameters and optimizer state equal eager's after
every step; the step's graphs compile to generated kernels with no fallback."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import kiln

OPTIMIZERS = [
    ("sgd", torch.optim.SGD, dict(lr=0.05)),
    ("sgd_momentum", torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("sgd_nesterov", torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("sgd_foreach", torch.optim.SGD, dict(lr=0.05, momentum=0.9, foreach=True)),
    ("adam", torch.optim.Adam, dict(lr=1e-2)),
    ("adam_amsgrad_wd", torch.optim.Adam, dict(lr=1e-2, amsgrad=True, weight_decay=0.1)),
    ("adam_foreach", torch.optim.Adam, dict(lr=1e-2, foreach=True)),
    ("adamw", torch.optim.AdamW, dict(lr=1e-2)),
    ("adamw_single", torch.optim.AdamW, dict(lr=1e-2, foreach=False, amsgrad=True)),
    ("adamw_foreach", torch.optim.AdamW, dict(lr=1e-2, foreach=True, amsgrad=True)),
]
STEPS = 4
TOL = dict(rtol=1e-5, atol=1e-6)


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def _train_step(model, opt, loss_fn):
    def step(*batch):
        opt.zero_grad()
        loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
        return loss

    return step


def _mse(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def _pair(make, opt_cls, kwargs):
    torch.manual_seed(0)
    eager = make()
    model = make()
    model.load_state_dict(eager.state_dict())
    return (eager, opt_cls(eager.parameters(), **kwargs)), (
        model,
        opt_cls(model.parameters(), **kwargs),
    )


def _check_equal(eager, opt_e, model, opt_k, step):
    for (name, p), q in zip(eager.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, **TOL, msg=f"step {step}: {name}")
        for key, value in opt_e.state[p].items():
            torch.testing.assert_close(
                opt_k.state[q][key], value, **TOL, msg=f"step {step}: {name} {key}"
            )


class _Kernels(logging.Handler):
    """Counts the kernels kiln-inductor generates (its ``kernels`` log, at debug level)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "kernels" in record.getMessage()[:40] or "kernel" in record.getMessage()[:60]:
            self.count += 1


def _run(make, loss_fn, batches, opt_cls, kwargs):
    (eager, opt_e), (model, opt_k) = _pair(make, opt_cls, kwargs)
    kiln.reset()
    step_e = _train_step(eager, opt_e, loss_fn)
    step_k = kiln.compile(_train_step(model, opt_k, loss_fn))
    graphs = []
    for i, batch in enumerate(batches):
        want = step_e(*batch)
        got = step_k(*batch)
        torch.testing.assert_close(got, want, **TOL)
        _check_equal(eager, opt_e, model, opt_k, i)
        graphs.append(kiln.stats()["graphs"])
    return graphs, kiln.stats()


@pytest.mark.parametrize("name,opt_cls,kwargs", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_mlp_train_step_is_graphs_equal_to_eager(name, opt_cls, kwargs):
    gen = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(STEPS)
    ]
    handler = _Kernels()
    logger = logging.getLogger("kiln_inductor")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        graphs, stats = _run(_mlp, _mse, batches, opt_cls, kwargs)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    stateful = "momentum" in kwargs or opt_cls is not torch.optim.SGD
    # step 1: zero_grad + forward, then the optimizer (making its state); step 2: zero_grad
    # with grads to drop, and the steady-state optimizer step; later steps: no new graph
    assert graphs[-1] == graphs[1] == (4 if stateful else 3), (graphs, stats)
    assert stats["breaks"] == 2, stats  # loss.backward() in the two compiles of the frame
    assert stats["recompiles"] == (2 if stateful else 1), stats
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats
    assert handler.count > 0


def test_lr_scheduler_recompiles_once():
    """A float LR a scheduler changes every step becomes a tensor input after it changed
    once: no recompile per step (torch.compile recompiles on each new float LR)."""
    (eager, opt_e), (model, opt_k) = _pair(_mlp, torch.optim.Adam, dict(lr=1e-2))
    sched_e = torch.optim.lr_scheduler.LambdaLR(opt_e, lambda i: 0.9**i)
    sched_k = torch.optim.lr_scheduler.LambdaLR(opt_k, lambda i: 0.9**i)
    kiln.reset()
    step_e = _train_step(eager, opt_e, _mse)
    step_k = kiln.compile(_train_step(model, opt_k, _mse))
    gen = torch.Generator().manual_seed(2)
    for i in range(6):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        step_e(x, y)
        step_k(x, y)
        sched_e.step()
        sched_k.step()
        _check_equal(eager, opt_e, model, opt_k, i)
    stats = kiln.stats()
    assert stats["recompiles"] == 2 and stats["graphs"] == 4, stats
    assert stats["fallbacks"] == stats["eager_frames"] == 0, stats


transformers = pytest.importorskip("transformers")


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg)


def _lm_loss(model, ids):
    return model(ids, labels=ids).loss


@pytest.mark.parametrize(
    "name,opt_cls,kwargs",
    [OPTIMIZERS[1], OPTIMIZERS[5], OPTIMIZERS[9]],
    ids=[OPTIMIZERS[i][0] for i in (1, 5, 9)],
)
def test_gpt2_train_step_equal_to_model_compiled(name, opt_cls, kwargs):
    """Each step against the model compiled alone with an eager optimizer, both starting
    from kiln's parameters and state: the same forward and backward graphs, so the same
    gradients. (Against eager's gradients, or over several steps, Adam turns the 1e-7
    differences of near-zero gradients, such as the attention key bias's, into updates
    that differ by up to 2 * lr; the bias corrections are float32 tensor arithmetic in
    captured code, as under torch.compile, and float64 Python arithmetic in eager.)"""
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randint(1, 128, (2, 16), generator=gen),) for _ in range(STEPS)]
    (ref, opt_r), (model, opt_k) = _pair(_gpt2, opt_cls, kwargs)
    step_r = _train_step(kiln.compile(ref), opt_r, _lm_loss)
    step_k = kiln.compile(_train_step(model, opt_k, _lm_loss))
    kiln.reset()
    graphs = []
    for i, batch in enumerate(batches):
        ref.load_state_dict(model.state_dict())
        opt_r.load_state_dict(copy.deepcopy(opt_k.state_dict()))  # it keeps the tensors
        before = kiln.stats()
        step_r(*batch)
        after = kiln.stats()
        step_k(*batch)
        _check_equal(ref, opt_r, model, opt_k, i)
        graphs.append(kiln.stats()["graphs"] - (after["graphs"] - before["graphs"]))
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats
    # the whole step: 1 + 1 graphs at step 1, 1 + 1 more at step 2, none after
    assert graphs[-1] == graphs[1] == 5, (graphs, stats)


def test_optimizer_is_traced_after_torch_compile_ran_in_the_process():
    """torch.compile, once it has run, wraps every optimizer's ``_init_group`` in its own
    disable wrapper: kiln traces through it (it broke the optimizer step in two)."""
    torch._dynamo.reset()
    torch.compile(lambda x: x * 2, backend="eager")(torch.randn(3))
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(3)
    batches = [
        (torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(3)
    ]
    graphs, stats = _run(_mlp, _mse, batches, torch.optim.SGD, dict(lr=0.1, momentum=0.9))
    assert graphs[-1] == graphs[1] == 4, (graphs, stats)
    assert stats["breaks"] == 2 and stats["fallbacks"] == 0, stats


def test_lazy_backward_compile_inside_a_captured_step_is_not_captured(tmp_path, monkeypatch):
    """The whole step captured, ``loss.backward()`` inside it: the backward compiles on its
    first call from inside autograd while the frame hook watches, and its artifact-cache
    save pickles sympy expressions; none of the compiler's own frames may be captured
    (sympy's ``Basic.__reduce_ex__`` was reported as a frame run eagerly)."""
    import warnings

    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("KILN_ARTIFACT_CACHE", "1")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=128,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(1, 512, (4, 64))

    def step(ids):
        opt.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    kiln.reset()
    compiled = kiln.compile(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            compiled(ids)
    eager = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    assert eager == [], eager
    assert kiln.stats()["eager_frames"] == 0 and kiln.stats()["graphs"] >= 2
