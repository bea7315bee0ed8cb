"""The wrapper calls torch's generated bindings for the library ops every graph calls:
each must compute what its ATen overload does (same overload, same keyword names)."""

from __future__ import annotations

import pytest
import torch

from kiln_inductor.wrapper import call_target

aten = torch.ops.aten


def _r(*shape):
    return torch.randn(*shape, generator=_r.gen)


_r.gen = torch.Generator().manual_seed(0)

CASES = [
    (
        aten.convolution.default,
        lambda: (
            (_r(2, 4, 9, 9), _r(6, 2, 3, 3), _r(6), [2, 1], [1, 0], [1, 1], False, [0, 0], 2),
            {},
        ),
    ),
    (
        aten.convolution.default,
        lambda: (
            (_r(1, 3, 5, 5), _r(3, 2, 3, 3), None, [1, 1], [1, 1], [1, 1], True, [0, 0], 1),
            {},
        ),
    ),
    (aten.mm.default, lambda: ((_r(5, 7), _r(7, 3)), {})),
    (aten.bmm.default, lambda: ((_r(2, 5, 7), _r(2, 7, 3)), {})),
    (aten.addmm.default, lambda: ((_r(3), _r(5, 7), _r(7, 3)), {"beta": 0.5, "alpha": 2.0})),
    (aten.baddbmm.default, lambda: ((_r(2, 5, 3), _r(2, 5, 7), _r(2, 7, 3)), {"alpha": 0.25})),
    (aten.mv.default, lambda: ((_r(5, 7), _r(7)), {})),
    (aten.dot.default, lambda: ((_r(7), _r(7)), {})),
    (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        lambda: ((_r(2, 3, 8, 16), _r(2, 3, 8, 16), _r(2, 3, 8, 16)), {"is_causal": True}),
    ),
    # data-dependent ops (their symbols bound from the result: ExternKernel.binds)
    (aten.nonzero.default, lambda: ((_r(4, 5) > 0,), {})),
    (aten.masked_select.default, lambda: ((_r(4, 5), _r(5) > 0), {})),
    (
        aten._unique2.default,
        lambda: (((_r(12) * 2).round(),), {"return_inverse": True, "return_counts": True}),
    ),
    (aten.equal.default, lambda: ((_r(3), _r(3)), {})),
    (aten.is_nonzero.default, lambda: ((_r(1),), {})),
    (aten.allclose.default, lambda: ((_r(4), _r(4)), {"atol": 10.0})),
    (aten._assert_scalar.default, lambda: ((True, "never raised"), {})),
]


@pytest.mark.parametrize("op,make", CASES, ids=[f"{op}-{i}" for i, (op, _) in enumerate(CASES)])
def test_binding_computes_what_the_overload_does(op, make):
    target = call_target(op)
    assert target is not op._op, "expected torch's generated binding"
    args, kwargs = make()
    want, got = op(*args, **kwargs), target(*args, **kwargs)
    for w, g in zip(*(x if isinstance(x, tuple) else (x,) for x in (want, got))):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_other_overloads_use_their_dispatcher_entry():
    assert call_target(aten.convolution_backward.default) is aten.convolution_backward.default._op
    assert call_target(aten.add.Tensor) is aten.add.Tensor._op
    assert call_target(len) is len  # not an ATen overload: as it is


def test_every_bound_op_is_tested_or_needs_a_gpu():
    from kiln_inductor.wrapper import _bindings

    tested = {op for op, _ in CASES}
    gpu_only = {
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    }
    assert set(_bindings()) == tested | gpu_only  # a newly bound op needs a case above
    for op, binding in _bindings().items():
        assert binding.__name__ == op._schema.name.split("::")[-1]
