"""Generated kernels compile for a Hopper GPU (sm_90) with Triton's real compiler, on a
machine without a GPU: catches what the interpreter accepts but the compiler rejects
(types of loop-carried accumulators, libdevice calls, int64 literals), and checks that
contiguous loads are vectorized."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from batch import make

from kiln_inductor.graph import GraphLowering
from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
from kiln_inductor.testing import aten_graph
from kiln_triton.backend import TritonBackend
from kiln_triton.config import settings_scope

aten = torch.ops.aten
HERE = os.path.dirname(__file__)


def _sources(fn, inputs, persistent_max=8192):
    ir = GraphLowering(aten_graph(fn, inputs), inputs).run()
    with settings_scope(persistent_max=persistent_max):
        return [
            TritonBackend().codegen_kernel(g, ir.buffers)
            for g in fuse_nodes(ir)
            if isinstance(g, FusedGroup)
        ]


def _representative() -> list:
    bf, f32 = torch.bfloat16, torch.float32
    x = make((64, 1024), bf)
    w = make((1024,), bf)
    out = []
    out += _sources(lambda t: (aten.mul.Tensor(aten.tanh.default(t), 2),), [make((4096,), f32)])
    out += _sources(lambda t: (aten._softmax.default(t, -1, False),), [x])
    out += _sources(lambda t, ww: aten.native_layer_norm.default(t, [1024], ww, ww, 1e-5), [x, w])
    out += _sources(
        lambda t: aten.var_mean.correction(t, [1], correction=1), [make((8, 5000), f32)], 256
    )
    out += _sources(
        lambda t: (aten.argmax.default(t, 1), aten.amax.default(t, [1])),
        [make((8, 5000), f32)],
        256,
    )
    out += _sources(lambda t: (aten.sum.dim_IntList(t, [1]),), [make((8, 300), torch.int64)])
    return out


def _compile_for_sm90(sources, tmp_path) -> list[dict]:
    path = tmp_path / "kernels.json"
    plain = [{k: v for k, v in s.meta.items() if k not in ("extern", "epilogue")} for s in sources]
    path.write_text(json.dumps([{"source": s.source, "meta": m} for s, m in zip(sources, plain)]))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "compile_for_gpu.py"), str(path), "90"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(sources)
    return reports


def _template_sources(monkeypatch) -> list:
    """Matmul templates as the GPU gets them (not the interpreter's variant)."""
    from kiln_inductor.scheduler.templates import TemplateGroup, fuse_templates

    bf = torch.bfloat16
    x, w, b = make((256, 192), bf), make((384, 192), bf), make((384,), bf)
    a, c = make((4, 64, 96), torch.float32), make((4, 96, 80), torch.float32)
    graphs = [
        (
            lambda x, w, b: (aten.gelu.default(aten.addmm.default(b, x, aten.t.default(w))),),
            [x, w, b],
        ),
        (lambda a, c: (aten.relu.default(aten.bmm.default(a, c)),), [a, c]),
    ]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = []
    for fn, inputs in graphs:
        ir = GraphLowering(aten_graph(fn, inputs), inputs).run()
        steps = fuse_templates(fuse_nodes(ir), ir, lambda *_: True)
        groups = [g for g in steps if isinstance(g, TemplateGroup)]
        assert len(groups) == 1
        out.append(TritonBackend().codegen_kernel(groups[0], ir.buffers))
    return out


@pytest.mark.skipif(sys.platform != "linux", reason="Triton's CUDA compiler ships for Linux")
def test_matmul_templates_compile_for_sm90_with_tensor_core_instructions(tmp_path, monkeypatch):
    sources = _template_sources(monkeypatch)
    reports = _compile_for_sm90(sources, tmp_path)
    for src, rep in zip(sources, reports):
        assert "error" not in rep, f"{rep['error']}\n{src.source}"
        assert rep["configs"], rep
    # bfloat16 products use the tensor cores (wgmma/mma); the float32 one multiplies in IEEE
    # float32 (as cuBLAS does unless TF32 is allowed), which the tensor cores cannot
    assert all(c["mma"] > 0 for c in reports[0]["configs"]), reports[0]


@pytest.mark.skipif(sys.platform != "linux", reason="Triton's CUDA compiler ships for Linux")
def test_kernels_compile_for_sm90_and_vectorize(tmp_path):
    sources = _representative()
    reports = _compile_for_sm90(sources, tmp_path)
    for src, rep in zip(sources, reports):
        assert "error" not in rep, f"{rep['error']}\n{src.source}"
        assert rep["configs"]
    # the 1-D pointwise and the persistent bf16 softmax load 16 bytes at a time
    assert all(c["vector_loads"] > 0 for r in reports[:2] for c in r["configs"])


def test_wide_float32_rows_loop_with_eviction_hints():
    """float32 rows of 16 KiB are reduced in a loop (faster than persistent on the H200):
    the rows' loads before the last loop keep them in L2, the last read streams them, and
    the weights every row reads stay; bfloat16 rows of the same length stay persistent."""
    ln = lambda t, ww: (aten.native_layer_norm.default(t, [4096], ww, ww, 1e-5)[0],)
    f32, bf16 = torch.float32, torch.bfloat16
    (src,) = _sources(ln, [make((8, 4096), f32), make((4096,), f32)])
    assert src.meta["kind"] == "looped"
    loads = [line.strip() for line in src.source.splitlines() if "tl.load(" in line]
    rows = [ld for ld in loads if ld.split("tl.load(")[1].startswith("in_ptr0")]
    assert all('"evict_last"' in ld for ld in rows[:-1]) and '"evict_first"' in rows[-1]
    assert all('"evict_last"' in ld for ld in loads if "in_ptr1" in ld)
    (src,) = _sources(ln, [make((8, 4096), bf16), make((4096,), bf16)])
    assert src.meta["kind"] == "persistent" and "eviction_policy" not in src.source


def _symbolic_sources() -> list:
    """Kernels of graphs with symbolic sizes (kiln_shapes symbols in the layouts)."""
    from symbolic import symbolic_graph

    from kiln_aot import aot_graph

    graphs = [
        (lambda x: (x.sin() * 2,), [make((6, 32), torch.float32)], [[0]]),
        (lambda x: (x * 2,), [make((6, 5), torch.float32)], [[0, 1]]),
        (lambda x: (x.softmax(-1),), [make((6, 64), torch.bfloat16)], [[0]]),
        (lambda x: (x.sum(-1), x.var(-1)), [make((6, 50), torch.float32)], [[0, 1]]),
    ]
    out = []
    for fn, inputs, dynamic in graphs:
        gm, _ = symbolic_graph(fn, inputs, dynamic)

        def compile_graph(aten_gm, example_inputs):
            ir = GraphLowering(aten_gm, example_inputs).run()
            groups = [g for g in fuse_nodes(ir) if isinstance(g, FusedGroup)]
            out.extend(TritonBackend().codegen_kernel(g, ir.buffers) for g in groups)
            return lambda *args: None

        aot_graph(gm, inputs, fw_compiler=compile_graph, bw_compiler=compile_graph)
    return out


@pytest.mark.skipif(sys.platform != "linux", reason="Triton's CUDA compiler ships for Linux")
def test_symbolic_kernels_compile_for_sm90_at_every_specialization_of_their_sizes(tmp_path):
    """Sizes are int arguments Triton specializes by value: 1 (a constant), int32 with or
    without divisibility by 16, int64. Each compiles; contiguous loads stay 16 bytes wide
    where the extent is a known multiple of the vector (32 * s0, rows of 64), or where
    Triton learns that the sizes are multiples of 16 (the int64 widening keeps that)."""
    sources = _symbolic_sources()
    assert all(src.size_args for src in sources)
    specs = {"odd": 4095, "one": 1, "multiple of 16": 4096, "int64": 2**31 + 1, "short": 77}
    entries = [
        (src, name, [v] * len(src.size_args)) for src in sources for name, v in specs.items()
    ]
    path = tmp_path / "kernels.json"
    plain = [{k: v for k, v in s.meta.items() if k != "index_checks"} for s, _, _ in entries]
    path.write_text(
        json.dumps(
            [{"source": s.source, "meta": m, "sizes": v} for (s, _, v), m in zip(entries, plain)]
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "compile_for_gpu.py"), str(path), "90"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(entries)
    vectorized = {}
    kinds = {}
    for (src, name, _), rep in zip(entries, reports):
        kinds[(src.source, name)] = rep["kind"]
        assert "error" not in rep, f"{name}: {rep['error']}\n{src.source}"
        assert rep["configs"], rep
        vectorized[(src.source, name)] = all(c["vector_loads"] > 0 for c in rep["configs"])
    flat32, flat, softmax, rows = (src.source for src in sources[:4])
    assert all(vectorized[(k, name)] for k in (flat32, softmax) for name in specs if name != "one")
    # as for static sizes: odd extents mask lanes one by one, multiples of 16 load vectors
    assert vectorized[(flat, "multiple of 16")] and vectorized[(rows, "multiple of 16")]
    assert not vectorized[(flat, "odd")] and not vectorized[(rows, "odd")]
    # rows of symbolic length: 77 (bucket 128) run the module's persistent kernel, 4095 loop
    assert kinds[(rows, "short")] == "persistent" and kinds[(rows, "odd")] == "looped"
