"""Soundness: when an assumption of a trace stops holding, the next call recompiles and
still matches eager; past the cache limit the frame runs eagerly."""

import pytest
import torch
from helpers import CountingBackend
from torch import nn

import kiln_capture
from kiln_capture import guards, hook
from kiln_capture.config import config

SCALE = 2.0


def uses_global(x):
    return x * SCALE


def test_global_change_recompiles():
    global SCALE
    b = CountingBackend()
    f = kiln_capture.optimize(b)(uses_global)
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 2.0)
    SCALE = 5.0
    try:
        torch.testing.assert_close(f(x), x * 5.0)
    finally:
        SCALE = 2.0
    assert len(b.graphs) == 2


def test_closure_variable_change_recompiles():
    k = 1.0

    def f(x):
        return x + k

    b = CountingBackend()
    of = kiln_capture.optimize(b)(f)
    x = torch.randn(3)
    torch.testing.assert_close(of(x), x + 1.0)
    k = 4.0
    torch.testing.assert_close(of(x), x + 4.0)
    assert len(b.graphs) == 2


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 1.0

    def forward(self, x):
        y = self.lin(x) * self.scale
        if self.training:
            y = y + 1
        return y


def test_module_attribute_change_recompiles():
    m = Scaled().eval()
    b = CountingBackend()
    om = kiln_capture.optimize(b)(m)
    x = torch.randn(2, 3)
    torch.testing.assert_close(om(x), m(x))
    m.scale = 3.0
    torch.testing.assert_close(om(x), m(x))
    assert len(b.graphs) == 2


def test_training_flag_change_recompiles():
    m = Scaled().eval()
    b = CountingBackend()
    om = kiln_capture.optimize(b)(m)
    x = torch.randn(2, 3)
    torch.testing.assert_close(om(x), m(x))
    m.train()
    torch.testing.assert_close(om(x), m(x))
    m.eval()
    torch.testing.assert_close(om(x), m(x))
    assert len(b.graphs) == 2  # the eval entry is reused


def test_parameter_update_is_seen_without_recompiling():
    m = Scaled().eval()
    b = CountingBackend()
    om = kiln_capture.optimize(b)(m)
    x = torch.randn(2, 3)
    om(x)
    with torch.no_grad():
        m.lin.weight.mul_(3)
    torch.testing.assert_close(om(x), m(x))
    assert len(b.graphs) == 1


def sum_list(xs):
    out = xs[0]
    for t in xs[1:]:
        out = out + t
    return out


def test_container_length_change_recompiles():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(sum_list)
    xs = [torch.randn(3) for _ in range(4)]
    torch.testing.assert_close(f(xs[:2]), sum_list(xs[:2]))
    torch.testing.assert_close(f(xs), sum_list(xs))
    assert len(b.graphs) == 2


def keyed(d):
    return sum(v * i for i, v in enumerate(d.values()))


def test_dict_keys_change_recompiles():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(keyed)
    a = {"a": torch.randn(2), "b": torch.randn(2)}
    c = {"b": a["b"], "a": a["a"]}
    torch.testing.assert_close(f(a), keyed(a))
    torch.testing.assert_close(f(c), keyed(c))
    assert len(b.graphs) == 2


def double(x):
    return x * 2 + x.shape[0]


def test_dtype_shape_stride_requires_grad_changes_recompile():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(double)
    inputs = [
        torch.randn(3, 4),
        torch.randn(3, 4, dtype=torch.float64),
        torch.randn(5, 4),
        torch.randn(4, 3).t(),
        torch.randn(3, 4, requires_grad=True),
    ]
    for x in inputs:
        out = f(x)
        ref = double(x)
        torch.testing.assert_close(out, ref)
        assert out.requires_grad == ref.requires_grad and out.dtype == ref.dtype
    assert len(b.graphs) == len(inputs)
    for x in inputs:  # all hit the cache now
        f(x)
    assert len(b.graphs) == len(inputs)


def test_python_constant_argument_change_recompiles():
    def f(x, n):
        return x * n

    b = CountingBackend()
    of = kiln_capture.optimize(b)(f)
    x = torch.randn(3)
    torch.testing.assert_close(of(x, 2), x * 2)
    torch.testing.assert_close(of(x, 3), x * 3)
    torch.testing.assert_close(of(x, 2), x * 2)
    assert len(b.graphs) == 2


def test_cache_size_limit_falls_back_to_eager(monkeypatch):
    monkeypatch.setattr(config, "cache_size_limit", 3)

    def f(x):
        return x.sum(0) * 2

    b = CountingBackend()
    of = kiln_capture.optimize(b, dynamic=False)(f)  # each size compiles a graph
    for n in range(1, 7):
        x = torch.randn(n, 2)
        torch.testing.assert_close(of(x), f(x))
    assert len(b.graphs) == 3
    assert any("cache size limit" in r for r in hook._eager_codes.values())


def add_one(x):
    return x + 1


def loop_calls(xs):
    out = []
    for t in xs:
        print("a break inside a loop: past the resume limit the rest runs eagerly")
        out.append(add_one(t))
    return out


def test_recompiles_are_reported_by_explain(monkeypatch):
    from kiln_capture.config import config

    monkeypatch.setattr(config, "loop_resume_limit", 0)  # add_one is captured alone
    xs = [torch.randn(2), torch.randn(3)]
    out = kiln_capture.explain(loop_calls)(xs)
    assert len(out.recompiles) == 1 and "add_one" in out.recompiles[0]
    assert "x: float32[2]" in out.recompiles[0]
    assert out.graph_count == 2
    for a, t in zip(out.result, xs):
        torch.testing.assert_close(a, t + 1)


def test_guards_are_one_generated_function():
    def f(x, y, scale):
        return x * scale + y

    b = CountingBackend()
    of = kiln_capture.optimize(b)(f)
    of(torch.randn(2), torch.randn(2), 3)
    entries = hook.cache_entries(f.__code__)
    assert len(entries) == 1
    src = entries[0].guard.__kiln_source__
    assert src.startswith("def __guard(__k_fn, x, y, scale):")
    assert "scale == 3" in src
    if guards.TensorGuards is not None:  # one native call checks every tensor
        assert "__k_tensors(x, y)" in src and "__k_tensor_check" not in src
    else:
        assert "__k_tensor_check(x" in src
    assert entries[0].guard(f, torch.randn(2), torch.randn(2), 3)
    assert not entries[0].guard(f, torch.randn(2), torch.randn(2), 4)
    assert not entries[0].guard(f, torch.randn(3), torch.randn(2), 3)


def test_tied_parameters_share_one_input():
    m = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
    m[1].weight = m[0].weight
    b = CountingBackend()
    om = kiln_capture.optimize(b)(m)
    x = torch.randn(2, 3)
    torch.testing.assert_close(om(x), m(x))
    placeholders = [n for n in b.graphs[0].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 2  # x and the shared weight


def test_module_list_change_recompiles():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    b = CountingBackend()
    om = kiln_capture.optimize(b)(m)
    x = torch.randn(2, 3)
    torch.testing.assert_close(om(x), m(x))
    del m[2]
    torch.testing.assert_close(om(x), m(x))
    assert len(b.graphs) == 2


def test_global_module_hooks_are_respected():
    m = Scaled().eval()
    om = kiln_capture.optimize(CountingBackend())(m)
    x = torch.randn(2, 3)
    om(x)
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, inp, out: out * 0 if isinstance(out, torch.Tensor) else out
    )
    try:
        torch.testing.assert_close(om(x), m(x))
    finally:
        handle.remove()
    torch.testing.assert_close(om(x), m(x))


def branch_on_requires_grad(x, w):
    y = x @ w
    if y.requires_grad:
        return y * 2
    return y - 1


def test_grad_mode_change_recompiles():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(branch_on_requires_grad)
    x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
    torch.testing.assert_close(f(x, w), branch_on_requires_grad(x, w))
    with torch.no_grad():
        torch.testing.assert_close(f(x, w), branch_on_requires_grad(x, w))
    assert len(b.graphs) == 2


def make_ones(x):
    return x.double() + torch.ones(3)


def test_default_dtype_change_recompiles():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(make_ones)
    x = torch.randn(3)
    torch.testing.assert_close(f(x), make_ones(x))
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out, ref = f(x), make_ones(x)
        assert out.dtype == ref.dtype
        torch.testing.assert_close(out, ref)
    finally:
        torch.set_default_dtype(prev)
    assert len(b.graphs) == 2


def _scaled(x, w):
    return x * 2 + w


@pytest.mark.parametrize("native", [True, False])
def test_tensor_checks_recompile_on_any_metadata_change(native, monkeypatch):
    if not native:
        monkeypatch.setattr(guards, "TensorGuards", None)  # the pure-Python fallback
    elif guards.TensorGuards is None:
        pytest.skip("kiln_capture._tensor_guards was not built")
    kiln_capture.reset()
    b = CountingBackend()
    of = kiln_capture.optimize(b)(_scaled)
    x, w = torch.randn(4, 3), torch.nn.Parameter(torch.randn(4, 3))
    with torch.inference_mode():
        inference = torch.randn(4, 3)
    variants = [
        (x, w),  # first call
        (x.clone(), w),  # same metadata: cache hit
        (x.double(), w),  # dtype
        (torch.randn(1, 3), w),  # sizes
        (torch.randn(3, 4).t(), w),  # strides
        (x.clone().requires_grad_(), w),  # requires_grad
        (x, w.detach()),  # Python type (Parameter -> Tensor)
    ]
    expected_graphs = [1, 1, 2, 3, 4, 5, 6]
    if native:
        variants.append((inference, w))  # dispatch keys (inference tensors lack autograd)
        expected_graphs.append(7)
    for (a, c), n in zip(variants, expected_graphs):
        out = of(a, c)
        torch.testing.assert_close(out, _scaled(a, c))
        assert len(b.graphs) == n, (a.dtype, a.shape, a.stride(), type(c))
    if native:
        entry = hook.cache_entries(_scaled.__code__)[-1]  # the first entry (x, w)
        why = entry.guard_set.first_failure(_scaled, entry.params, (inference, w), entry.globals)
        assert why.endswith("dispatch keys differ"), why
    kiln_capture.reset()


def test_hoisted_reads_are_computed_once_in_guard_order():
    lines = guards.hoist_reads(
        [
            "__k_G['m'] is __k_C[0]",
            "type(__k_G['m'].a.b) is int",
            "__k_G['m'].a.b == 3",
            "not any(getattr(__k_C[1], n) for n in ('p', 'q'))",
            "len(x) == 2",
        ]
    )
    assert lines == [
        "__r0 = __k_G['m']",
        "if not (__r0 is __k_C[0]): return False",
        "__r1 = __r0.a",
        "__r2 = __r1.b",
        "if not (type(__r2) is int): return False",
        "if not (__r2 == 3): return False",
        "if not (not any(getattr(__k_C[1], n) for n in ('p', 'q'))): return False",
        "if not (len(x) == 2): return False",
    ]


def test_hoisted_chains_through_calls_and_constants():
    """Chains are named by text built from their parts: calls of chains on chains and
    constants are chains, a call with a starred argument or a keyword is not, and equal
    constants of other types (1 and 1.0) are other chains."""
    lines = guards.hoist_reads(
        [
            "getattr(a.b, 'z') == 1",
            "getattr(a.b, 'z').c(1, None) is x",
            "getattr(a.b, 'z').c(1.0, None) is x",
            "getattr(a.b, 'z').c(1, None).d == 2",
            "f(*a.b) and f(*a.b)",
            "g(a.b, k=1) is g(a.b, k=1)",
        ]
    )
    assert lines == [
        "__r0 = a.b",
        "__r1 = getattr(__r0, 'z')",
        "if not (__r1 == 1): return False",
        "__r2 = __r1.c",
        "__r3 = __r2(1, None)",
        "if not (__r3 is x): return False",
        "if not (__r2(1.0, None) is x): return False",
        "if not (__r3.d == 2): return False",
        "if not (f(*__r0) and f(*__r0)): return False",
        "if not (g(__r0, k=1) is g(__r0, k=1)): return False",
    ]


def test_hoisted_reads_keep_text_around_them():
    """An expression's text is its own with the shared chains replaced (offsets count
    UTF-8 bytes); an expression of several lines is left as it is."""
    lines = guards.hoist_reads(
        [
            "__k_G['é'].a == 'ü' or  __k_G['é'].b",
            "__k_G['é'].a  is not None",
            "(__k_G['é'].a ==\n 1)",
            "f(__k_G['é'].a, k='ß')",
        ]
    )
    assert lines == [
        "__r0 = __k_G['é']",
        "__r1 = __r0.a",
        "if not (__r1 == 'ü' or  __r0.b): return False",
        "if not (__r1  is not None): return False",
        "if not ((__k_G['é'].a ==\n 1)): return False",
        "if not (f(__r1, k='ß')): return False",
    ]


def make_ones_like_default(x):
    return torch.ones(3) * 2, x + 1


@pytest.mark.parametrize("how", ["set_default_device", "device_context"])
def test_default_device_change_recompiles(how):
    b = CountingBackend()
    f = kiln_capture.optimize(b)(make_ones_like_default)
    x = torch.randn(3)
    assert guards.default_device_name() == "cpu"
    f(x)
    if how == "set_default_device":
        torch.set_default_device("meta")
        try:
            out = f(x)
        finally:
            torch.set_default_device(None)
    else:
        with torch.device("meta"):
            out = f(x)
    assert out[0].device.type == "meta"  # as eager: the factory follows the default
    assert len(b.graphs) == 2
    torch.testing.assert_close(f(x)[0], torch.ones(3) * 2)  # back on cpu: a cache hit
    assert len(b.graphs) == 2


def test_hook_changes_recompile():
    scale = 2.0
    m = nn.Linear(3, 3)
    wrapper = nn.Sequential(m)
    b = CountingBackend()
    om = kiln_capture.optimize(b)(wrapper)
    x = torch.randn(2, 3)
    torch.testing.assert_close(om(x), wrapper(x))
    handle = m.register_forward_hook(lambda mod, inp, out: out * scale)
    torch.testing.assert_close(om(x), wrapper(x))  # a hook added: recompiles
    scale = 5.0
    torch.testing.assert_close(om(x), wrapper(x))  # its closure changed: recompiles
    handle.remove()
    torch.testing.assert_close(om(x), wrapper(x))
    assert len(b.graphs) == 3


def test_backward_hook_added_later_runs():
    m = nn.Linear(3, 3)
    wrapper = nn.Sequential(m, nn.Tanh())
    om = kiln_capture.optimize(CountingBackend())(wrapper)
    x = torch.randn(2, 3, requires_grad=True)
    om(x).sum().backward()
    seen = []
    m.register_full_backward_hook(lambda mod, gin, gout: seen.append(gout[0].shape))
    om(x).sum().backward()
    assert seen == [torch.Size([2, 3])]


def test_native_attribute_check_compares_as_strictly_as_python():
    native = guards.CHECK_ATTRS
    if native is None:
        pytest.skip("kiln_capture._C built without check_attrs")

    def check(obj, names, modes, values):
        return native(obj, names, b"a" * len(names), modes, values)

    class Obj:
        @property
        def computed(self):
            return self.base * 2

    o = Obj()
    o.base, o.stride, o.hooks, o.kind = 3, (1, 2), {}, "zeros"
    names = ("base", "stride", "hooks", "kind", "computed")
    ok = (3, (1, 2), None, "zeros", 6)
    assert check(o, names, b"eefee", ok)
    for i, bad in [(0, 3.0), (0, True), (1, (1, 2.0)), (1, (True, 2)), (1, (1, 2, 3)), (4, 7)]:
        values = list(ok)
        values[i] = bad
        assert not check(o, names, b"eefee", tuple(values)), (i, bad)
        assert not guards.same_literal(getattr(o, names[i]), bad)
    o.hooks[1] = print
    assert not check(o, names, b"eefee", ok)
    assert check(o, ("kind", "stride"), b"ti", (str, o.stride))
    assert not check(o, ("missing",), b"e", (None,))  # a failed read is a miss

    class Fallback:  # attributes found by __getattr__ after the generic lookup misses
        def __getattr__(self, name):
            if name == "virtual":
                return 5
            raise AttributeError(name)

    class Custom:  # a __getattribute__ of its own is always called
        def __getattribute__(self, name):
            return 7

    f, c = Fallback(), Custom()
    f.real = 1
    assert check(f, ("real", "virtual"), b"ee", (1, 5))
    assert not check(f, ("virtual",), b"e", (6,)) and not check(f, ("nope",), b"e", (None,))
    assert check(c, ("anything",), b"e", (7,))
    lin = nn.Linear(2, 2)
    assert check(lin, ("weight", "in_features"), b"ie", (lin.weight, 2))  # via Module.__getattr__
    # items and closure cells
    table, k = {"a": (1, 2), 3: None}, 4

    def closure():
        return k

    assert native(table, ("a", 3), b"kk", b"ee", ((1, 2), None))
    assert not native(table, ("b",), b"k", b"e", (None,))  # KeyError: a miss
    assert native(closure, (0,), b"c", b"e", (4,)) and not native(closure, (0,), b"c", b"e", (5,))
    assert not native(closure, (1,), b"c", b"e", (4,)) and not native(len, (0,), b"c", b"e", (4,))


class Strided(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, stride=(1, 1), padding=1)
        self.norm = nn.BatchNorm2d(3).eval()

    def forward(self, x):
        return self.norm(self.conv(x)).relu()


@pytest.mark.parametrize(
    "change",
    ["stride", "padding_mode", "eps", "momentum_none", "hook", "training"],
)
def test_module_attribute_changes_seen_by_native_guards_recompile(change):
    m = Strided().eval()
    b = CountingBackend()
    om = kiln_capture.optimize(b)(m)
    x = torch.randn(1, 2, 8, 8)
    torch.testing.assert_close(om(x), m(x))
    if change == "stride":
        m.conv.stride = (2, 2)
    elif change == "padding_mode":
        m.conv.padding_mode = "reflect"
    elif change == "eps":
        m.norm.eps = 0.5
    elif change == "momentum_none":
        m.norm.momentum = None
    elif change == "hook":
        m.norm.register_forward_pre_hook(lambda mod, args: (args[0] * 3,))
    else:
        m.norm.train()
    torch.testing.assert_close(om(x), m(x))
    assert len(b.graphs) == 2


def _mode_and_flag(t):
    return t * 2, t.is_inference(), torch.is_inference_mode_enabled()


def test_inference_flag_and_mode_are_guarded():
    b = CountingBackend()
    f = kiln_capture.optimize(b)(_mode_and_flag)
    with torch.inference_mode():
        inf = torch.randn(3)
    normal = torch.randn(3)
    for t in (normal, inf, normal):
        assert f(t)[1:] == _mode_and_flag(t)[1:]
    with torch.inference_mode():
        assert f(normal)[1:] == _mode_and_flag(normal)[1:] == (False, True)
    assert len(b.graphs) == 3


def test_guards_tensors_needs_a_guard_with_the_same_metadata():
    from kiln_capture.sources import LocalSource

    gs = guards.GuardSet()
    x = torch.randn(3, 4)
    gs.tensor(LocalSource("x"), x)
    assert gs.guards_tensors(["x"], [x])
    assert gs.guards_tensors(["x"], [torch.randn(3, 4)])  # same metadata, other tensor
    assert not gs.guards_tensors(["y"], [x])  # no guard on y
    assert not gs.guards_tensors(["x"], [x.double()])
    assert not gs.guards_tensors(["x"], [x.t()])
    assert not gs.guards_tensors(["x"], [x.clone().requires_grad_()])
    assert not gs.guards_tensors(["x"], [torch.nn.Parameter(x)])  # Python type
    assert not gs.guards_tensors(["x"], [3])
    assert not gs.guards_tensors(["x", "x"], [x])


def test_hoisted_arguments_keep_order_and_read_shared_chains_once():
    lines, args = guards.hoist_args(
        [
            "x",
            "self._modules['a']._parameters['w']",
            "self._modules['a']._parameters['b']",
            "self._modules['c']._buffers['m']",
        ],
        "__k_a",
    )
    assert lines == [
        "__k_a0 = self._modules",
        "__k_a1 = __k_a0['a']",
        "__k_a2 = __k_a1._parameters",
    ]
    assert args == ["x", "__k_a2['w']", "__k_a2['b']", "__k_a0['c']._buffers['m']"]
