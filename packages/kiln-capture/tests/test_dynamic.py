"""Dynamic shapes: symbolic input sizes, size arithmetic in the graph, shape guards,
automatic dynamic, mark_dynamic/mark_static, cache-limit warnings, explain."""

from __future__ import annotations

import logging
import operator
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln_capture
from kiln_capture import hook
from kiln_capture.config import config

SIZES = (5, 8, 13, 6, 17, 31)  # odd, even and prime lengths; the first sets the hints


def symbolic(t) -> bool:
    return isinstance(t, torch.Tensor) and any(
        isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride())
    )


class RecordingBackend:
    """Records each graph, checks the graph contract for symbolic sizes, runs it eagerly."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list] = []

    def __call__(self, gm, example_inputs):
        assert "shape_env" in gm.meta
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        assert len(placeholders) == len(example_inputs)
        for node, real in zip(placeholders, example_inputs):
            val = node.meta["val"]
            if isinstance(val, torch.SymInt):  # an int input that is a symbol
                env = gm.meta["shape_env"]
                assert type(real) is int and env.hint(_expr(val)) == real
                continue
            assert val.device.type == "meta" and val.dtype == real.dtype
            if symbolic(val):  # the symbols' hints are the example's sizes
                env = gm.meta["shape_env"]
                assert [env.hint(_expr(s)) for s in val.shape] == list(real.shape)
        for node in gm.graph.nodes:  # every size node carries its SymInt
            if node.op == "call_method" and node.target == "size":
                assert isinstance(node.meta["val"], torch.SymInt | int)
            if node.op == "call_function" and node.target in vars(operator).values():
                assert "val" in node.meta
        self.graphs.append(gm)
        self.example_inputs.append(example_inputs)
        return gm.forward

    def symbolic_inputs(self, i: int = 0) -> list[str]:
        gm = self.graphs[i]
        return [n.name for n in gm.graph.nodes if n.op == "placeholder" and symbolic(n.meta["val"])]


def _expr(s):
    from kiln_shapes import expr_of

    return expr_of(s)


def assert_same(got, want):
    if isinstance(want, torch.Tensor):
        assert got.shape == want.shape, (got.shape, want.shape)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    elif isinstance(want, tuple | list):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b)
    else:
        assert got == want and type(got) is type(want), (got, want)


# -- the programs: each takes x of shape (3, t, 16) and is called at every t in SIZES ---


def pointwise(x):
    return (x.sin() * 2 + x.cos()).relu() - x / 3


def softmax_over_time(x):
    return x.softmax(dim=1)


def layer_norm(x):
    return F.layer_norm(x, (x.shape[-1],))


def causal_attention(x):
    b, t, c = x.shape
    mask = torch.ones(t, t).tril()
    scores = (x @ x.transpose(1, 2)) / c**0.5
    scores = scores.masked_fill(mask == 0, float("-inf"))
    return scores.softmax(-1) @ x


def split_heads(x):
    b, t, c = x.shape
    h = 4
    q = x.view(b, t, h, c // h).transpose(1, 2)
    att = (q @ q.transpose(-2, -1)).softmax(-1)
    return (att @ q).transpose(1, 2).reshape(b, t, c)


def halves(x):
    half = x.shape[1] // 2
    first, second = x[:, :half], x[:, half:]
    return first.sum(1) * 2 + second.mean(1), torch.cat([second, first], dim=1)


def positions(x):
    t = x.size(-2)
    pos = torch.arange(t)
    return x + pos[None, :, None] * 0.5, x.new_zeros(x.shape[0], t) + pos


def size_as_number(x):
    b, t, c = x.shape
    scale = t * 2 + 1
    return x * scale / t + min(t, 4), scale


PROGRAMS = [
    pointwise,
    softmax_over_time,
    layer_norm,
    causal_attention,
    split_heads,
    halves,
    positions,
    size_as_number,
]


def run_at_sizes(fn, dynamic, sizes=SIZES):
    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=dynamic)(fn)
    torch.manual_seed(0)
    for t in sizes:
        x = torch.randn(3, t, 16)
        assert_same(compiled(x), fn(x))
    return backend


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_dynamic_true_builds_one_graph_for_every_size(fn):
    backend = run_at_sizes(fn, True)
    assert len(backend.graphs) == 1
    assert backend.symbolic_inputs() == ["x"]


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_automatic_dynamic_builds_at_most_two_graphs(fn):
    backend = run_at_sizes(fn, None)
    assert len(backend.graphs) <= 2
    assert backend.symbolic_inputs(0) == []  # the first compile specializes
    assert backend.symbolic_inputs(-1) == ["x"]


@pytest.mark.parametrize("fn", [pointwise, split_heads], ids=lambda f: f.__name__)
def test_dynamic_false_builds_one_graph_per_size(fn, monkeypatch):
    monkeypatch.setattr(config, "cache_size_limit", len(SIZES))
    backend = run_at_sizes(fn, False)
    assert len(backend.graphs) == len(SIZES)
    assert all(backend.symbolic_inputs(i) == [] for i in range(len(SIZES)))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))).log_softmax(-1)


def test_mlp_over_a_varying_batch_keeps_parameters_static():
    torch.manual_seed(0)
    model = MLP()
    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(model)
    for n in SIZES:
        x = torch.randn(n, 16)
        assert_same(compiled(x), model(x))
    assert len(backend.graphs) == 1
    (gm,) = backend.graphs
    params = [n for n in gm.graph.nodes if n.op == "placeholder" and "fc" in n.name]
    assert len(params) == 4 and not any(symbolic(p.meta["val"]) for p in params)
    assert backend.symbolic_inputs() == ["x"]


# -- the graph contract ------------------------------------------------------------------


def test_size_reads_and_arithmetic_are_graph_nodes_with_symints():
    backend = run_at_sizes(halves, True, sizes=(7, 10))
    gm = backend.graphs[0]
    size = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "size"]
    assert [n.args[1] for n in size] == [1]
    (div,) = [n for n in gm.graph.nodes if n.target is operator.floordiv]
    assert div.args == (size[0], 2)
    assert str(_expr(div.meta["val"])) == "FloorDiv(s1, 2)"
    env = gm.meta["shape_env"]
    assert [str(s) for s in env.symbols] == ["s0", "s1", "s2"]


def test_a_size_returned_from_the_frame_is_rebuilt_from_the_inputs():
    def f(x):
        return x.shape[0] * 3 - 1, x.size(1) / 2, x + 1

    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(f)
    for n in (4, 9):
        x = torch.randn(n, 5)
        assert_same(compiled(x), f(x))
    assert len(backend.graphs) == 1


def test_shapes_with_symbolic_sizes_are_python_values():
    def f(x):
        shape = (-1,) + x.shape[1:]
        n = x.shape.numel()
        return x.reshape(n).view(shape) * 2, shape, x.shape == (3, x.shape[1]), hasattr(n, "shape")

    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(f)
    for t in (5, 9):
        x = torch.randn(3, t, 4)
        assert_same(compiled(x), f(x))
    assert len(backend.graphs) == 1


def test_indexing_and_assigning_with_sizes_keeps_them_symbolic():
    lin = nn.Linear(4, 4)

    def f(x):
        b, t, c = x.shape
        last = x[:, t - 1]
        y = x.clone()
        y[:, : t // 2] = 0.0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = lin(x)
        return last, y, z.float(), x.new_empty(b, t).fill_(1.0), -t, abs(t - 100)

    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(f)
    for t in (5, 9, 14):
        x = torch.randn(3, t, 4)
        got, want = compiled(x), f(x)
        assert_same(got[:2] + got[3:], want[:2] + want[3:])
        torch.testing.assert_close(got[2], want[2], rtol=2e-2, atol=2e-2)
    assert len(backend.graphs) == 1


def test_sizes_0_and_1_stay_specialized():
    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(pointwise)
    for shape in [(1, 5, 16), (1, 7, 16), (1, 0, 16)]:
        x = torch.randn(shape)
        assert_same(compiled(x), pointwise(x))
    assert len(backend.graphs) == 2  # size 1 of dim 0 is static; size 0 compiles again
    val = next(n for n in backend.graphs[0].graph.nodes if n.op == "placeholder").meta["val"]
    assert val.shape[0] == 1 and isinstance(val.shape[1], torch.SymInt)


def test_non_dense_inputs_stay_static():
    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(pointwise)
    x = torch.randn(3, 9, 32)[..., ::2]
    assert_same(compiled(x), pointwise(x))
    assert backend.symbolic_inputs() == []


def test_transposed_inputs_keep_their_layout_symbolic():
    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(softmax_over_time)
    for t in (5, 11):
        x = torch.randn(3, 16, t).transpose(1, 2)  # dense, not contiguous
        assert_same(compiled(x), softmax_over_time(x))
    x = torch.randn(3, 7, 16)  # contiguous: another layout, another graph
    assert_same(compiled(x), softmax_over_time(x))
    assert len(backend.graphs) == 2


# -- branches on sizes -------------------------------------------------------------------


def branchy(x):
    t = x.shape[1]
    if t > 8:  # the guard's line
        return x.cumsum(1)
    return x * 2


def test_a_branch_on_a_size_guards_and_recompiles_when_it_flips():
    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(branchy)
    for t in (5, 7, 12, 20, 6):
        x = torch.randn(2, t)
        assert_same(compiled(x), branchy(x))
    assert len(backend.graphs) == 2
    assert kiln_capture.stats()["recompiles"] == 1
    lines = [
        g for e in hook.cache_entries(branchy.__code__) for g in e.guard_set.shapes.describe()[1]
    ]
    assert any(g.startswith("s1 <= 8") for g in lines) and any(
        g.startswith("s1 > 8") for g in lines
    )
    assert all("test_dynamic.py:" in g for g in lines)


def test_the_recompile_reason_names_the_failing_shape_guard(monkeypatch, caplog):
    monkeypatch.setattr(config, "log_topics", frozenset({"recompiles"}))
    caplog.set_level(logging.INFO, logger="kiln_capture")
    compiled = kiln_capture.optimize(RecordingBackend(), dynamic=True)(branchy)
    for t in (5, 12):
        x = torch.randn(2, t)
        assert_same(compiled(x), branchy(x))
    (reason,) = [r.getMessage() for r in caplog.records if "recompiling" in r.getMessage()]
    assert "guard failed: shape guard s1 <= 8 (at " in reason and "s1 = 12" in reason
    assert "test_dynamic.py" in reason


def test_int_and_range_of_a_size_specialize():
    def f(x):
        n = int(x.shape[0])
        out = x
        for i in range(x.shape[1]):
            out = out + i
        return out * n

    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(f)
    for shape in [(3, 4), (5, 4), (3, 4)]:
        x = torch.randn(shape)
        assert_same(compiled(x), f(x))
    assert len(backend.graphs) == 2


# -- mark_dynamic / mark_static ----------------------------------------------------------


def test_mark_dynamic_makes_a_dimension_symbolic_on_the_first_compile():
    for dynamic in (None, False):
        kiln_capture.reset()
        backend = RecordingBackend()
        compiled = kiln_capture.optimize(backend, dynamic=dynamic)(softmax_over_time)
        for t in SIZES:
            x = torch.randn(3, t, 16)
            kiln_capture.mark_dynamic(x, 1)
            assert_same(compiled(x), softmax_over_time(x))
        assert len(backend.graphs) == 1
        val = next(n for n in backend.graphs[0].graph.nodes if n.op == "placeholder").meta["val"]
        assert [isinstance(s, torch.SymInt) for s in val.shape] == [False, True, False]


def test_mark_dynamic_range_is_enforced_by_the_guard():
    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend)(pointwise)

    def call(t):
        x = torch.randn(2, t, 4)
        kiln_capture.mark_dynamic(x, 1, min=4, max=16)
        assert_same(compiled(x), pointwise(x))

    for t in (5, 16, 4, 9):
        call(t)
    assert len(backend.graphs) == 1
    call(17)  # outside the range: never the symbolic graph; a specialized one
    assert len(backend.graphs) == 2
    assert backend.symbolic_inputs(1) == [] and backend.example_inputs[1][0].shape[1] == 17
    call(3)
    assert len(backend.graphs) == 3
    env = backend.graphs[0].meta["shape_env"]
    (info,) = env.symbols.values()
    assert (info.lo, info.hi, info.declared) == (4, 16, True)


def test_mark_dynamic_range_under_fullgraph_raises():
    compiled = kiln_capture.optimize(RecordingBackend(), fullgraph=True)(pointwise)
    x = torch.randn(2, 8, 4)
    kiln_capture.mark_dynamic(x, 1, max=16)
    compiled(x)
    y = torch.randn(2, 20, 4)
    kiln_capture.mark_dynamic(y, 1, max=16)
    with pytest.raises(kiln_capture.DynamicShapeError, match=r"x.size\(1\) is 20, outside"):
        compiled(y)


def test_mark_dynamic_checks_its_arguments():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="min"):
        kiln_capture.mark_dynamic(x, 0, min=8, max=4)
    with pytest.raises(IndexError):
        kiln_capture.mark_dynamic(x, 2)
    kiln_capture.mark_dynamic(x, -1)
    assert x._kiln_dynamic_dims == {1: (None, None)}


def test_mark_static_wins_over_dynamic_true():
    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(softmax_over_time)
    for t in (5, 7):
        x = torch.randn(3, t, 16)
        kiln_capture.mark_static(x, 1)
        assert_same(compiled(x), softmax_over_time(x))
    assert len(backend.graphs) == 2
    val = next(n for n in backend.graphs[0].graph.nodes if n.op == "placeholder").meta["val"]
    assert [isinstance(s, torch.SymInt) for s in val.shape] == [True, False, True]


def test_optimize_rejects_a_dynamic_of_another_type():
    with pytest.raises(TypeError, match="dynamic"):
        kiln_capture.optimize(RecordingBackend(), dynamic="auto")


# -- recompiles are loud -----------------------------------------------------------------


def test_the_cache_limit_warns_once_with_the_failing_guard_and_the_fix(monkeypatch):
    monkeypatch.setattr(config, "cache_size_limit", 2)
    backend = RecordingBackend()

    def f(x, n):
        return x * n

    compiled = kiln_capture.optimize(backend)(f)
    x = torch.randn(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(5):
            torch.testing.assert_close(compiled(x, n), f(x, n))
    limit = [w for w in caught if "cache size limit" in str(w.message)]
    assert len(limit) == 1
    text = str(limit[0].message)
    assert "n == 1" in text and "dynamic=True" in text and "kiln.mark_dynamic" in text
    assert len(backend.graphs) == 2
    assert kiln_capture.stats()["cache_limit_hits"] == 1


def test_the_cache_limit_log_names_the_shape_guard(monkeypatch, caplog):
    monkeypatch.setattr(config, "cache_size_limit", 1)
    monkeypatch.setattr(config, "log_topics", frozenset({"recompiles"}))
    caplog.set_level(logging.INFO, logger="kiln_capture")
    compiled = kiln_capture.optimize(RecordingBackend(), dynamic=True)(branchy)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for t in (4, 12):
            x = torch.randn(2, t)
            assert_same(compiled(x), branchy(x))
    assert any("s1 <= 8" in r.getMessage() for r in caplog.records)


# -- explain -----------------------------------------------------------------------------


def test_explain_lists_symbols_and_shape_guards():
    x = torch.randn(2, 12)
    kiln_capture.mark_dynamic(x, 1, min=2, max=64)
    out = kiln_capture.explain(branchy, x)
    assert out.symbols == ["s0 in [2, 64] (hint 12) from x.size(1)"]
    (guard,) = out.shape_guards
    assert guard.startswith("s0 > 8  # ") and "test_dynamic.py:" in guard
    text = str(out)
    assert "--- symbols ---" in text and "--- shape guards ---" in text
    assert any("x: Tensor float32[2, s0]" in g for g in out.guards)


def test_the_guards_log_lists_symbols_and_shape_guards(monkeypatch, caplog):
    monkeypatch.setattr(config, "log_topics", frozenset({"guards"}))
    caplog.set_level(logging.INFO, logger="kiln_capture")
    compiled = kiln_capture.optimize(RecordingBackend(), dynamic=True)(branchy)
    compiled(torch.randn(2, 12))
    text = caplog.text
    assert "symbol s1 in [2, inf] (hint 12) from x.size(1)" in text
    assert "shape guard s1 > 8  # " in text


def test_explain_of_an_optimized_function_uses_its_dynamic_setting():
    compiled = kiln_capture.optimize(RecordingBackend(), dynamic=True)(halves)
    out = kiln_capture.explain(compiled, torch.randn(3, 7, 16))
    assert [s.split(" in ")[0] for s in out.symbols] == ["s0", "s1", "s2"]


# -- graph breaks and continuations ------------------------------------------------------


def with_break(x):
    t = x.shape[1]
    y = x.softmax(1) * t
    print("a graph break")
    return y[:, : t // 2].sum(1)


def test_graphs_after_a_break_are_symbolic_too(capsys):
    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(with_break)
    for t in (5, 9, 14, 20):
        x = torch.randn(3, t)
        assert_same(compiled(x), with_break(x))
    # the continuation gets t as an int equal to y.size(1): it stays that symbol
    assert len(backend.graphs) == 2 and kiln_capture.stats()["recompiles"] == 0
    assert all("shape_env" in gm.meta for gm in backend.graphs)
    assert backend.symbolic_inputs(0) == ["x"] and backend.symbolic_inputs(1) == ["y"]
    assert "size = y.size(1)" in backend.graphs[1].code


def test_a_size_after_a_break_with_no_tensor_of_its_size_is_an_int_input(capsys):
    """The continuation gets ``n`` (no tensor argument has it as a size) as an int input
    of its graph, bound to a symbol: one continuation graph serves every n."""

    def f(x):
        n = x.shape[1] * 2
        print("a graph break")
        return x[:, : n // 4] + 1

    backend = RecordingBackend()
    compiled = kiln_capture.optimize(backend, dynamic=True)(f)
    for t in (5, 9, 13):
        x = torch.randn(3, t)
        assert_same(compiled(x), f(x))
    assert len(backend.graphs) == 1  # the continuation (no op comes before the break)
    ints = [
        n
        for n in backend.graphs[0].graph.nodes
        if n.op == "placeholder" and isinstance(n.meta["val"], torch.SymInt)
    ]
    assert [n.meta["source"] for n in ints] == ["n"]


# -- the native shape check ----------------------------------------------------------------


def _broadcast_add(x, y, n):
    return x.transpose(1, 2) * y + n


def test_the_native_shape_check_agrees_with_the_generated_one():
    """Cache hits call the native ShapeBinder (a guard equating two symbols is one slot);
    on every input that must miss (dtype, device, requires_grad, rank, a constant size, a
    size two symbols share, layout, range, a remaining Python guard) it answers as the
    generated Python check does."""
    from kiln_capture.guards import ShapeBinder

    if ShapeBinder is None:
        pytest.skip("kiln-capture built without its native guards")
    backend = RecordingBackend()

    def f(x, y, n):
        if x.shape[1] > 3:  # a guard that stays in Python
            return _broadcast_add(x, y, n)
        return y

    compiled = kiln_capture.optimize(backend, dynamic=True)(f)
    x, y = torch.randn(4, 6, 5), torch.randn(4, 5, 6)
    assert_same(compiled(x, y, 3), f(x, y, 3))
    (entry,) = hook.cache_entries(f.__code__)
    shapes = entry.guard_set.shapes
    assert shapes.call is not shapes.fn
    assert "__k_bind" in shapes.call.__code__.co_names

    def agree(*args) -> bool:
        args = (*args, 3) if len(args) == 2 else args  # n: an int input, a symbol too
        native = shapes.call(*args) is None
        python = shapes.fn(*args) is None
        assert native == python, args
        return native

    assert agree(torch.randn(3, 9, 7), torch.randn(3, 7, 9))
    assert not agree(x.double(), y)  # dtype
    assert not agree(x.requires_grad_(), y)  # requires_grad
    x.requires_grad_(False)
    assert not agree(x[None], y)  # rank
    assert not agree(torch.randn(4, 6, 5), torch.randn(4, 5, 7))  # shared symbol differs
    assert not agree(torch.randn(4, 5, 6).transpose(1, 2), y)  # layout
    assert not agree(torch.randn(4, 6, 5)[:, :, :3].contiguous(), y)  # 3 against y
    assert not agree(torch.randn(4, 2, 5), torch.randn(4, 5, 2))  # s >= 2 holds; 2 > 3 fails
    assert not agree(torch.randn(4, 1, 5), torch.randn(4, 5, 1))  # a size-1 dimension
    assert agree(x, y, 7)  # n is symbolic under dynamic=True
    assert not agree(x, y, 3.0)  # not an int


def test_without_python_guards_cache_hits_call_the_native_check_alone():
    """Guards that only equate symbols (a broadcast of two inputs) live in the native
    slots: the hit path is one native call returning a bool, with no Python function."""
    from kiln_capture.guards import ShapeBinder

    if ShapeBinder is None:
        pytest.skip("kiln-capture built without its native guards")

    def f(x, y):
        return x * y + 1

    compiled = kiln_capture.optimize(RecordingBackend(), dynamic=True)(f)
    x, y = torch.randn(3, 7), torch.randn(3, 7)
    assert_same(compiled(x, y), f(x, y))
    (entry,) = hook.cache_entries(f.__code__)
    shapes = entry.guard_set.shapes
    assert not hasattr(shapes.call, "__code__")  # the native method itself
    assert shapes.call(torch.randn(4, 9), torch.randn(4, 9)) is True
    assert shapes.call(torch.randn(4, 9), torch.randn(4, 8)) is False  # the equated symbol
    assert shapes.fn(torch.randn(4, 9), torch.randn(4, 8)) is not None
    a, b = torch.randn(5, 2), torch.randn(5, 2)
    assert_same(compiled(a, b), f(a, b))
