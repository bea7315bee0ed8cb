"""Data-dependent values as graph values (issue #17): ``.item()``, ``nonzero``, boolean
masks, ``masked_select``, ``unique``, ``allclose``/``equal`` compile into the graph with
sizes (or values) that are unbacked symbols of kiln-shapes; kiln-inductor's wrapper runs the
op as a library call and binds the symbol from its result, so kernels after it run in the
same graph. Each case: a graph built, kernels generated, no eager frame, no fallback, and
the result equal to eager's; the programs run at two data patterns of one shape (another
output length) without recompiling."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln_inductor.testing import record_compiled_graphs


@pytest.fixture
def aten_graphs(monkeypatch):
    """Every ATen graph kiln-inductor compiles: (kernels, fallback ops)."""
    return record_compiled_graphs(monkeypatch)


def _data(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _check(fn, *args, graphs: int = 1, breaks: int = 0):
    kiln.reset()
    compiled = kiln.compile(fn)
    got, want = compiled(*args), fn(*args)
    torch.testing.assert_close(got, want)
    stats = kiln.stats()
    assert stats["graphs"] == graphs and stats["breaks"] == breaks, stats
    assert stats["fallbacks"] == 0 and stats["eager_frames"] == 0, stats
    return compiled


# each family alone, then a kernel after it (the family's output feeds generated code)
FAMILIES = {
    "item": lambda x: x.amax().item(),
    "item_times_tensor": lambda x: x * x[0, 0].item(),
    "item_of_input": lambda x: x[1:2, 1:2].contiguous().item(),
    "float_of_tensor": lambda x: x + float(x.max()),
    "int_of_tensor": lambda x: x * int(x.argmax()),
    "nonzero": lambda x: torch.nonzero(x > 0) * 2,
    "argwhere": lambda x: torch.argwhere(x > 0.5) + 1,
    "masked_select": lambda x: torch.masked_select(x, x < 0).exp(),
    "bool_mask": lambda x: x[x > 0].sin(),
    "bool_mask_rows": lambda x: x[x[:, 0] > 0] * 3,
    "unique": lambda x: torch.unique((x * 2).round(), return_counts=True),
    "unique_consecutive": lambda x: torch.unique_consecutive((x * 2).round().sort().values),
    "allclose": lambda x: torch.allclose(x, x + 1e-9),
    "allclose_false": lambda x: torch.allclose(x, x + 1),
    "equal": lambda x: torch.equal(x, x * 1),
    "histc": lambda x: torch.histc(x, bins=5, min=-2, max=2) + 1,
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_compiles_with_kernels(name, aten_graphs):
    fn = FAMILIES[name]
    _check(fn, _data(0, 6, 5))
    # library calls that are not data-dependent ops: histc's, the sort before unique_consecutive
    library = {"aten.histc.default", "aten.sort.default"}
    assert aten_graphs and all(set(f) <= library for _, f in aten_graphs), aten_graphs
    if name not in ("item", "item_of_input", "allclose", "allclose_false", "equal", "histc"):
        assert all(kernels > 0 for kernels, _ in aten_graphs), aten_graphs


def masked_mean(x):
    y = x[x > 0] * 2 + 1
    return y.sum() / x.numel()


def scaled(x, t):
    return x * t.item()


def nonzero_mean(m):
    return torch.nonzero(m).float().mean(0)


@pytest.mark.parametrize(
    "fn, make",
    [
        (masked_mean, lambda seed: (_data(seed, 7, 5),)),
        (scaled, lambda seed: (_data(seed, 4, 3), _data(seed + 10, ()))),
        (nonzero_mean, lambda seed: (_data(seed, 5, 4) > seed - 1.5,)),
    ],
    ids=["masked_mean", "x_times_item", "nonzero_mean"],
)
def test_another_data_pattern_reuses_the_graph(fn, make, aten_graphs):
    """Two inputs of one shape, different data (another count of selected elements): one
    compile, both results right."""
    first, second = make(1), make(2)
    if fn is masked_mean:  # the selected counts differ
        assert (first[0] > 0).sum() != (second[0] > 0).sum()
    if fn is nonzero_mean:
        assert first[0].sum() != second[0].sum()
    compiled = _check(fn, *first)
    torch.testing.assert_close(compiled(*second), fn(*second))
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["recompiles"] == 0, stats
    assert len(aten_graphs) == 1 and aten_graphs[0][0] > 0 and not aten_graphs[0][1]


def test_an_empty_selection_runs_in_the_same_graph():
    compiled = _check(masked_mean, _data(3, 7, 5))
    x = -_data(3, 7, 5).abs() - 1  # nothing selected this time
    torch.testing.assert_close(compiled(x), masked_mean(x))
    assert kiln.stats()["recompiles"] == 0


def branch_on_item(x):
    y = x * 2
    if y.sum().item() > 0:
        return y + 1
    return y - 1


def test_a_branch_on_item_breaks_there_with_the_graph_before_compiled():
    compiled = _check(branch_on_item, _data(4, 3, 3), graphs=2, breaks=1)
    explained = kiln.explain(branch_on_item, _data(4, 3, 3))
    assert "depends on tensor data" in str(explained)
    for seed in (5, 6, 7):  # both branches, from the same graphs
        x = _data(seed, 3, 3)
        torch.testing.assert_close(compiled(x), branch_on_item(x))


def test_mixed_program():
    def f(x, t):
        picked = x[x.abs() > 0.5]
        scale = t.item()
        rows = torch.nonzero(x > 0)
        return picked.sum() * scale + rows.float().mean(), torch.allclose(x, x * 1.0)

    _check(f, _data(8, 6, 4), _data(9, ()))


def test_training_through_a_boolean_mask(aten_graphs):
    """The backward of x[mask] is an index_put(accumulate) by the mask's nonzero columns,
    its sizes read from the saved indices; two data patterns, one compile."""
    w = torch.nn.Parameter(_data(10, 6, 4))

    def loss_fn(x):
        return (x[x > 0] * w[x > 0]).sum() + (w * t_item(x)).sum()

    def t_item(x):
        return x.abs().max().item()

    kiln.reset()
    compiled = kiln.compile(loss_fn)
    for seed in (11, 12):
        x = _data(seed, 6, 4)
        loss = compiled(x)
        loss.backward()
        got = w.grad.clone()
        w.grad = None
        want_loss = loss_fn(x)
        want_loss.backward()
        torch.testing.assert_close(loss, want_loss)
        torch.testing.assert_close(got, w.grad)
        w.grad = None
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["fallbacks"] == 0 and stats["eager_frames"] == 0
    assert stats["recompiles"] == 0, stats
    assert aten_graphs and all(k > 0 and not f for k, f in aten_graphs), aten_graphs


# ops that branch on their data inside (a check, a negative start): the capture takes the
# side where the branch does nothing (or the other, when that side raises) and kiln-aot
# asserts it when the graph runs (kiln_shapes.ShapeEnv.speculating)
INNER_BRANCHES = {
    "cov": lambda x: torch.cov(x),
    "cov_aweights": lambda x: torch.cov(x, aweights=x[0].abs() + 0.5),
    "corrcoef": lambda x: torch.corrcoef(x),
    "gaussian_nll_loss": lambda x: torch.nn.functional.gaussian_nll_loss(
        x, x.flip(0), x.abs() + 0.1
    ),
    "narrow_tensor_start": lambda x: x.narrow(0, (x[:, 0] > 0).sum(), 1) * 2,
    "tensor_split_tensor": lambda x: [
        p.sum(0) for p in torch.tensor_split(x, torch.tensor([1, 3]))
    ],
    "histogramdd": lambda x: torch.histogramdd(x[:, :2], bins=[3, 4]).hist + 1,
}


@pytest.mark.parametrize("name", sorted(INNER_BRANCHES))
def test_a_branch_inside_an_op_compiles_with_a_run_time_check(name, aten_graphs):
    fn = INNER_BRANCHES[name]
    compiled = _check(fn, _data(12, 6, 5))
    x = _data(13, 6, 5)  # other data, the same graph
    torch.testing.assert_close(compiled(x), fn(x))
    assert kiln.stats()["recompiles"] == 0
    library = {"aten.histc.default", "aten._histogramdd_bin_edges.default"}
    library |= {"aten._histogramdd_from_bin_cts.default", "aten._linalg_eigh.default"}
    assert aten_graphs and all(k > 0 and set(f) <= library for k, f in aten_graphs), aten_graphs


def test_the_other_side_of_a_compiled_branch_runs_the_graph_eagerly():
    """A call whose data takes the side the graph did not assume runs the captured graph
    eagerly (warned, counted): eager's own error for cov's negative weights, eager's result
    for narrow's negative tensor start; the next call with ordinary data is compiled."""

    def f(x, w):
        return torch.cov(x, aweights=w)

    x, w = _data(14, 3, 5), _data(15, 5).abs() + 0.1
    compiled = _check(f, x, w)
    bad = -w
    with pytest.raises(RuntimeError, match="aweights cannot be negative"):
        f(x, bad)
    with pytest.warns(UserWarning, match="kiln: compiled assuming"):
        with pytest.raises(RuntimeError, match="aweights cannot be negative"):
            compiled(x, bad)
    assert kiln.stats()["eager_frames"] == 1

    def g(x, start):
        return x.narrow(0, start, 2) * 2

    x = _data(16, 6, 3)
    compiled = _check(g, x, torch.tensor(1))
    with pytest.warns(UserWarning, match="ran eagerly"):
        torch.testing.assert_close(compiled(x, torch.tensor(-3)), g(x, torch.tensor(-3)))
    torch.testing.assert_close(compiled(x, torch.tensor(3)), g(x, torch.tensor(3)))
    stats = kiln.stats()
    assert stats["eager_frames"] == 1 and stats["graphs"] == 1 and stats["recompiles"] == 0


def test_symbolic_input_sizes_and_values_of_the_data_together():
    """dynamic=True: input sizes are backed symbols, counts of the data unbacked ones; the
    shape guards read only the former."""

    def f(x):
        y = x[x > 0] * 2 + 1
        return y.sum() / x.numel(), torch.nonzero(x > 0.5).float().mean(0), x * x[0, 0].item()

    kiln.reset()
    compiled = kiln.compile(f, dynamic=True)
    for seed, shape in enumerate([(5, 4), (7, 3), (9, 6)]):
        x = _data(20 + seed, *shape)
        torch.testing.assert_close(compiled(x), f(x))
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["recompiles"] == 0 and stats["eager_frames"] == 0
    assert stats["fallbacks"] == 0, stats


def test_ctc_loss_with_tensor_lengths(aten_graphs):
    g = torch.Generator().manual_seed(30)
    log_probs = torch.randn(12, 3, 6, generator=g).log_softmax(2)
    targets = torch.randint(1, 6, (3, 5), generator=g)
    lengths = torch.tensor([12, 10, 11])

    def f(lp, t, il, tl):
        return torch.nn.functional.ctc_loss(lp, t, il, tl)

    compiled = _check(f, log_probs, targets, lengths, torch.tensor([5, 3, 4]))
    other = torch.tensor([2, 5, 1])  # another longest target: another log_alpha width
    torch.testing.assert_close(
        compiled(log_probs, targets, lengths, other), f(log_probs, targets, lengths, other)
    )
    assert kiln.stats()["recompiles"] == 0


@pytest.mark.parametrize("driver", [None, "gels", "gelsy"])
def test_lstsq_outputs_by_driver(driver):
    """linalg.lstsq has no meta kernel in torch: kiln-shapes gives its outputs' shapes."""

    def f(a, b):
        out = torch.linalg.lstsq(a, b, driver=driver)
        return out.solution * 2, out.residuals, out.rank

    _check(f, _data(40, 6, 3), _data(41, 6, 2))


def test_linear_cross_entropy_with_frozen_options():
    """A frozen dataclass of constants handed to a torch function (chunking options) is a
    constant argument guarded by identity; the chunked path compiles."""
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

    options = LinearCrossEntropyOptions(batch_chunk_size=2)

    def f(x, w, t):
        return torch.nn.functional.linear_cross_entropy(x, w, t, options=options)

    g = torch.Generator().manual_seed(50)
    x, w = torch.randn(6, 3, generator=g), torch.randn(4, 3, generator=g)
    _check(f, x, w, torch.randint(0, 4, (6,), generator=g))


def test_arithmetic_on_item_values():
    """t.item() * 2 and t.item() ** 2: numbers of the data computed by the wrapper; pow's
    check of a negative base takes a side (a negative value runs that call eagerly)."""

    def f(x, t):
        return x * (t.item() * 2) + t.item() ** 2

    x = _data(60, 4)
    compiled = _check(f, x, torch.tensor(1.5))
    torch.testing.assert_close(compiled(x, torch.tensor(0.25)), f(x, torch.tensor(0.25)))
    with pytest.warns(UserWarning, match="ran eagerly"):
        torch.testing.assert_close(compiled(x, torch.tensor(-0.5)), f(x, torch.tensor(-0.5)))
