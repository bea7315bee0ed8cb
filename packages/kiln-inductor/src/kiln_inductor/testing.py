"""Helpers for tests of kiln-inductor and its backends: ATen graphs without a tracer.

``aten_graph(fn, inputs)`` symbolically traces a function that calls ``torch.ops.aten.*``
overloads explicitly (DESIGN.md contract 3 form) and fills ``meta['val']`` by running it on
the meta device. ``check_compiled(fn, inputs)`` compiles such a graph and compares every
output with eager. ``channels_last_models()``: small convolution graphs (a ResNet block, a
ConvNeXt block, reductions over H, W and over C) for tests of the channels-last layout.
``record_compiled_graphs(monkeypatch)``: kernels and fallbacks of every graph compiled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.fx
import torch.nn.functional as F

from .compile import compile_aten_graph
from .passes import fill_meta


def record_compiled_graphs(monkeypatch: Any) -> list[tuple[int, list]]:
    """Every ATen graph kiln-inductor compiles from now on (``monkeypatch``: pytest's),
    as (kernels generated, fallback ops): a test of a compiler asserts with it that kernels
    were generated and no fallback was taken, which a graph run eagerly would not show."""
    from . import compile as inductor_compile

    seen: list[tuple[int, list]] = []
    inner = inductor_compile.compile_aten_graph

    def counting(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        compiled = inner(gm, example_inputs)
        seen.append((compiled.stats["kernels"], compiled.stats["fallbacks"]))
        return compiled

    monkeypatch.setattr(inductor_compile, "compile_aten_graph", counting)
    return seen


def aten_graph(fn: Callable[..., Any], inputs: Sequence[Any]) -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(fn)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, x in zip(placeholders, inputs):
        n.meta["val"] = x
    out = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(out.args[0], (tuple, list)):
        out.args = ((out.args[0],),)
    gm.recompile()
    fill_meta(gm)
    return gm


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flat(v)]
    return [x]


def check_compiled(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    rtol: float | None = None,
    atol: float | None = None,
) -> Any:
    """Compile ``fn`` (an ATen-op function), run it, assert it matches eager; returns the
    CompiledGraph."""
    gm = aten_graph(fn, inputs)
    compiled = compile_aten_graph(gm, inputs)
    expected = _flat(fn(*inputs))
    got = _flat(compiled(*inputs))
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        if isinstance(e, torch.Tensor):
            assert isinstance(g, torch.Tensor), (e, g)
            assert e.shape == g.shape, (e.shape, g.shape)
            assert e.dtype == g.dtype, (e.dtype, g.dtype)
            kw = {} if rtol is None else {"rtol": rtol, "atol": atol if atol is not None else rtol}
            torch.testing.assert_close(g, e, equal_nan=True, **kw)
        else:
            assert e == g
    return compiled


# -- channels-last graphs (KILN_CHANNELS_LAST): convolutions with the kernels between them --


class ConvBnReluAdd(torch.nn.Module):
    """conv → batch norm → relu → add → conv (a ResNet block's shape)."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        return self.conv2(torch.relu(self.bn(y)) + y)


class ConvNeXtBlock(torch.nn.Module):
    """depthwise conv → permute → layer_norm → linear → gelu → linear → permute → add."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = torch.nn.LayerNorm(c)
        self.fc1, self.fc2 = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.fc2(torch.nn.functional.gelu(self.fc1(y)))
        return x + y.permute(0, 3, 1, 2)


class ConvMeanHW(torch.nn.Module):
    """conv → relu → mean over (H, W) (a reduction over the spatial dims of NHWC)."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, 2 * c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)).mean((2, 3))


class ConvMeanC(torch.nn.Module):
    """conv → scale by the mean over C → conv (a reduction over the channels of NHWC)."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        return self.conv2(y * torch.sigmoid(y.mean(1, keepdim=True)))


def channels_last_models(c: int = 16) -> dict[str, torch.nn.Module]:
    """The channels-last test graphs, in eval mode, batch norm with non-trivial statistics;
    their input is (N, c, H, W)."""
    torch.manual_seed(0)
    models = {
        "conv_bn_relu_add": ConvBnReluAdd(c),
        "convnext_block": ConvNeXtBlock(c),
        "conv_mean_hw": ConvMeanHW(c),
        "conv_mean_c": ConvMeanC(c),
    }
    for m in models.values():
        m.eval()
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
    return models


class PreNormBlock(torch.nn.Module):
    """``x + fc2(gelu(fc1(layer_norm(x))))`` on (batch, tokens, width) activations: the
    normalized rows reach the matmul as a (batch * tokens, width) matrix, so the layer_norm's
    statistics and its output share a kernel only through split loops (scheduler/refine.py)."""

    def __init__(self, width: int = 48):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 4 * width)
        self.fc2 = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


# -- bad indices (index_check.py): every backend raises eager's error, then works again --


def _i64(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def bad_index_cases(device: str = "cpu") -> dict[str, tuple[Callable[..., Any], list, list]]:
    """``name -> (fn, good inputs, bad inputs)``: torch-level functions whose indirect
    accesses are lowered to generated kernels, with inputs eager accepts and inputs eager
    rejects (out of range at either end, ids of 10^8, indices eager does not wrap)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device)

    def ri(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=g).to(device)

    def put(y: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        y = y * 1
        y[i] = v
        return y

    x, w = r(4, 8), r(10, 16)
    full = torch.full((4, 3), 100000, device=device)
    return {
        "gather_past_end": (lambda x, i: torch.gather(x, 1, i) + 1, [x, ri(8, 4, 3)], [x, full]),
        "gather_negative": (
            lambda x, i: torch.gather(x, 1, i) * 2,
            [x, ri(8, 4, 3)],
            [x, -full.clamp(max=9)],
        ),
        "gather_minus_one": (
            lambda x, i: torch.gather(x, 1, i) * 2,
            [x, ri(8, 4, 3)],
            [x, full * 0 - 1],
        ),
        "index_past_end": (lambda x, i: x[i] * 2, [x, ri(4, 5)], [x, _i64(0, 1, 7).to(device)]),
        "index_negative_wraps_then_too_far": (
            lambda x, i: x[i] * 2,
            [x, _i64(-4, 3, -1).to(device)],
            [x, _i64(0, -5).to(device)],
        ),
        "index_dim1": (lambda x, i: x[:, i].exp(), [x, ri(8, 6)], [x, _i64(8).to(device)]),
        "index_two_tensors": (
            lambda x, i, j: x[i, j] + 1,
            [x, ri(4, 5), ri(8, 5)],
            [x, ri(4, 5), _i64(1, 2, 3, 4, 8).to(device)],
        ),
        "embedding_huge_id": (
            lambda i, w: F.embedding(i, w) * 2,
            [ri(10, 2, 3), w],
            [_i64(1, 10**8).to(device).view(1, 2), w],
        ),
        "embedding_negative_id": (
            lambda i, w: F.embedding(i, w) + 1,
            [ri(10, 2, 3), w],
            [_i64(-1, 2).to(device).view(1, 2), w],
        ),
        "index_select_past_end": (
            lambda x, i: torch.index_select(x, 1, i).sum(1),
            [x, ri(8, 5)],
            [x, _i64(2, 8).to(device)],
        ),
        "embedding_and_gather_fused": (
            lambda i, w, x: F.embedding(i, w) * 2 + torch.gather(x, 1, i)[..., None],
            [ri(10, 4, 5), w, r(4, 12)],
            [_i64(*([1] * 19 + [11])).to(device).view(4, 5), w, r(4, 12)],
        ),
        "index_put_past_end": (
            put,
            [r(6), _i64(1, 2).to(device), r(2)],
            [r(6), _i64(1, 9).to(device), r(2)],
        ),
        "index_put_accumulate_too_negative": (
            lambda y, i, v: torch.index_put(y * 2, (i,), v, accumulate=True),
            [r(6, 3), _i64(-6, 5, 5).to(device), r(3, 3)],
            [r(6, 3), _i64(0, -7).to(device), r(2, 3)],
        ),
        "scatter_add_past_end": (
            lambda y, i, v: torch.scatter_add(y, 1, i, v) + 1,
            [x, ri(8, 4, 3), r(4, 5)],
            [x, full.clamp(max=8), r(4, 5)],
        ),
        "scatter_negative": (
            lambda y, i: torch.scatter(y, 0, i, 2.0) * 3,
            [x, ri(4, 2, 8)],
            [x, -ri(4, 2, 8) - 1],
        ),
        "index_add_past_end": (
            lambda y, i, v: torch.index_add(y, 0, i, v).exp(),
            [x, ri(4, 6), r(6, 8)],
            [x, _i64(0, 1, 2, 3, 4, 1).to(device), r(6, 8)],
        ),
    }


def scatter_cases(device: str = "cpu") -> dict[str, tuple[Callable[..., Any], list, float]]:
    """``name -> (fn, inputs, tolerance)``: ATen-level graphs of the scatter-type ops
    (lowering/scatter.py) on random inputs: duplicate and negative indices, indices over
    one dimension and over several, broadcast values, non-contiguous operands (``t``,
    ``permute``, ``slice`` inside the graph), every mode, 16-bit floats (summed in
    float32) and 8-bit ints (wrapping as eager's do). ``tolerance`` is rtol and atol
    (0: torch's defaults)."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)

    def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    def ri(low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=g).to(device)

    def rows_of_distinct(n: int, rows: int, k: int) -> torch.Tensor:
        return torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(rows)]).to(device)

    def ebwd(pad: int = -1, freq: bool = False) -> Callable[..., Any]:
        return lambda gr, i: aten.embedding_dense_backward.default(gr, i, 10, pad, freq)

    def put(acc: bool) -> Callable[..., Any]:
        return lambda x, i, v: aten.index_put.default(x, [i], v, acc)

    b16, f16, i8 = torch.bfloat16, torch.float16, torch.int8
    return {
        "index_put_accumulate_duplicates_negative": (
            put(True),
            [r(6, 3), ri(-6, 6, 40), r(40, 3)],
            0,
        ),
        "index_put_store_distinct_negative": (
            put(False),
            [r(6, 3), torch.randperm(6, generator=g)[:4].to(device) - 3, r(4, 3)],
            0,
        ),
        "index_put_broadcast_value": (put(True), [r(6, 3), ri(-6, 6, 9), r(3)], 0),
        "index_put_dim1": (
            lambda x, i, v: aten.index_put.default(x, [None, i], v, True),
            [r(5, 7, 2), ri(-7, 7, 3, 4), r(5, 3, 4, 2)],
            0,
        ),
        "index_put_split_indices": (
            lambda x, i, j, v: aten.index_put.default(x, [i, None, j], v, True),
            [r(5, 3, 7), ri(0, 5, 4), ri(-7, 7, 4), r(4, 3)],
            0,
        ),
        "index_put_noncontiguous": (
            lambda x, i, v: aten.index_put.default(
                aten.t.default(x), [i], aten.permute.default(v, [1, 0]), True
            ),
            [r(3, 6), ri(0, 6, 20), r(3, 20)],
            0,
        ),
        "index_put_bf16_accumulate": (
            put(True),
            [r(6, 3, dtype=b16), ri(0, 6, 30), r(30, 3, dtype=b16)],
            2e-2,
        ),
        "index_put_int8_wraps": (
            put(True),
            [ri(-100, 100, 6, 3).to(i8), ri(0, 6, 30), ri(-100, 100, 30, 3).to(i8)],
            0,
        ),
        "scatter_add_dim1_small_index": (
            lambda x, i, s: aten.scatter_add.default(x, 1, i, s),
            [r(4, 8), ri(0, 8, 3, 12), r(4, 13)],
            0,
        ),
        "scatter_add_dim0_noncontiguous": (
            lambda x, i, s: aten.scatter_add.default(
                x, 0, i, aten.slice.Tensor(aten.t.default(s), 1, 1, 7)
            ),
            [r(4, 6), ri(0, 4, 7, 6), r(8, 7)],
            0,
        ),
        "scatter_src_distinct": (
            lambda x, i, s: aten.scatter.src(x, 1, i, s),
            [r(4, 8), rows_of_distinct(8, 4, 5), r(4, 5)],
            0,
        ),
        "scatter_value": (
            lambda x, i: aten.scatter.value(x, 0, i, -1.5),
            [r(5, 4), ri(0, 5, 3, 4)],
            0,
        ),
        "scatter_reduce_add": (
            lambda x, i, s: aten.scatter.reduce(x, 0, i, s, reduce="add"),
            [r(5, 4), ri(0, 5, 6, 4), r(6, 4)],
            0,
        ),
        "scatter_reduce_sum_exclude_self": (
            lambda x, i, s: aten.scatter_reduce.two(x, 0, i, s, "sum", include_self=False),
            [r(7), ri(0, 7, 12), r(12)],
            0,
        ),
        "index_add_alpha": (
            lambda x, i, s: aten.index_add.default(x, 0, i, s, alpha=-2),
            [r(6, 3), ri(0, 6, 10), r(10, 3)],
            0,
        ),
        "index_add_dim1_int32": (
            lambda x, i, s: aten.index_add.default(x, 1, i, s),
            [ri(-9, 9, 6, 3).int(), ri(0, 3, 10), ri(-9, 9, 6, 10).int()],
            0,
        ),
        "index_add_and_scatter_add_0d": (
            lambda x, i, s, j: (
                aten.index_add.default(x, 0, i, s, alpha=3),
                aten.scatter_add.default(x, 0, j, s),
            ),
            [r(1).view(()), ri(0, 1, 1), r(1).view(()), ri(0, 1, 1).view(())],
            0,
        ),
        "embedding_dense_backward": (ebwd(), [r(4, 5, 16), ri(0, 10, 4, 5)], 0),
        "embedding_dense_backward_padding": (ebwd(3), [r(4, 5, 16), ri(0, 10, 4, 5)], 0),
        "embedding_dense_backward_scale_by_freq": (
            ebwd(2, True),
            [r(4, 5, 16), ri(0, 10, 4, 5)],
            1e-5,
        ),
        "embedding_dense_backward_bf16": (ebwd(), [r(6, 16, dtype=b16), ri(0, 10, 6)], 2e-2),
        "embedding_dense_backward_f16": (ebwd(), [r(6, 16, dtype=f16), ri(0, 10, 6)], 2e-3),
    }


class Gather(torch.nn.Module):
    """Weights read through ``F.embedding`` and advanced indexing: their gradients are
    ``embedding_dense_backward`` and ``index_put(accumulate=True)``."""

    def __init__(self, padding_idx: int | None = None, scale_grad_by_freq: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(
            12, 8, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq
        )
        self.table = torch.nn.Parameter(torch.randn(9, 8))

    def forward(self, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        e = self.emb(ids)  # (B, T, 8)
        t = self.table[rows]  # (B, T, 8), rows may be negative
        return (e * t.tanh()).sum(-1)


def check_scatter_training(module: torch.nn.Module, ids: torch.Tensor, rows: torch.Tensor) -> list:
    """Compile ``module`` for training (kiln_aot + the registered backend), assert its
    output and its parameters' gradients match eager's, and return the compiled graphs
    (for the caller to check that no graph calls a library op)."""
    import copy

    from .compile import compile_fx

    ref = copy.deepcopy(module)
    graphs: list = []

    def record(gm: torch.fx.GraphModule, inputs: list) -> Any:
        graphs.append(compile_aten_graph(gm, inputs))
        return graphs[-1]

    compiled = compile_fx(module, [ids, rows], compile_graph=record)
    out = compiled(ids, rows)
    out = out[0] if isinstance(out, (tuple, list)) else out
    want = ref(ids, rows)
    torch.testing.assert_close(out, want)
    weight = torch.linspace(-1, 1, want.numel()).view(want.shape).to(want.device)
    (out * weight).sum().backward()
    (want * weight).sum().backward()
    for (name, p), q in zip(module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)
    return graphs


def check_bad_index_cases(
    names: Sequence[str] | None = None, device: str = "cpu"
) -> dict[str, list]:
    """Compile each case of ``bad_index_cases`` with kiln_aot + compile_aten_graph (the
    backend registered for the device), and assert: the good inputs match eager; the bad
    ones raise the exception type eager raises (never a result, never a crash); the good
    inputs match eager again afterwards. Returns each case's compiled graphs, whose stats
    the caller may check (kernels generated, no fallbacks)."""
    return {
        name: _check_bad_index_case(name, *case)
        for name, case in bad_index_cases(device).items()
        if names is None or name in names
    }


def _check_bad_index_case(name: str, fn: Callable[..., Any], good: list, bad: list) -> list:
    from .compile import compile_fx

    graphs: list = []

    def record(gm: torch.fx.GraphModule, inputs: list) -> Any:
        compiled = compile_aten_graph(gm, inputs)
        graphs.append(compiled)
        return compiled

    def same(got: Any, when: str) -> None:
        torch.testing.assert_close(got, fn(*good), msg=lambda m: f"{name} {when}: {m}")

    compiled = compile_fx(fn, good, compile_graph=record)
    same(compiled(*good), "before")
    try:
        # on the CPU: eager's CUDA kernels answer a bad index with a device-side assert,
        # which ends the process's use of the device; the CPU's exception is the one kiln
        # raises on every device
        fn(*[x.cpu() if isinstance(x, torch.Tensor) else x for x in bad])
    except Exception as e:  # the type eager raises is what we compare
        want = type(e)
    else:
        raise AssertionError(f"{name}: eager accepts the bad inputs")
    try:
        got = compiled(*bad)
    except want:
        pass
    else:
        raise AssertionError(f"{name}: kiln returned {got} where eager raises {want.__name__}")
    same(compiled(*good), "after the bad call")
    return graphs


def symbolic_graph(
    fn: Callable[..., Any],
    examples: Sequence[torch.Tensor],
    dynamic: Sequence[Sequence[int]],
    ranges: Sequence[Any] | None = None,
) -> tuple[torch.fx.GraphModule, Any]:
    """``fn`` as an FX graph whose inputs have the dims in ``dynamic[i]`` symbolic (with
    the declared ``ranges[i]``: ``{dim: (min, max)}``, if given), as kiln-capture hands
    graphs to a backend: placeholders' ``meta["val"]`` carry kiln-shapes sizes."""
    from kiln_shapes import ShapeEnv

    gm = torch.fx.symbolic_trace(fn)
    env = ShapeEnv()
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (ph, x) in enumerate(zip(phs, examples)):
        declared = ranges[i] if ranges else None
        ph.meta["val"] = env.symbolic_tensor(x, f"L['arg{i}']", dynamic[i], declared)
    gm.meta["shape_env"] = env
    return gm, env


class SymbolicProgram(NamedTuple):
    fn: Callable[..., Any]
    inputs: Callable[[int, int], tuple]  # (b, t) -> random inputs
    dims: list[list[int]]  # the symbolic dims of each input (symbolic_graph's ``dynamic``)


def symbolic_programs() -> dict[str, SymbolicProgram]:
    """Programs each backend's dynamic-shape tests compile once and run at every size:
    pointwise ops, softmax and layer_norm over varying dims; an MLP over a varying batch;
    sizes used in views, slices, masks and positions (fresh random weights per call)."""
    w = torch.randn(32)
    w1, w2 = torch.randn(64, 32), torch.randn(16, 64)

    def norms(x, y):
        a = F.layer_norm(x.sin() * y + 1, (32,), w)
        return a.softmax(-1), x.softmax(1), a.sum(1)

    def mlp(x):
        return F.linear(F.gelu(x @ w1.t()), w2)

    def views(x):
        b, t = x.shape[0], x.shape[1]
        heads = x.view(b, t, 4, 8).transpose(1, 2)  # split heads
        mask = torch.ones((t, t)).tril()
        scores = (heads @ heads.transpose(-1, -2)).masked_fill(mask == 0, float("-inf"))
        pos = torch.arange(t).float() / t  # the size as a number too
        half = x[:, : t // 2]
        return scores.softmax(-1), x + pos[None, :, None], half * 2, torch.cat([x, half], 1)

    return {
        "norms": SymbolicProgram(
            norms, lambda b, t: (torch.randn(b, t, 32), torch.randn(b, t, 32)), [[0, 1], [0, 1]]
        ),
        "mlp": SymbolicProgram(mlp, lambda b, t: (torch.randn(b * t, 32),), [[0]]),
        "views": SymbolicProgram(views, lambda b, t: (torch.randn(b, t, 32),), [[0, 1]]),
    }


def check_symbolic_training(
    sizes: Sequence[tuple[int, int]], tol: dict, context: Callable[[], Any] = contextlib.nullcontext
) -> None:
    """A Linear + silu + softmax block compiled once with symbolic (batch, length) under
    ``context`` (a backend's), then trained at every size: the loss, the input's and the
    parameters' gradients equal eager's, with one forward and one backward graph."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            return (F.silu(self.lin(x)) * x).softmax(-1).sum()

    torch.manual_seed(0)
    fn = Block()
    first = torch.randn(3, 5, 16, requires_grad=True)
    gm, _ = symbolic_graph(fn, [first], [[0, 1]])
    counting = CountingCompiler()
    with context():
        from . import compile_fx

        compiled = compile_fx(gm, [first], compile_graph=counting)
        for b, t in sizes:
            x = torch.randn(b, t, 16, requires_grad=True)
            x2 = x.detach().clone().requires_grad_(True)
            out = compiled(x)
            out.backward()
            grads = [p.grad.clone() for p in fn.parameters()]
            fn.zero_grad()
            want = fn(x2)
            want.backward()
            torch.testing.assert_close(out, want, **tol)
            torch.testing.assert_close(x.grad, x2.grad, **tol)
            for got, p in zip(grads, fn.parameters(), strict=True):
                torch.testing.assert_close(got, p.grad, **tol)
            fn.zero_grad()
    assert len(counting.graphs) == 2  # one forward and one backward graph for every size


class CountingCompiler:
    """A ``compile_graph`` for ``compile_fx`` that keeps every compiled ATen graph and
    asserts each generated kernels and fell back on no op."""

    def __init__(self) -> None:
        self.graphs: list[Any] = []

    def __call__(self, gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        compiled = compile_aten_graph(gm, inputs)
        assert compiled.stats["fallbacks"] == [], compiled.stats["fallbacks"]
        assert compiled.stats["kernels"] >= 1
        self.graphs.append(compiled)
        return compiled
