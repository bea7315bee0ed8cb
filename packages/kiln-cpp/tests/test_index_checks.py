"""Bad indices in kiln-cpp kernels: eager's exception, never garbage or a crash, and the
compiled function works again afterwards (kiln_inductor.index_check)."""

from __future__ import annotations

import pytest
import torch

import kiln_cpp
from kiln_inductor.testing import bad_index_cases, check_bad_index_cases

LIBRARY_OPS: set[str] = set()  # cases whose op runs as a library call (ATen checks it)


@pytest.mark.parametrize("name", sorted(bad_index_cases()))
def test_bad_index_raises_eagers_error(name):
    graphs = check_bad_index_cases([name])[name]
    for g in graphs:
        if name in LIBRARY_OPS:
            continue
        assert g.stats["kernels"] >= 1 and not g.stats["fallbacks"], g.stats
        assert "raise_index_error" in g.wrapper_source, g.wrapper_source


def test_message_names_op_value_and_size():
    fn, good, bad = bad_index_cases()["gather_past_end"]
    compiled = kiln_cpp.compile_fx(fn, good)
    with pytest.raises(
        RuntimeError, match=r"index 100000 is out of bounds for dimension 1 with size 8"
    ) as e:
        compiled(*bad)
    assert "aten.gather" in str(e.value)


def test_checks_off_generate_no_check(monkeypatch):
    from kiln_inductor.compile import compile_aten_graph, compile_fx

    monkeypatch.setenv("KILN_CHECK_INDICES", "0")
    fn, good, _ = bad_index_cases()["embedding_huge_id"]
    graphs = []

    def record(gm, inputs):
        graphs.append(compile_aten_graph(gm, inputs))
        return graphs[-1]

    compiled = compile_fx(fn, good, compile_graph=record)
    torch.testing.assert_close(compiled(*good), fn(*good))
    (graph,) = graphs
    assert graph.stats["kernels"] >= 1 and not graph.stats["fallbacks"]
    assert "raise_index_error" not in graph.wrapper_source and "_err" not in graph.wrapper_source


def test_check_kernel_source_hoists_nothing_unsafe():
    """The bad lane reads element 0 (the select comes before the load's address); an id
    read by a row reduction (an embedding then a norm, as in every HF model) is checked
    once per row, before the row's loop, not in it."""
    from kiln_cpp.kernel import generate_cpp_kernel
    from kiln_inductor.graph import GraphLowering
    from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
    from kiln_inductor.testing import aten_graph

    aten = torch.ops.aten

    def f(w, i):
        e = aten.embedding.default(w, i)
        return (aten.div.Tensor(e, aten.sum.dim_IntList(aten.mul.Tensor(e, e), [-1], True)),)

    inputs = [torch.randn(10, 16), torch.randint(0, 10, (4, 5))]
    gm = aten_graph(f, inputs)
    ir = GraphLowering(gm, inputs).run()
    (group,) = [s for s in fuse_nodes(ir) if isinstance(s, FusedGroup)]
    src, checks, _ = generate_cpp_kernel(group, ir.buffers)
    assert len(checks) == 1 and checks[0].error is IndexError
    assert "kiln_index_fail(&kiln_err, 1L" in src and "return kiln_err;" in src
    assert "tmp" in src and "? 0L :" in src  # the clamped index
    body = src[src.index('extern "C" int64_t kernel') :]
    assert body.count("kiln_index_fail(&kiln_err") == 1
    assert body.index("kiln_index_fail(&kiln_err") < body.index("#pragma omp simd"), body


def test_library_op_whose_meta_dtype_differs_from_its_result():
    """prims.signbit says float32 on meta and returns bool: the wrapper casts the result
    to the meta's dtype, which kernels read it as (they read bool bytes as floats)."""
    from kiln_inductor.testing import check_compiled

    prims, aten = torch.ops.prims, torch.ops.aten

    def f(x, y):
        sign = aten._to_copy.default(prims.signbit.default(y), dtype=torch.bool)
        return (aten.where.self(sign, aten.neg.default(x), x),)

    compiled = check_compiled(f, [torch.randn(5), torch.tensor(-3.5)])
    assert "redtype" in compiled.wrapper_source
