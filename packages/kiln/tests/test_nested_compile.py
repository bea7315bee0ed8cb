"""A compiled module or function called inside compiled code is traced into the caller's
graph (as torch.compile does), not a break at the wrapper: users compile blocks and then
the model, or a helper and then the step."""

from __future__ import annotations

import torch
from torch import nn

import kiln


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.block(x).relu() + x)


def _stats_clean(graphs: int = 1) -> None:
    s = kiln.stats()
    assert s["graphs"] == graphs, s
    assert s["breaks"] == s["fallbacks"] == s["eager_frames"] == 0, s


def test_a_compiled_block_inside_a_compiled_model_is_one_graph():
    kiln.reset()
    torch.manual_seed(0)
    net, ref = Net(), Net()
    ref.load_state_dict(net.state_dict())
    net.block = kiln.compile(net.block)
    compiled = kiln.compile(net)
    x = torch.randn(4, 8)
    out, expected = compiled(x), ref(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    _stats_clean()


def test_a_compiled_helper_inside_a_compiled_function_is_one_graph():
    kiln.reset()
    helper = kiln.compile(lambda x: torch.sin(x) * 2)
    step = kiln.compile(lambda x: helper(x).cos().sum())
    x = torch.randn(5, 7)
    torch.testing.assert_close(step(x), (torch.sin(x) * 2).cos().sum())
    _stats_clean()
    # the helper alone still runs its own compiled code
    torch.testing.assert_close(helper(x), torch.sin(x) * 2)


def test_replacing_the_compiled_block_recompiles_the_caller():
    kiln.reset()
    torch.manual_seed(1)
    net = Net()
    net.block = kiln.compile(net.block)
    compiled = kiln.compile(net)
    x = torch.randn(4, 8)
    compiled(x)
    other = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    net.block = kiln.compile(other)
    expected = net.head(other(x).relu() + x)
    torch.testing.assert_close(compiled(x), expected)
    assert kiln.stats()["breaks"] == 0


def test_compiled_forward_runs_the_compiled_call():
    kiln.reset()
    torch.manual_seed(2)
    net = Net()
    compiled = kiln.compile(net)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled.forward(x), net(x))
    _stats_clean()
    assert type(net).forward is Net.forward  # the user's module is left as it is
