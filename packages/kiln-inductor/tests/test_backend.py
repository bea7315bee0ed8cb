import pytest
import torch

import kiln_inductor
from kiln_inductor import NoBackendError
from kiln_inductor.backend import _BACKENDS
from kiln_inductor.testing import aten_graph


def test_missing_backend_says_which_package_to_install(monkeypatch):
    monkeypatch.setattr(
        "kiln_inductor.backend._BACKENDS", {k: v for k, v in _BACKENDS.items() if k != "cpu"}
    )
    x = torch.randn(4)
    gm = aten_graph(lambda a: (torch.ops.aten.exp.default(a),), [x])
    with pytest.raises(NoBackendError, match="kiln-cpp"):
        kiln_inductor.compile_aten_graph(gm, [x])


def test_graph_of_only_views_and_externs_needs_no_backend(monkeypatch):
    monkeypatch.setattr("kiln_inductor.backend._BACKENDS", {})
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    gm = aten_graph(
        lambda p, q: (torch.ops.aten.mm.default(p, q), torch.ops.aten.permute.default(p, [1, 0])),
        [a, b],
    )
    out = kiln_inductor.compile_aten_graph(gm, [a, b])(a, b)
    torch.testing.assert_close(out[0], a @ b)
    torch.testing.assert_close(out[1], a.t())


def test_torch_level_graph_goes_through_kiln_aot():
    x = torch.randn(3, 4)
    gm = torch.fx.symbolic_trace(lambda a: torch.transpose(a, 0, 1))
    out = kiln_inductor.compile_fx(gm, [x])(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, x.t())
