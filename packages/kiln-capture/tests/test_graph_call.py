"""The graph call of a cache hit: a backend's ``kiln_guarded_call`` is used when the
guards check every graph input's tensor metadata, and the arguments' shared read chains
are computed once."""

import torch
from helpers import CountingBackend
from torch import nn

import kiln_capture
from kiln_capture import hook


class GuardedBackend(CountingBackend):
    """Runs graphs as given through a callable offering ``kiln_guarded_call``; counts the
    calls each path gets."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = {"checked": 0, "guarded": 0}

    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)
        calls = self.calls

        def checked(*args):
            calls["checked"] += 1
            return gm.forward(*args)

        def guarded(*args):
            calls["guarded"] += 1
            return gm.forward(*args)

        checked.kiln_guarded_call = guarded
        return checked


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Sequential(nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.b(self.a(x)).tanh()


class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))
        self.b = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return (x @ self.w + self.b).tanh()


def test_guarded_call_is_used_and_parameter_changes_still_recompile():
    kiln_capture.reset()
    m = Affine()
    backend = GuardedBackend()
    om = kiln_capture.optimize(backend)(m)
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(om(x), m(x))
    assert len(backend.graphs) == 1
    assert backend.calls == {"checked": 0, "guarded": 3}
    m.w = nn.Parameter(torch.randn(4, 3))  # same metadata, new tensor: a hit on new values
    torch.testing.assert_close(om(x), m(x))
    assert len(backend.graphs) == 1
    backend.calls["guarded"] -= 1
    changes = [
        lambda: m.w.requires_grad_(False),
        lambda: setattr(m, "w", nn.Parameter(torch.randn(3, 4).t())),  # strides
        lambda: setattr(m, "b", nn.Parameter(torch.randn(1))),  # shape
        lambda: m.double(),  # dtype
    ]
    for i, change in enumerate(changes):
        change()
        x = torch.randn(2, 4, dtype=m.w.dtype)
        for _ in range(2):
            torch.testing.assert_close(om(x), m(x))
        assert len(backend.graphs) == i + 2, f"change {i} did not recompile"
    assert backend.calls == {"checked": 0, "guarded": 3 + 2 * len(changes)}
    kiln_capture.reset()


def test_graph_arguments_read_shared_chains_once():
    kiln_capture.reset()
    m = TwoLayers()
    backend = CountingBackend()
    om = kiln_capture.optimize(backend)(m)
    x = torch.randn(2, 4)
    torch.testing.assert_close(om(x), m(x))
    torch.testing.assert_close(om(x), m(x))
    (entry,) = hook.cache_entries(TwoLayers.forward.__code__)
    src = entry.run.__kiln_source__
    assert src.count("self._modules") == 1, src
    # b's Linear is read once, then both of its parameters through the one local
    linear = [ln.split(" = ")[0].strip() for ln in src.splitlines() if ln.endswith("['1']")]
    assert len(linear) == 1, src
    graph_call = next(ln for ln in src.splitlines() if "__k_graph(" in ln)
    assert graph_call.index("x") < graph_call.index("__k_a"), "argument order kept"
    kiln_capture.reset()
