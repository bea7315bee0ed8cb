"""Launch configurations, the settings scope, and the on-disk kernel source cache."""

from __future__ import annotations

import pytest
import torch

from kiln_triton.config import read_triton_config, settings_scope
from kiln_triton.runtime.configs import LaunchConfig, candidate_configs, interpreter_config
from kiln_triton.runtime.launcher import load_module, source_key


def test_pointwise_candidates():
    small = candidate_configs({"kind": "pointwise", "xnumel": 1000}, False)
    assert small == [LaunchConfig(1024, 1, 4)]
    big = candidate_configs({"kind": "pointwise", "xnumel": 1 << 26}, False)
    assert [c.XBLOCK for c in big] == [1024, 2048]
    assert len(candidate_configs({"kind": "pointwise", "xnumel": 1 << 26}, True)) > len(big)
    tiny = candidate_configs({"kind": "pointwise", "xnumel": 3}, True)
    assert all(c.XBLOCK == 4 for c in tiny)


def test_persistent_candidates_keep_the_row_in_one_block():
    cands = candidate_configs({"kind": "persistent", "xnumel": 32768, "rblock": 4096}, False)
    assert cands and all(c.RBLOCK == 4096 for c in cands)
    assert {(c.XBLOCK, c.num_warps) for c in cands} == {(1, 16), (1, 8), (2, 16)}
    small_rows = candidate_configs({"kind": "persistent", "xnumel": 32768, "rblock": 64}, False)
    assert small_rows[0].XBLOCK == 64


def test_looped_candidates_fit_the_extent():
    cands = candidate_configs({"kind": "looped", "xnumel": 8, "extent": 100}, True)
    assert all(c.RBLOCK <= 128 and c.XBLOCK <= 8 for c in cands)
    assert len(set(cands)) == len(cands)


def test_interpreter_prefers_large_blocks():
    assert interpreter_config({"kind": "pointwise", "xnumel": 300}).XBLOCK == 512
    cfg = interpreter_config({"kind": "persistent", "xnumel": 10, "rblock": 512})
    assert (cfg.XBLOCK, cfg.RBLOCK) == (16, 512)


def test_settings_scope_overrides_and_restores(monkeypatch):
    monkeypatch.setenv("KILN_TRITON_PERSISTENT_MAX", "1024")
    assert read_triton_config().persistent_max == 1024
    with settings_scope(persistent_max=64, max_autotune=True) as cfg:
        assert cfg.persistent_max == 64 and cfg.max_autotune
        with settings_scope(autotune=False):
            assert read_triton_config().persistent_max == 64
            assert not read_triton_config().autotune
    assert read_triton_config().persistent_max == 1024 and not read_triton_config().max_autotune
    with pytest.raises(TypeError, match="unknown kiln-triton settings"):
        with settings_scope(block_size=3):
            pass


def test_kernel_sources_are_cached_and_imported_once(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    source = (
        "import triton\nimport triton.language as tl\n\n"
        "@triton.jit\ndef kernel(in_ptr0, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):\n"
        "    x = tl.arange(0, XBLOCK)\n    tl.store(out_ptr0 + x, tl.load(in_ptr0 + x) * 3)\n"
    )
    key = source_key(source, read_triton_config())
    module = load_module(source, key)
    assert load_module(source, key) is module
    files = list((tmp_path / "triton").rglob("kernel.py"))
    assert len(files) == 1 and files[0].read_text() == source

    import torch

    x = torch.arange(8, dtype=torch.float32)
    y = torch.empty_like(x)
    module.kernel[(1,)](x, y, XBLOCK=8, RBLOCK=1)
    torch.testing.assert_close(y, x * 3)


class _FakeKernel:
    """A CompiledKernel stand-in whose launcher accepts one argument count."""

    def __init__(self, accepts: int):
        self.accepts, self.launches = accepts, []
        self.function, self.packed_metadata = "fn", "meta"

    def run(self, g0, g1, g2, stream, function, metadata, launch_md, enter, exit, *args):
        if len(args) != self.accepts:
            raise TypeError(f"expected {self.accepts} arguments, got {len(args)}")
        self.launches.append(((g0, g1, g2), stream, args))


class _FakeParam:
    def __init__(self, name: str):
        self.name = name


class _FakeFn:
    params = [_FakeParam(n) for n in ("in_ptr0", "out_ptr0", "XBLOCK")]


def fake_driver(monkeypatch, direct) -> None:
    """A stand-in for Triton's active driver: device 0, stream 0 (no GPU needed)."""

    class Driver:
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device: 0)

    monkeypatch.setattr(direct, "driver", type("D", (), {"active": Driver})())


@pytest.mark.parametrize("accepts", [3, 2], ids=["constexprs-passed", "constexprs-dropped"])
def test_direct_launch_finds_the_launchers_argument_shape(monkeypatch, accepts):
    import torch

    from kiln_triton.runtime import direct

    class Driver:
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device: 1234)

    monkeypatch.setattr(direct, "driver", type("D", (), {"active": Driver})())
    kernel = _FakeKernel(accepts)
    x, out = torch.randn(64), torch.empty(64)
    launch = direct.DirectLaunch.build(
        _FakeFn, kernel, (x, out), {"XBLOCK": 64, "num_warps": 4}, (1,)
    )
    assert launch is not None
    assert launch((x, out)) and launch((x, out))
    assert [len(a) for _, _, a in kernel.launches] == [accepts, accepts]
    assert kernel.launches[0][:2] == ((1, 1, 1), 1234)
    assert launch.tails == [[64] if accepts == 3 else []]  # the shape that worked is kept
    assert not launch((torch.randn(65)[1:], out))  # misaligned: Triton's path must specialize


def test_direct_launch_gives_up_when_the_launcher_rejects_every_shape(monkeypatch):
    import torch

    from kiln_triton.runtime import direct

    fake_driver(monkeypatch, direct)
    x = torch.randn(8)
    launch = direct.DirectLaunch.build(_FakeFn, _FakeKernel(7), (x, x), {"XBLOCK": 8}, (1,))
    assert not launch((x, x)) and launch.tails == []
    assert not launch((x, x))


class _Pointer:
    """A tensor stand-in that counts reads of its address."""

    def __init__(self, ptr: int):
        self.ptr, self.reads = ptr, 0

    def data_ptr(self) -> int:
        self.reads += 1
        return self.ptr


def test_direct_launch_checks_only_the_named_arguments(monkeypatch):
    import torch

    from kiln_triton.runtime import direct

    fake_driver(monkeypatch, direct)
    monkeypatch.setattr(direct.torch, "Tensor", object)  # the stand-ins pass as tensors
    x, out = _Pointer(1024), _Pointer(2048)
    kernel = _FakeKernel(3)
    launch = direct.DirectLaunch.build(_FakeFn, kernel, (x, out), {"XBLOCK": 8}, (1,), [0])
    assert launch is not None and launch.checked == (0,)
    reads = out.reads
    assert launch((x, out)) and launch((x, out))
    assert out.reads == reads  # the output is not checked on launch
    assert not launch((_Pointer(1028), out))  # a misaligned input takes Triton's path
    assert launch((x, _Pointer(2052)))  # the wrapper never passes this; it is not checked
    none = direct.DirectLaunch.build(_FakeFn, kernel, (x, out), {"XBLOCK": 8}, (1,), [])
    x.reads = 0
    assert none((x, out)) and x.reads == 0
    # an argument assumed aligned that is not: every argument is checked from then on
    odd = direct.DirectLaunch.build(_FakeFn, kernel, (x, _Pointer(2052)), {"XBLOCK": 8}, (1,), [0])
    assert odd.checked is None and not odd((x, out))
    del torch


def test_backend_names_the_arguments_whose_alignment_can_change():
    import torch
    from batch import make

    from kiln_inductor.graph import GraphLowering
    from kiln_inductor.scheduler.fuse import FusedGroup, fuse_nodes
    from kiln_inductor.testing import aten_graph
    from kiln_triton.backend import TritonBackend

    aten = torch.ops.aten

    c = make((32,), torch.float32)

    def fn(x, w, b):
        h = aten.relu.default(aten.mm.default(x, w))
        s = aten.sum.dim_IntList(aten.exp.default(h), [1])
        y = aten.add.Tensor(aten.mul.Tensor(h, aten.unsqueeze.default(s, 1)), b)
        return (aten.mul.Tensor(y, c), aten.mul.Tensor(s, 2))

    inputs = [
        make((8, 16), torch.float32),
        make((16, 32), torch.float32),
        make((32,), torch.float32),
    ]
    ir = GraphLowering(aten_graph(fn, inputs), inputs).run()
    (group,) = [g for g in fuse_nodes(ir) if isinstance(g, FusedGroup)]
    src = TritonBackend().codegen_kernel(group, ir.buffers)
    kinds = [type(ir.buffers[n]).__name__ for n in src.arg_names]
    # the mm's result (an ATen call's) and the graph input b are checked; the constant c
    # and the two outputs, which the wrapper allocates, are not
    assert sorted(kinds) == sorted(
        ["ExternOutput", "InputBuffer", "ConstantBuffer", "ComputedBuffer", "ComputedBuffer"]
    )
    expect = [k for k, kind in enumerate(kinds) if kind in ("ExternOutput", "InputBuffer")]
    assert src.meta["checked_args"] == expect and len(expect) == 2


def test_direct_launch_steps_aside_while_a_launch_hook_is_installed(monkeypatch):
    import torch

    from kiln_triton.runtime import direct

    fake_driver(monkeypatch, direct)
    x = torch.randn(8)
    launch = direct.DirectLaunch.build(_FakeFn, _FakeKernel(3), (x, x), {"XBLOCK": 8}, (1,), [])
    assert launch((x, x))
    chain = getattr(direct._HOLDER, direct._ENTER)
    if hasattr(chain, "add"):  # Triton >= 3.4: a HookChain a profiler adds to

        def hook(*args):
            return None

        chain.add(hook)
        try:
            assert not launch((x, x))  # the profiler sees Triton's launch
        finally:
            chain.remove(hook)
    else:
        monkeypatch.setattr(direct._HOLDER, direct._ENTER, lambda *a: None)
        assert not launch((x, x))
    assert launch((x, x))


def test_autotuning_takes_the_median_of_interleaved_rounds(monkeypatch):
    """Candidates take turns over the rounds; one slow outlier round does not pick the
    loser, and a config that fails to launch measures as infinitely slow."""
    import triton.testing

    from kiln_triton.config import read_triton_config
    from kiln_triton.runtime import launcher as launcher_mod

    order: list[str] = []
    # per candidate, the timings its rounds return: "a" has one outlier round
    timings = {"a": iter([0.50, 0.26, 0.26]), "b": iter([0.27, 0.27, 0.27])}

    def fake_bench(fn, warmup, rep, return_mode):
        assert return_mode == "median"
        return fn()

    def launcher_for(c):
        def run(*args):
            if c == "broken":
                raise RuntimeError("out of resources")
            order.append(c)
            return next(timings[c]) if len(order) > 2 else 0.0

        return run

    monkeypatch.setattr(triton.testing, "do_bench", fake_bench)
    monkeypatch.setattr(launcher_mod.torch.cuda, "synchronize", lambda: None)
    ln = launcher_mod.TritonLauncher(None, {"kind": "persistent"}, "k", read_triton_config())
    monkeypatch.setattr(ln, "launcher_for", launcher_for)
    got = ln.measure(["a", "b", "broken"], [2.0])
    assert order == ["a", "b", "a", "b", "a", "b", "a", "b"]  # warm-up, then 3 rounds
    assert got == {"a": 0.26, "b": 0.27, "broken": float("inf")}


_PTX = """
.visible .entry kernel(
\t.param .u64 .ptr .global .align 1 kernel_param_0,
\t.param .u64 .ptr .global .align 1 kernel_param_1,
\t.param .u64 .ptr .global .align 1 kernel_param_2,
\t.param .u64 .ptr .global .align 1 kernel_param_3
)
.reqntid 128
{
\t.reg .pred \t%p<3>;
\tld.param.u64 \t%rd1, [kernel_param_0];
}
"""


class _Metadata:
    num_warps, num_ctas, shared = 4, 1, 2048
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False


class _CompiledKernel:
    def __init__(self, **metadata):
        self.metadata = type("M", (_Metadata,), metadata)()
        self.asm = {"ptx": _PTX}


def test_c_launch_shape_counts_the_pointers_triton_appends():
    from kiln_triton.runtime import direct

    assert direct._entry_params(_PTX) == 4
    if direct._c_launch is None:
        pytest.skip("kiln_triton._launch was not built")
    # two tensors and Triton's global and profile scratch pointers (NULL when unused)
    assert direct.c_launch_shape(_CompiledKernel(), 2) == (128, 2048, 2)
    assert direct.c_launch_shape(_CompiledKernel(), 4) == (128, 2048, 0)
    # anything Triton's launcher would do more: its own launcher
    assert direct.c_launch_shape(_CompiledKernel(), 5) is None  # more tensors than params
    assert direct.c_launch_shape(_CompiledKernel(), 1) is None  # unaccounted parameters
    assert direct.c_launch_shape(_CompiledKernel(global_scratch_size=64), 2) is None
    assert direct.c_launch_shape(_CompiledKernel(profile_scratch_size=8), 2) is None
    assert direct.c_launch_shape(_CompiledKernel(num_ctas=2), 2) is None
    assert direct.c_launch_shape(_CompiledKernel(launch_pdl=True), 2) is None
    assert direct.c_launch_shape(_FakeKernel(2), 2) is None  # no metadata or PTX


def test_c_launch_module_checks_its_arguments_without_a_gpu():
    from kiln_triton.runtime import direct

    if direct._c_launch is None:
        pytest.skip("kiln_triton._launch was not built")
    launch = direct._c_launch.launch
    with pytest.raises(TypeError):
        launch(0, 1, 1, 1, 32, 0, 0, 0, [], ())  # tensors must be a tuple
    with pytest.raises(TypeError):
        launch(0, 1, 1)
    with pytest.raises(ValueError):
        launch(0, 1, 1, 1, 32, 0, 0, 300, (), ())  # too many parameters
    x = torch.randn(64)
    with pytest.raises(IndexError):
        launch(0, 1, 1, 1, 32, 0, 0, 0, (x,), (1,))
    # a tensor the kernel assumes 16-byte aligned that is not: no launch, False (the
    # caller takes Triton's path); one it does not assume aligned is not checked
    assert launch(0, 1, 1, 1, 32, 0, 0, 2, (x, x[1:]), (0, 1)) is False
    if not torch.cuda.is_available():  # past the checks, the driver is opened: none here
        with pytest.raises(RuntimeError, match="libcuda"):
            launch(0, 1, 1, 1, 32, 0, 0, 2, (x, x[1:]), (0,))


class _Hooks:
    """A stand-in for Triton's knobs.runtime: launch hook chains with their ``calls``."""

    def __init__(self, enter=(), exit=()):
        self.launch_enter_hook = type("Chain", (), {"calls": list(enter)})()
        self.launch_exit_hook = type("Chain", (), {"calls": list(exit)})()


def test_c_launcher_object_calls_back_for_hooks_misalignment_and_failed_launches():
    from kiln_triton.runtime import direct

    Launcher = getattr(direct._c_launch, "Launcher", None)
    if Launcher is None:
        pytest.skip("kiln_triton._launch was not built")
    calls = []

    def fallback(*tensors):
        calls.append(tensors)

    def make(hooks, aligned=(0,)):
        return Launcher(
            0, (4, 1, 1), 128, 0, 2, aligned, lambda device: 0, 0,
            (hooks, "launch_enter_hook", "launch_exit_hook"), fallback,
        )  # fmt: skip

    x = torch.randn(64)
    make(_Hooks(enter=[print]))(x, x)  # a profiler's hook: Triton's path calls it
    make(_Hooks(exit=[print]))(x, x)
    make(_Hooks())(x[1:], x)  # assumed aligned, is not: Triton's path specializes
    assert [len(c) for c in calls] == [2, 2, 2] and calls[2][0].data_ptr() % 16
    if not torch.cuda.is_available():  # the launch itself fails here (no driver): fallback
        make(_Hooks())(x, x)
        assert len(calls) == 4
    with pytest.raises(TypeError):
        make(_Hooks())(x, out=x)
    with pytest.raises(TypeError):
        Launcher(0, (4, 1), 128, 0, 2, (), print, 0, (None, "a", "b"), print)  # 2-D grid


def test_launcher_installs_the_c_launcher_after_its_first_direct_launch(monkeypatch):
    from kiln_triton.runtime import direct, launcher

    if getattr(direct._c_launch, "Launcher", None) is None:
        pytest.skip("kiln_triton._launch was not built")
    fake_driver(monkeypatch, direct)
    kernel = _CompiledKernel()
    kernel.run = _FakeKernel(3).run
    kernel.function, kernel.packed_metadata = 7, "meta"
    built = direct.DirectLaunch.build(_FakeFn, kernel, (torch.randn(8),) * 2, {"XBLOCK": 8}, (1,))
    assert built is not None and built.c_shape == (128, 2048, 2)
    tl = launcher.TritonLauncher.__new__(launcher.TritonLauncher)
    tl.fast, tl._fast_c, tl._direct = tl, False, built
    tl._install_fast()
    assert type(tl.fast).__name__ == "Launcher" and tl._fast_c


class _SizedFn:
    """A JITFunction stand-in for a kernel taking one size argument: Triton's launches
    (``fn[grid](...)``) are recorded and return one compiled kernel per specialization."""

    params = [_FakeParam(n) for n in ("in_ptr0", "out_ptr0", "s0", "XBLOCK")]

    def __init__(self):
        self.launches, self.kernels = [], {}

    def __getitem__(self, grid):
        from kiln_triton.runtime.buckets import int_specialization

        def launch(*args, **kwargs):
            self.launches.append((grid, args[-1]))
            spec = int_specialization(args[-1:])
            return self.kernels.setdefault(spec, _FakeKernel(4))

        return launch


def test_a_kernel_with_size_arguments_gets_its_grid_from_each_calls_sizes(monkeypatch):
    """Grids from the call's sizes; one launch configuration per size bucket; direct
    launches per Triton specialization of the sizes (a size that is a multiple of 16
    runs another binary), each on its call's grid."""
    from kiln_triton.runtime import direct, launcher

    fake_driver(monkeypatch, direct)
    monkeypatch.setattr(launcher, "interpreting", lambda: False)
    meta = {"kind": "pointwise", "xnumel": "(4 * s0)", "rblock": 1, "extent": 1,
            "size_args": ("s0",), "checked_args": [0]}  # fmt: skip
    fn = _SizedFn()
    ln = launcher.TritonLauncher(fn, meta, "k", read_triton_config())
    x, out = torch.randn(8), torch.empty(8)
    for s0 in (5, 7, 300, 6, 16, 0, 301):
        ln(x, out, s0)
    # Triton's launches: the first of each (bucket, specialization); size 0: none
    assert fn.launches == [((1,), 5), ((2,), 300), ((1,), 16)]
    (small,) = [k for spec, k in fn.kernels.items() if spec == (("i32", False),)]
    grids = [(g, args[2]) for g, _, args in small.launches]
    assert grids == [((1, 1, 1), 7), ((1, 1, 1), 6), ((2, 1, 1), 301)]
    assert sorted(ln._buckets) == [(8,), (16,), (512,)]
    assert ln._buckets[(8,)].config.XBLOCK == 32 and ln._buckets[(512,)].config.XBLOCK == 1024


def test_direct_launch_passes_sizes_after_the_tensors_to_the_c_launcher(monkeypatch):
    """With kiln_triton._launch (stubbed: no GPU here), a static call passes the tensors
    and the first call's grid; a call of a kernel with sizes passes its tensors, this
    call's grid and the sizes after them. A failing C launch falls back to Triton's
    launcher and stops trying."""
    import torch

    from kiln_triton.runtime import direct

    fake_driver(monkeypatch, direct)
    calls = []

    class Stub:
        fail = False

        @staticmethod
        def launch(function, g0, g1, g2, threads, shared, stream, hidden, tensors, aligned, *rest):
            if Stub.fail:
                raise RuntimeError("no context")
            calls.append(((g0, g1, g2), tensors, rest))
            return True

    monkeypatch.setattr(direct, "_c_launch", Stub)
    x, out = torch.randn(64), torch.empty(64)
    kernel = _FakeKernel(3)
    static = direct.DirectLaunch.build(_FakeFn, kernel, (x, out), {"XBLOCK": 64}, (4,))
    static.c_shape = (128, 0, 0)
    assert static((x, out))
    assert calls[-1] == ((4, 1, 1), (x, out), ())
    sized = direct.DirectLaunch.build(_FakeFn, kernel, (x, out, 64), {"XBLOCK": 64}, (4,), nsizes=1)
    sized.c_shape = (128, 0, 0)
    assert sized((x, out, 70), (9,))
    assert calls[-1] == ((9, 1, 1), (x, out), ((70,),))
    Stub.fail = True
    assert sized((x, out, 70), (9,)) and sized.c_shape is None  # Triton's launcher ran
    assert kernel.launches[-1][0] == (9, 1, 1)
