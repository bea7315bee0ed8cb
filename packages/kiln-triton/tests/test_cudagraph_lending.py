"""CUDA graph runners in training (cudagraphs.py, "copied and lent outputs"), on the CPU.

A replay on the CPU is simulated: ``CpuGraphRunner._record`` keeps the function and its
static inputs, and each replay runs it again and writes the results into the same static
output tensors, as a CUDA graph replay writes into the same memory. What these tests check
is the runners' bookkeeping: which outputs are copies and which are lent, that the
backward reads the forward's saved tensors in place, and that no replay overwrites a lent
tensor still in use. The compiled graphs are kiln-triton's, run by Triton's interpreter;
every step is compared with eager (outputs and gradients). The same flows on a GPU, with
real CUDA graphs: test_gpu.py."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import kiln_triton
import kiln_triton.compile as kt_compile
from kiln_triton.cudagraphs import CudaGraphRunner
from kiln_triton.testing import use_triton_for_cpu


class _Replay:
    def __init__(self, fn, statics, outputs):
        self.fn, self.statics, self.outputs = fn, statics, outputs

    def replay(self):
        fresh = self.fn(*self.statics)
        for out, new in zip(self.outputs, fresh):
            if isinstance(out, torch.Tensor):
                out.copy_(new)


class CpuGraphRunner(CudaGraphRunner):
    device_type = "cpu"
    made: list[CpuGraphRunner] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        CpuGraphRunner.made.append(self)

    def _capturing(self):
        return False

    def _warm_up(self, args):
        return self.fn(*args)

    def _record(self, statics):
        # a capture runs nothing: inputs the function writes get their values back
        tensors = [s for s in statics if isinstance(s, torch.Tensor)]
        before = [t.detach().clone() for t in tensors]
        outputs = self.fn(*statics)
        with torch.no_grad():
            for t, b in zip(tensors, before):
                t.copy_(b)
        return _Replay(self.fn, statics, outputs), outputs


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2).square().mean()


@pytest.fixture
def compiled(monkeypatch):
    CpuGraphRunner.made = []
    monkeypatch.setattr(kt_compile, "CudaGraphRunner", CpuGraphRunner)
    torch.manual_seed(0)
    params = [(torch.randn(*s) * 0.3).requires_grad_() for s in ((32, 16), (32,), (8, 32), (8,))]
    x = torch.randn(4, 16)
    with use_triton_for_cpu():
        runner = kiln_triton.compile_fx(
            torch.fx.symbolic_trace(mlp), [x, *params], mode="reduce-overhead"
        )
        yield runner, params


def _runners():
    by_role = {r.name.rsplit(".", 1)[-1]: r for r in CpuGraphRunner.made}
    return by_role["forward"], by_role["backward"]


def test_training_steps_replay_forward_and_backward(compiled):
    runner, params = compiled
    ref = [p.detach().clone().requires_grad_() for p in params]
    opt, ref_opt = torch.optim.SGD(params, lr=0.1), torch.optim.SGD(ref, lr=0.1)
    for step in range(4):
        x = torch.randn(4, 16)  # new values every step: replays must read them
        loss, ref_loss = runner(x, *params), mlp(x, *ref)
        loss.backward()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        for p, q in zip(params, ref):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=f"step {step}")
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    fw, bw = _runners()
    assert fw.copied == 1 and bw.copied == 0  # the loss copied; saved tensors, grads lent
    assert fw.replays == 4 and bw.replays == 4  # every step, the first one too
    assert runner.graphs == {}  # the runner around the step lets training through
    (entry,) = bw.graphs.values()
    assert entry.borrowed  # the backward read the forward's saved tensors in place
    kept = loss.detach().clone()
    runner(torch.randn(4, 16), *params).backward()
    torch.testing.assert_close(loss, kept)  # a copy: the next replay left it alone


def test_lent_tensors_in_use_make_the_call_run_without_its_graph(compiled, caplog):
    runner, params = compiled
    ref = [p.detach().clone().requires_grad_() for p in params]
    xs = [torch.randn(4, 16) for _ in range(3)]
    with caplog.at_level(logging.WARNING, logger="kiln_inductor"):
        # gradients accumulated over two steps: the second backward may not overwrite the
        # first one's gradients, which autograd keeps as param.grad
        for x in xs[:2]:
            runner(x, *params).backward()
            mlp(x, *ref).backward()
        fw, bw = _runners()
        assert (fw.replays, bw.replays) == (2, 1)
        for p, q in zip(params, ref):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
        # two forwards, then one backward: the second forward may not overwrite the
        # tensors the first one saved
        for p in (*params, *ref):
            p.grad = None
        a, b = runner(xs[0], *params), runner(xs[2], *params)
        (a + 2 * b).backward()
        (mlp(xs[0], *ref) + 2 * mlp(xs[2], *ref)).backward()
        for p, q in zip(params, ref):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
        assert fw.replays == 3  # the second forward ran without its graph
    assert "tensors its last replay lent out are still alive" in caplog.text
    for p in params:
        p.grad = None
    x = torch.randn(4, 16)
    before = (fw.replays, bw.replays)
    loss = runner(x, *params)
    loss.backward()
    assert (fw.replays, bw.replays) == (before[0] + 1, before[1] + 1)  # replays again
    want = torch.autograd.grad(mlp(x, *ref), ref)
    for p, g in zip(params, want):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("grad_off", [torch.no_grad, torch.inference_mode])
def test_inputs_the_graph_writes_are_updated_in_place(monkeypatch, caplog, grad_off):
    # a cache updated in place on every call (inference): the caller's tensor, not a copy;
    # under inference_mode, tensors have no version counter to show the write
    monkeypatch.setattr(kt_compile, "CudaGraphRunner", CpuGraphRunner)

    def step(x, cache):
        cache.mul_(0.5).add_(x)
        return x * cache.sum()

    with grad_off():
        x, cache = torch.randn(8), torch.randn(8)
        want = cache.clone()
    with use_triton_for_cpu(), grad_off(), caplog.at_level(logging.WARNING):
        runner = kiln_triton.compile_fx(
            torch.fx.symbolic_trace(step), [x, cache], mode="reduce-overhead"
        )
        for k in range(4):
            xk = torch.randn(8)
            got = runner(xk, cache)
            torch.testing.assert_close(got, step(xk, want), msg=f"call {k}")
            torch.testing.assert_close(cache, want, msg=f"call {k}")
        assert runner.replays == 3  # the first call returns the warm-up's result
        other = torch.randn(8)
        other_want = other.clone()
        torch.testing.assert_close(runner(x, other), step(x, other_want))
        torch.testing.assert_close(other, other_want)  # another buffer: run without the graph
        assert runner.replays == 3
    assert "writes to an input, which came in another tensor" in caplog.text


def test_training_with_running_statistics(monkeypatch):
    # BatchNorm in training mode updates its running statistics in the forward graph
    CpuGraphRunner.made = []
    monkeypatch.setattr(kt_compile, "CudaGraphRunner", CpuGraphRunner)

    def net(x, w, b, rm, rv):
        h = F.linear(x, w)
        return F.batch_norm(h, rm, rv, b.exp(), b, training=True, momentum=0.2).square().mean()

    torch.manual_seed(0)
    w, b = (torch.randn(16, 8) * 0.3).requires_grad_(), (torch.randn(16) * 0.1).requires_grad_()
    rm, rv = torch.zeros(16), torch.ones(16)
    ref = [
        w.detach().clone().requires_grad_(),
        b.detach().clone().requires_grad_(),
        rm.clone(),
        rv.clone(),
    ]
    with use_triton_for_cpu():
        runner = kiln_triton.compile_fx(
            torch.fx.symbolic_trace(net), [torch.randn(4, 8), w, b, rm, rv], mode="reduce-overhead"
        )
        for step in range(4):
            x = torch.randn(4, 8)
            loss, want = runner(x, w, b, rm, rv), net(x, *ref)
            loss.backward()
            want.backward()
            torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(rm, ref[2], msg=f"step {step}")
            torch.testing.assert_close(rv, ref[3], msg=f"step {step}")
            for p, q in zip((w, b), ref):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
                p.grad = q.grad = None
    # the forward graph returns the new statistics, kiln-aot writes them back: the forward's
    # runner writes no input, and replays from the first step on
    fw, bw = _runners()
    assert fw.replays == 4 and bw.replays == 4
    (entry,) = fw.graphs.values()
    assert entry.inplace == [] and all(e.borrowed for e in bw.graphs.values())


def test_a_runner_stops_capturing_after_max_graphs(monkeypatch, caplog):
    # one graph per input shape: beyond the limit, new shapes run without one
    from kiln_triton import cudagraphs

    monkeypatch.setattr(cudagraphs, "MAX_GRAPHS", 3)
    runner = CpuGraphRunner(lambda x: (x * 2 + 1,), "shapes")
    with caplog.at_level(logging.WARNING, logger="kiln_inductor"):
        for n in range(1, 7):
            x = torch.randn(n)
            torch.testing.assert_close(runner(x)[0], x * 2 + 1)
            torch.testing.assert_close(runner(x * 3)[0], x * 6 + 1)
    assert len(runner.graphs) == 3 and runner.replays == 6  # 3 shapes, 2 calls each
    assert "has captured 3 CUDA graphs" in caplog.text
