"""A function the user compiles directly is captured even where kiln skips frames of its
file (torch's own code: ``kiln.compile(optimizer.step)``, ``optimize(b)(F.gelu)``); frames
of such files reached any other way still run as they are."""

import torch
import torch.nn.functional as F
from helpers import CountingBackend

import kiln_capture


def test_a_torch_function_compiled_directly_is_captured():
    backend = CountingBackend()
    fn = kiln_capture.optimize(backend)(F.softmin)
    x = torch.randn(4, 5)
    torch.testing.assert_close(fn(x, dim=1), F.softmin(x, dim=1))
    assert len(backend.graphs) == 1
    assert kiln_capture.stats()["eager_frames"] == 0


def test_an_optimizer_step_compiled_directly_is_captured():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(8))
    q = torch.nn.Parameter(p.detach().clone())
    opt, twin = torch.optim.SGD([p], lr=0.1), torch.optim.SGD([q], lr=0.1)
    backend = CountingBackend()
    step = kiln_capture.optimize(backend)(opt.step)
    for _ in range(3):
        g = torch.randn(8)
        p.grad, q.grad = g.clone(), g.clone()
        step()
        twin.step()
    torch.testing.assert_close(p, q)
    assert len(backend.graphs) >= 1
