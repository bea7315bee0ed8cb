"""Matmul templates with fused epilogues (mode="max-autotune"), in Triton's interpreter:
the generated kernel against eager for mm/addmm/bmm with bias, activation, residual and
cast epilogues, operands read through transposed and offset views, bfloat16; fusion
refused where it would be wrong; the unfused cuBLAS-style path the autotuner may pick."""

from __future__ import annotations

import os

import pytest
import torch
import torch.fx
from batch import make

from kiln_inductor import compile_aten_graph
from kiln_inductor.passes import fill_meta
from kiln_triton.config import settings_scope
from kiln_triton.runtime.template import CUBLAS, TemplateLauncher
from kiln_triton.testing import use_triton_for_cpu

aten = torch.ops.aten
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="runs kernels in Triton's interpreter"
)


def aten_graph(fn, inputs) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)
    proxies = []
    for k, x in enumerate(inputs):
        node = graph.placeholder(f"in{k}")
        node.meta["val"] = x
        proxies.append(torch.fx.Proxy(node, tracer))
    out = fn(*proxies)
    graph.output(tuple(o.node for o in out))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fill_meta(gm)
    return gm


def compile_and_check(fn, inputs, *, externs: int, autotune: bool = True, tol=None):
    """Compile, compare with eager, and check how many ATen matmuls are left (each fused
    template removes one)."""
    gm = aten_graph(fn, inputs)
    with use_triton_for_cpu(), settings_scope(max_autotune=autotune):
        compiled = compile_aten_graph(gm, inputs)
        got = compiled(*inputs)
    expected = fn(*inputs)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, **(tol or {"rtol": 2e-5, "atol": 2e-5}))
    assert compiled.stats["externs"] == externs
    # a fused matmul leaves no ATen call in the wrapper: the template kernel computes it
    assert compiled.wrapper_source.count("# extern aten.") == externs
    return compiled


def gelu_addmm(bias, x, w):
    return (aten.gelu.default(aten.addmm.default(bias, x, aten.t.default(w))),)


def test_addmm_with_bias_and_gelu_epilogue_is_one_kernel():
    x, w, b = (
        make((37, 40), torch.float32),
        make((48, 40), torch.float32),
        make((48,), torch.float32),
    )
    compiled = compile_and_check(gelu_addmm, (b, x, w), externs=0)
    assert compiled.stats["kernels"] == 1


def test_addmm_beta_alpha_and_a_2d_bias():
    def fn(bias, x, w):
        return (aten.relu.default(aten.addmm.default(bias, x, w, beta=0.5, alpha=2.0)),)

    x, w, b = (
        make((20, 24), torch.float32),
        make((24, 30), torch.float32),
        make((20, 30), torch.float32),
    )
    compile_and_check(fn, (b, x, w), externs=0)


def test_bmm_with_scale_and_residual_reads_operands_through_views():
    def fn(a, c, r):
        ct = aten.permute.default(c, [0, 2, 1])  # read transposed, in place
        return (aten.add.Tensor(aten.mul.Tensor(aten.bmm.default(a, ct), 0.125), r),)

    a, c, r = (
        make((3, 20, 36), torch.float32),
        make((3, 28, 36), torch.float32),
        make((3, 20, 28), torch.float32),
    )
    compile_and_check(fn, (a, c, r), externs=0)


def test_bfloat16_product_rounded_where_eager_rounds_it():
    def fn(x, w):
        y = aten.mm.default(x, w)
        return (aten._to_copy.default(aten.sigmoid.default(y), dtype=torch.float32),)

    x, w = make((33, 64), torch.bfloat16), make((64, 50), torch.bfloat16)
    compile_and_check(fn, (x, w), externs=0, tol={"rtol": 2e-2, "atol": 2e-2})


def test_no_template_unless_max_autotune():
    x, w, b = (
        make((37, 40), torch.float32),
        make((48, 40), torch.float32),
        make((48,), torch.float32),
    )
    compile_and_check(gelu_addmm, (b, x, w), externs=1, autotune=False)


@pytest.mark.parametrize(
    "case", ["two readers", "graph output", "transposed epilogue", "reduction"]
)
def test_fusion_refused_where_it_would_be_wrong(case):
    x, w = make((24, 32), torch.float32), make((32, 40), torch.float32)

    def fn(x, w):
        y = aten.mm.default(x, w)
        if case == "two readers":
            return (aten.relu.default(y), aten.mm.default(aten.t.default(y), x))
        if case == "graph output":
            return (y, aten.relu.default(y))
        if case == "transposed epilogue":
            return (
                aten.clone.default(
                    aten.t.default(aten.relu.default(y)), memory_format=torch.contiguous_format
                ),
            )
        return (aten.sum.dim_IntList(aten.relu.default(y), [1]),)

    compile_and_check(fn, (x, w), externs=2 if case == "two readers" else 1)


def test_the_unfused_path_matches_too(monkeypatch):
    monkeypatch.setattr(TemplateLauncher, "choose", lambda self, args: CUBLAS)
    x, w, b = (
        make((37, 40), torch.float32),
        make((48, 40), torch.float32),
        make((48,), torch.float32),
    )
    compile_and_check(gelu_addmm, (b, x, w), externs=0)


def _sgd_momentum(param, grad, momentum):
    new_momentum = aten.add.Tensor(aten.mul.Tensor(momentum, 0.9), grad)
    return (aten.add.Tensor(param, new_momentum, alpha=-0.1), new_momentum)


def test_outputs_written_over_inputs_are_stored_after_the_block_reads_them():
    """SGD with momentum, both new values written into their inputs (donated): the new
    parameter reads the old momentum at the index where the new momentum goes, in the same
    loop; the kernel stores the new momentum after that read."""
    param, grad, momentum = (make((37, 40), torch.float32) for _ in range(3))
    want = _sgd_momentum(param, grad, momentum)
    gm = aten_graph(_sgd_momentum, (param, grad, momentum))
    gm.meta["kiln_input_writes"] = ((0, 0), (1, 2))
    with use_triton_for_cpu():
        compiled = compile_aten_graph(gm, (param, grad, momentum))
        got = compiled(param, grad, momentum)
    assert compiled.wrapper_source.count("# in place") == 2, compiled.wrapper_source
    assert "empty_strided" not in compiled.wrapper_source
    for g, w, inp in zip(got, want, (param, momentum)):
        torch.testing.assert_close(g, w)
        assert g.data_ptr() == inp.data_ptr()  # written in the input's storage
