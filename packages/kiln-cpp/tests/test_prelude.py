"""The prelude's own math: kiln_expf against exp in float64, through a compiled kernel."""

from __future__ import annotations

import torch

import kiln_cpp  # noqa: F401  (registers the CPU backend)
from kiln_inductor.compile import compile_aten_graph
from kiln_inductor.testing import aten_graph

aten = torch.ops.aten


def _ulp_error(got: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ref = torch.exp(x.double())
    rf = ref.float()
    ulp = (torch.nextafter(rf.abs(), torch.tensor(float("inf"))) - rf.abs()).double()
    ulp = ulp.clamp_min(2.0**-149)  # subnormal results: one subnormal step
    return (got.double() - ref).abs() / ulp


def test_kiln_expf_is_within_about_one_ulp_everywhere():
    """A strided sample of every float bit pattern in [-110, 95] (normal, subnormal and
    zero results), plus the specials: -inf -> 0, inf -> inf, NaN -> NaN, overflow -> inf."""
    bits = torch.arange(0, 2**32, 4099, dtype=torch.int64)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    x = bits.view(torch.float32)
    x = x[(x > -110) & (x < 95)]
    specials = torch.tensor(
        [
            float("-inf"),
            float("inf"),
            float("nan"),
            0.0,
            -0.0,
            88.72,
            88.73,
            89.0,
            -87.3,
            -87.4,
            -100.0,
            -103.9,
            -104.0,
            -104.1,
            1e30,
            -1e30,
        ]
    )
    x = torch.cat([x, specials])
    gm = aten_graph(lambda t: (aten.exp.default(t),), [x])
    (got,) = compile_aten_graph(gm, [x])(x)
    finite = torch.isfinite(x) & torch.isfinite(torch.exp(x.double()).float())
    err = _ulp_error(got[finite], x[finite])
    assert err.max().item() < 1.05, x[finite][err.argmax()].item()
    torch.testing.assert_close(got[~finite], torch.exp(x[~finite]), equal_nan=True)
    tail = got[-len(specials) :]
    assert tail[0] == 0 and tail[1] == float("inf") and tail[2].isnan() and tail[3] == 1
    assert tail[7] == float("inf") and tail[12] == 0 and tail[14] == float("inf")
    assert tail[15] == 0
