"""The generated wrapper: storage reuse and in-place outputs keep results right, outputs
that are views come back as views with eager's strides."""

from __future__ import annotations

import re

import torch

import kiln_cpp  # noqa: F401
from kiln_inductor.testing import check_compiled

aten = torch.ops.aten


def test_in_place_output_over_a_dead_input_is_correct():
    def f(x, w):
        a = aten.exp.default(x)
        m = aten.mm.default(a, w)
        return (aten.add.Tensor(a, m),)

    compiled = check_compiled(f, [torch.randn(16, 16), torch.randn(16, 16)])
    assert "# in place" in compiled.wrapper_source


def test_storage_of_dead_buffers_is_reused_and_results_stay_right():
    def f(x, w):
        a = aten.exp.default(x)
        b = aten.mm.default(a, w)
        c = aten.sin.default(b)
        d = aten.mm.default(c, w)
        e = aten.cos.default(d)
        return (aten.mm.default(e, w),)

    # moderate magnitudes: sin/cos of large matmul outputs amplify last-bit differences
    compiled = check_compiled(f, [torch.randn(32, 32) * 0.2, torch.randn(32, 32) * 0.2], rtol=1e-4)
    assert compiled.stats["reused_buffers"] >= 1


def test_kernel_writes_over_a_dead_matmul_result_and_results_stay_right():
    """A matmul's result is storage the wrapper alone references: the GELU-like kernel
    reading it last writes its output there (no allocation), also when the mm reads a
    value the kernel reads too."""

    def f(x, w):
        m = aten.mm.default(x, w)
        g = aten.mul.Tensor(aten.sigmoid.default(m), m)
        return (aten.add.Tensor(g, aten.sum.dim_IntList(x, [1], True)),)

    compiled = check_compiled(f, [torch.randn(16, 8), torch.randn(8, 16)], rtol=1e-5)
    src = compiled.wrapper_source
    extern = re.search(r"^ +(buf\d+) = extern\d+$", src, re.M)
    assert extern, src
    over = rf"^ +buf\d+ = {extern.group(1)}(\.as_strided\(.*\))?  # in place$"
    assert re.search(over, src, re.M), src
    assert "empty_strided((16, 16)" not in src, src
    again = compiled(torch.ones(16, 8), torch.ones(8, 16))[0]  # a second call, other data
    want = f(torch.ones(16, 8), torch.ones(8, 16))[0]
    torch.testing.assert_close(again, want)


def test_view_outputs_keep_eager_strides():
    def f(x):
        y = aten.mul.Tensor(x, 2.0)
        return (aten.permute.default(y, [1, 0]), aten.slice.Tensor(x, 1, 1, 3))

    x = torch.randn(4, 5)
    compiled = check_compiled(f, [x])
    a, b = compiled(x)
    assert a.stride() == f(x)[0].stride()
    assert b.data_ptr() == x[:, 1:3].data_ptr()  # a view of the input, not a copy


def test_inputs_with_other_strides_than_compiled_for_are_handled():
    def f(x):
        return (aten.exp.default(x),)

    x = torch.randn(6, 5)
    compiled = check_compiled(f, [x])
    y = torch.randn(5, 6).t()  # same shape, transposed strides
    torch.testing.assert_close(compiled(y)[0], torch.exp(y))


def test_fallback_output_strides_are_checked():
    """A fallback op's output strides follow its inputs': here meta says channels-last (the
    graph input is), but its input was realized contiguous, so the op returns contiguous;
    the wrapper restrides it to what the kernels that read it index by."""

    def f(x, y):
        a = aten.mul.Tensor(x, 2.0)
        b = aten.nextafter.default(a, y)  # no lowering: runs eagerly
        return (aten.relu.default(aten.add.Tensor(b, y)),)

    x = torch.randn(2, 8, 5, 6).contiguous(memory_format=torch.channels_last)
    compiled = check_compiled(f, [x, torch.randn(2, 8, 5, 6)])
    assert "restride(" in compiled.wrapper_source
