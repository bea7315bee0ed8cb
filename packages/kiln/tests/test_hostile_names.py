"""Names from user code that reach generated Python, C++ or Triton source (parameter,
buffer, submodule and dict-key names, keyword names) inject nothing: a hostile name that
would run code if pasted into source leaves its mark nowhere, and results match eager."""

from __future__ import annotations

import builtins

import torch

import kiln

HOSTILE = [
    "x'); setattr(__import__('builtins'), 'KILN_PWNED', 1); ('",
    'y"); setattr(__import__("builtins"), "KILN_PWNED", 2); ("',
    "z\nsetattr(__import__('builtins'), 'KILN_PWNED', 3)\n#",
    "w */ int KILN_PWNED = 4; /*",
    "v\\'; KILN_PWNED = 5 #",
]


class Hostile(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for k, name in enumerate(HOSTILE):
            self.register_parameter(name, torch.nn.Parameter(torch.randn(4) + k))
            self.register_buffer(name + "_b", torch.randn(4))
        self.add_module("m'); KILN_PWNED = 6 #", torch.nn.Linear(4, 4))

    def forward(self, inputs: dict):
        out = inputs["a'); KILN_PWNED = 7 #"]
        for name in HOSTILE:
            out = out * getattr(self, name) + getattr(self, name + "_b")
        return {"o'); KILN_PWNED = 8 #": getattr(self, "m'); KILN_PWNED = 6 #")(out).relu()}


def test_hostile_names_inject_nothing(tmp_path):
    torch.manual_seed(0)
    model = Hostile()
    inputs = {"a'); KILN_PWNED = 7 #": torch.randn(3, 4)}
    kiln.reset()
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path)})
    with torch.no_grad():
        got, want = compiled(inputs), model(inputs)
    torch.testing.assert_close(got["o'); KILN_PWNED = 8 #"], want["o'); KILN_PWNED = 8 #"])
    assert not hasattr(builtins, "KILN_PWNED")
    assert kiln.stats()["graphs"] >= 1 and kiln.stats()["fallbacks"] == 0
    # kernels name their arguments with generated identifiers only
    kernels = [p for p in tmp_path.rglob("kernel*") if p.is_file()]
    assert kernels
    for path in kernels:
        assert "KILN_PWNED" not in path.read_text(), path
