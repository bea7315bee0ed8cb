"""Autocast regions are captured: graphs carry _enter_autocast/_exit_autocast, metadata is
computed under autocast, the entry state is guarded, and breaks inside a region resume.
Results are compared with eager bit for bit (the graph runs the same kernels)."""

import pytest
import torch
from helpers import CountingBackend
from torch.utils._python_dispatch import TorchDispatchMode

import kiln_capture
from kiln_capture import autocast_state

BF16 = torch.bfloat16


def _args(grad=False):
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    return x, w.requires_grad_(grad), b


def assert_equal(actual, expected):
    assert type(actual) is type(expected)
    if isinstance(expected, tuple | list):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_equal(a, e)
    elif isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.requires_grad == expected.requires_grad
        assert torch.equal(actual, expected), (actual - expected).abs().max()
    else:
        assert actual == expected


def _run(fn, *args):
    """explain (counts), then a cache-hit call through optimize; both equal to eager."""
    kiln_capture.reset()
    expected = fn(*args)
    report = kiln_capture.explain(fn)(*args)
    assert_equal(report.result, expected)
    backend = CountingBackend()
    fast = kiln_capture.optimize(backend)(fn)
    fast(*args)
    n = len(backend.graphs)
    assert_equal(fast(*args), expected)
    assert len(backend.graphs) == n, "second call recompiled"
    assert not torch.is_autocast_enabled("cpu"), "autocast leaked out of the frame"
    return report, backend


def linear_softmax(x, w, b):
    y = x + 1
    with torch.autocast("cpu", dtype=BF16):
        z = torch.nn.functional.linear(y, w, b)
        s = torch.softmax(z, -1)
        m = s @ w
        with torch.autocast("cpu", enabled=False):
            q = s.float() @ w
    return z, s, m, q, z.float() * 2, z.dtype


def test_region_captured_in_one_graph_bit_exact():
    report, backend = _run(linear_softmax, *_args())
    assert (report.graph_count, report.break_count) == (1, 0), report.breaks
    code = backend.graphs[0].code
    assert code.count("_enter_autocast(") == 2 and code.count("_exit_autocast(") == 2
    assert code.index("_enter_autocast('cpu', torch.bfloat16, True") < code.index("linear(")


def test_metadata_inside_region_is_autocast_dtype():
    _, backend = _run(linear_softmax, *_args())
    vals = {n.name: n.meta.get("val") for n in backend.graphs[0].graph.nodes}
    assert vals["linear"].dtype == BF16 and vals["matmul"].dtype == BF16
    assert vals["matmul_1"].dtype == torch.float32  # the enabled=False block


def test_graph_run_under_a_dispatch_mode_shows_the_casts():
    """What a dispatch-level tracer (kiln-aot) sees when it runs the graph's nodes."""
    _, backend = _run(linear_softmax, *_args())

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.casts = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                self.casts.append((kwargs or {}).get("dtype"))
            return func(*args, **(kwargs or {}))

    with Record() as rec:
        out = backend.graphs[0](*_args())
    assert BF16 in rec.casts
    assert out[0].dtype == BF16


def test_training_gradients_match_eager():
    def loss(x, w, b):
        with torch.autocast("cpu", dtype=BF16):
            z = torch.nn.functional.linear(x, w, b).softmax(-1)
        return (z.float() * 3).sum()

    x, w, b = _args(grad=True)
    ref = loss(x, w, b)
    ref.backward()
    g_ref, w.grad = w.grad, None
    out = kiln_capture.optimize(CountingBackend())(loss)(x, w, b)
    out.backward()
    assert torch.equal(out, ref) and torch.equal(w.grad, g_ref)


def test_entry_state_is_guarded():
    def f(x, w, b):
        return x @ w + b

    backend = CountingBackend()
    fast = kiln_capture.optimize(backend)(f)
    args = _args()
    with torch.autocast("cpu", dtype=BF16):
        assert_equal(fast(*args), f(*args))
    assert fast(*args).dtype == torch.float32  # same code, caller without autocast
    assert_equal(fast(*args), f(*args))
    with torch.autocast("cpu", dtype=torch.float16):
        assert_equal(fast(*args), f(*args))
    assert len(backend.graphs) == 3
    assert [n.meta["val"].dtype for n in backend.graphs[0].graph.nodes if n.name == "matmul"] == [
        BF16
    ]


def test_disabled_region_inside_caller_autocast():
    def f(x, w, b):
        a = x @ w
        with torch.autocast("cpu", enabled=False):
            c = a.float() @ w
        return a, c, torch.is_autocast_enabled("cpu")

    args = _args()
    with torch.autocast("cpu", dtype=BF16):
        expected = f(*args)
        report = kiln_capture.explain(f)(*args)
    assert (report.graph_count, report.break_count) == (1, 0)
    assert_equal(report.result, expected)
    assert expected[2] is True


_DECORATED = torch.autocast("cpu", dtype=BF16)(lambda x, w: torch.relu(x @ w))


@torch.amp.autocast("cpu", dtype=BF16)
def _decorated(x, w, b):
    return torch.nn.functional.linear(x, w, b).softmax(-1)


def test_decorator_form():
    def f(x, w, b):
        return _decorated(x, w, b) * 2, _DECORATED(x, w) + 1

    report, _ = _run(f, *_args())
    assert (report.graph_count, report.break_count) == (1, 0), report.breaks


@pytest.mark.filterwarnings("ignore:`torch.cpu.amp.autocast")
def test_deprecated_cpu_amp_autocast():
    def f(x, w, b):
        with torch.cpu.amp.autocast(dtype=BF16):
            return x @ w + b

    report, _ = _run(f, *_args())
    assert (report.graph_count, report.break_count) == (1, 0), report.breaks


def test_query_inside_region_answers_the_traced_state():
    def f(x, w, b):
        with torch.autocast("cpu", dtype=BF16):
            on = torch.is_autocast_enabled("cpu")
            dt = torch.get_autocast_dtype("cpu")
            y = x @ w
        return y, on, dt, torch.is_autocast_enabled("cpu")

    report, _ = _run(f, *_args())
    assert report.result[1:] == (True, BF16, False)


def break_inside_region(x, w, b):
    y = x + 1
    with torch.autocast("cpu", dtype=BF16):
        z = y @ w
        print("inside autocast")
        s = torch.softmax(z @ w, -1)
    return z.float() * 2, s, s.float() @ w


def test_break_inside_region_resumes_under_autocast(capsys):
    report, backend = _run(break_inside_region, *_args())
    assert (report.graph_count, report.break_count) == (2, 1), report.breaks
    assert report.breaks[0].resumed
    first, second = (g.code for g in backend.graphs)
    # the first graph closes its region; the continuation's reopens the state the
    # real __exit__ restores before computing what follows the block
    assert first.count("_enter_autocast(") == first.count("_exit_autocast(") == 1
    assert "_enter_autocast('cpu', torch.bfloat16, False" in second
    assert "inside autocast" in capsys.readouterr().out


def test_break_inside_autocast_and_no_grad():
    def f(x, w, b):
        with torch.autocast("cpu", dtype=BF16):
            with torch.no_grad():
                a = x @ w
                print("break")
                c = a @ w
            d = c @ w
        return a, c, d, d.requires_grad

    report, _ = _run(f, *_args(grad=True))
    assert (report.graph_count, report.break_count) == (2, 1), report.breaks


def test_with_device_keeps_one_entry_per_device():
    s = autocast_state.with_device((), "cuda", torch.float16, True)
    s = autocast_state.with_device(s, "cpu", BF16, True)
    assert s == (("cpu", BF16), ("cuda", torch.float16))
    assert autocast_state.with_device(s, "cpu", BF16, False) == (("cuda", torch.float16),)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_region_bit_exact(dtype):
    def f(x, w, b):
        with torch.autocast("cuda", dtype=dtype):
            z = torch.nn.functional.linear(x, w, b)
            s = torch.softmax(z, -1)
            m = s @ w
        return z, s, m, (m.float() * 2).sum(-1)

    torch.manual_seed(0)
    x, w, b = (t.cuda() for t in (torch.randn(16, 32), torch.randn(32, 32), torch.randn(32)))
    report, backend = _run(f, x, w, b)
    assert (report.graph_count, report.break_count) == (1, 0), report.breaks
    vals = {n.name: n.meta.get("val") for n in backend.graphs[0].graph.nodes}
    assert vals["linear"].dtype == dtype
    assert not torch.is_autocast_enabled("cuda")


def test_autocast_object_live_across_a_break():
    def f(x, w, b):
        ctx = torch.autocast("cpu", dtype=BF16)
        print("made the context")
        with ctx as entered:
            y = x @ w
            print("inside")
            z = y @ w
        return y, z, entered is ctx

    report, _ = _run(f, *_args())
    assert report.break_count == 2 and all(b.resumed for b in report.breaks), report.breaks


def test_composites_under_cuda_autocast_make_no_real_tensors():
    """scaled_dot_product_attention's math path and dropout make tensors with their
    input's options: under CUDA autocast the wrappers report ``cuda``, and such a factory
    must give a wrapper too, not a real CUDA tensor (on a GPU one was allocated and met a
    meta tensor: a graph break per attention under ``torch.autocast("cuda")``)."""
    cuda = torch.device("cuda")

    def wrap(*shape, dtype=torch.float32):
        return autocast_state.DeviceMeta(torch.empty(*shape, dtype=dtype, device="meta"), cuda)

    q, mask = wrap(2, 4, 8, 16), wrap(8, 8, dtype=torch.bool)
    state = (("cuda", BF16),)
    with torch.device("meta"), autocast_state.autocast_as(state):
        with autocast_state.device_meta_mode():
            att = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            dropped = torch.nn.functional.dropout(q, 0.1)
            fresh = torch.empty_like(q, dtype=torch.int64)
        assert (att.dtype, att.device, tuple(att.shape)) == (BF16, cuda, (2, 4, 8, 16))
        assert isinstance(att, autocast_state.DeviceMeta) and att.elem.device.type == "meta"
        assert dropped.device == cuda and dropped.elem.device.type == "meta"
        assert fresh.dtype == torch.int64 and fresh.device == cuda
        if not torch.cuda.is_available():  # without the mode: a CUDA factory is reached
            # (a CPU build has no CUDA kernels; a CUDA build here has no driver)
            with pytest.raises((NotImplementedError, RuntimeError)):
                torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_in_place_op_on_a_result_under_autocast():
    """``ReLU(inplace=True)`` after a batch norm under autocast (timm's ResNet in bf16
    training): the result requires grad but is no leaf, so eager allows the in-place op.
    The wrappers were always leaves: "a leaf Variable that requires grad is being used in an
    in-place operation" broke the graph at every block (H200 bf16: 42 graphs, 56 breaks)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(inplace=True)
    )
    x = torch.randn(2, 3, 10, 10)

    def f(x):
        with torch.autocast("cpu", dtype=BF16):
            return net(x).float().sum(dim=(2, 3))

    report, _ = _run(f, x)
    assert report.graph_count == 1 and report.break_count == 0, report.breaks


def test_in_place_op_on_a_leaf_under_autocast_raises_as_eager():
    p = torch.nn.Parameter(torch.randn(5))

    def f(p):
        with torch.autocast("cpu", dtype=BF16):
            return torch.relu_(p)

    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        f(p)
    kiln_capture.reset()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        kiln_capture.optimize(CountingBackend())(f)(p)
