"""Launches of kernels with size arguments (no GPU: stand-in kernels, sized_stubs.py): what
a call decides from its sizes (bucket, kernel, grid, specialization) is decided once per
exact size tuple and remembered, up to a bound; sizes seen before launch with no decision
(from C, through kiln_triton._launch.SizedLauncher, once a direct launch has a C form);
hooks and misaligned tensors still take Triton's path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sized_stubs import Driver, SizedFn, build_stub_libcuda

from kiln_triton.config import TritonConfig
from kiln_triton.runtime import buckets, direct, launcher

POINTWISE = {"kind": "pointwise", "xnumel": "(4 * s0)", "rblock": 1, "extent": 1,
             "size_args": ("s0",), "checked_args": [0]}  # fmt: skip
# rows of 100 - s1 elements: shorter as s1 grows, so a size can have rows longer than its
# bucket's (the bucket's persistent kernel, sized at the bucket's sizes, cannot run them)
ROWS = {"kind": "looped", "xnumel": "s0", "extent": "(100 - s1)", "rblock": 1,
        "persistent_limit": 64, "size_args": ("s0", "s1"), "checked_args": [0]}  # fmt: skip


@pytest.fixture
def stubbed(monkeypatch):
    """Outside the interpreter, with the stand-in driver; Triton's launcher only (no C
    launch: the stand-in kernels have no PTX)."""
    monkeypatch.setattr(direct, "driver", Driver)
    monkeypatch.setattr(launcher, "interpreting", lambda: False)


def make(meta: dict, log: list) -> launcher.TritonLauncher:
    names = meta["size_args"]
    fn = SizedFn(log, "kernel", names)
    persistent = SizedFn(log, "persistent", names) if "persistent_limit" in meta else None
    cfg = TritonConfig(autotune=False, compile_workers=0)
    return launcher.TritonLauncher(fn, meta, "k", cfg, persistent)


def test_a_repeated_size_tuple_is_decided_once(stubbed, monkeypatch):
    decided: list[str] = []

    def counting(name, real):
        def wrapped(*args, **kwargs):
            decided.append(name)
            return real(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(buckets.SizedMeta, "numels", counting("numels", buckets.SizedMeta.numels))
    monkeypatch.setattr(launcher, "bucket_of", counting("bucket", launcher.bucket_of))
    monkeypatch.setattr(
        launcher, "int_specialization", counting("spec", launcher.int_specialization)
    )
    log: list = []
    ln = make(POINTWISE, log)
    x, out = torch.randn(8), torch.empty(8)
    ln(x, out, 5)
    first = list(decided)  # (the bucket's choice evaluates the sizes' meta too)
    assert {"numels", "bucket", "spec"} == set(first)
    for _ in range(5):
        ln(x, out, 5)
    assert decided == first  # nothing decided again
    assert [e[0] for e in log] == ["triton"] + ["direct"] * 5
    assert {e[2:] for e in log} == {((1, 1, 1), (5,), 32, 1)}
    ln(x, out, 7)  # a new size of the bucket: its own decision, no new bucket choice
    assert decided[len(first) :] == ["numels", "bucket", "spec"]
    ln(x, out, 0)
    ln(x, out, 0)  # no elements: nothing launched, decided once
    assert decided[len(first) + 3 :] == ["numels"] and len(log) == 7


@pytest.mark.parametrize("meta", [POINTWISE, ROWS], ids=["pointwise", "rows"])
def test_each_call_launches_what_a_fresh_launcher_would(stubbed, meta):
    """Sizes new and seen before, within a bucket and across buckets, and (rows) sizes
    whose rows are longer than their bucket's, which take the looped kernel: each call
    launches the kernel, grid and block a launcher seeing those sizes first launches."""
    if meta is POINTWISE:
        sizes = [(5,), (7,), (5,), (300,), (6,), (16,), (7,), (301,), (0,), (300,), (5,), (0,)]
    else:  # (s0, s1): rows of 60 and 67 in bucket (4, 64); 30 (bucket 128: rows of 1)
        sizes = [(4, 40), (4, 33), (4, 40), (3, 33), (4, 70), (4, 33), (5, 40), (4, 70)]
    log: list = []
    ln = make(meta, log)
    x, out = torch.randn(8), torch.empty(8)
    got = []
    for s in sizes:
        n = len(log)
        ln(x, out, *s)
        got.append([e[1:] for e in log[n:]])
        assert [e[0] for e in log[n:]] in ([], ["triton"], ["direct"])
    want = []
    for s in sizes:
        fresh: list = []
        make(meta, fresh)(x, out, *s)
        want.append([e[1:] for e in fresh])
    assert got == want
    if meta is ROWS:  # both kernels ran: the persistent one, the looped one for longer rows
        assert {w[0][0] for w in want} == {"kernel", "persistent"}
        assert got[1][0][0] == "kernel" and got[0][0][0] == "persistent"


def test_hooks_and_misaligned_tensors_take_tritons_path_at_sizes_seen_before(stubbed):
    log: list = []
    ln = make(POINTWISE, log)
    x, out = torch.randn(64), torch.empty(64)
    ln(x, out, 5)
    ln(x, out, 5)
    assert [e[0] for e in log] == ["triton", "direct"]
    ln(x[1:], out, 5)  # assumed aligned (checked_args), is not: Triton specializes
    assert log[-1][0] == "triton"
    chain = getattr(direct._HOLDER, direct._ENTER)
    if not hasattr(chain, "add"):
        pytest.skip("Triton < 3.4 keeps launch hooks elsewhere")

    def hook(*args):
        return None

    chain.add(hook)
    try:
        ln(x, out, 5)
    finally:
        chain.remove(hook)
    assert log[-1][0] == "triton"  # the profiler sees Triton's launch
    ln(x, out, 5)
    assert log[-1][0] == "direct" and len(log) == 5


def test_the_size_cache_stays_bounded(stubbed, monkeypatch):
    monkeypatch.setattr(launcher, "SIZE_CACHE_LIMIT", 8)
    log: list = []
    ln = make(POINTWISE, log)
    # as if every direct launch had a C form (kept in the table the C launcher reads)
    monkeypatch.setattr(launcher, "c_entry", lambda direct, grid: ("c", grid))
    monkeypatch.setattr(launcher, "c_sized_launcher", lambda *args: print)
    x, out = torch.randn(8), torch.empty(8)
    for s0 in range(1, 40):  # a new length every call, as generate() calls
        ln(x, out, s0)
        assert len(ln._at_sizes) <= 8
    assert list(ln._at_sizes) == [(n,) for n in range(32, 40)]  # the latest, oldest first
    assert ln.fast is print and set(ln._c_table) == set(ln._at_sizes)
    n = len(log)
    ln(x, out, 3)  # forgotten: decided again, launching as before
    assert (3,) in ln._at_sizes and len(ln._at_sizes) == 8 and (32,) not in ln._at_sizes
    assert [e[:3] for e in log[n:]] == [("direct", "kernel", (1, 1, 1))]


def test_sized_c_launcher_calls_back_without_a_table_entry_hook_or_alignment():
    """kiln_triton._launch.SizedLauncher alone: sizes not in its table, a launch hook, a
    misaligned tensor the kernel assumes aligned (and, with no driver, the failed launch)
    call the fallback with every argument; sizes with nothing to launch return at once."""
    from test_runtime import _Hooks

    sized = getattr(direct._c_launch, "SizedLauncher", None)
    if sized is None:
        pytest.skip("kiln_triton._launch was not built (or is older than SizedLauncher)")
    calls = []

    def fallback(*args):
        calls.append(args)

    table: dict = {(0,): None, (5,): (0, 1, 1, 1, 128, 0, 2, (0,)), (6,): (0, 1, 1)}

    def make_launcher(hooks):
        hooks = (hooks, "launch_enter_hook", "launch_exit_hook")
        return sized(1, table, lambda device: 0, 0, hooks, fallback)

    x = torch.randn(64)
    plain = make_launcher(_Hooks())
    plain(x, x, 7)  # not in the table: the fallback decides
    assert plain(x, x, 0) is None and len(calls) == 1  # nothing to launch
    make_launcher(_Hooks(enter=[print]))(x, x, 5)
    plain(x[1:], x, 5)
    assert [c[-1] for c in calls] == [7, 5, 5] and calls[2][0].data_ptr() % 16
    if not torch.cuda.is_available():  # the launch itself fails here (no driver): fallback
        plain(x, x, 5)
        assert len(calls) == 4
    with pytest.raises(TypeError):
        plain(x, x, 6)  # a malformed entry
    with pytest.raises(TypeError):
        plain(x, x, s0=5)
    with pytest.raises(TypeError):
        sized(1, [], print, 0, (None, "a", "b"), print)  # the table is a dict
    with pytest.raises(ValueError):
        sized(0, {}, print, 0, (None, "a", "b"), print)


def test_sized_c_launches_with_a_stub_driver(tmp_path):
    """The whole C path against a stand-in libcuda (sized_stubs.check_sized_c_launches),
    in a process of its own: sizes seen before launch with no Python call, with the
    grid, block, pointers and sizes of their decision."""
    if getattr(direct._c_launch, "SizedLauncher", None) is None:
        pytest.skip("kiln_triton._launch was not built (or is older than SizedLauncher)")
    lib = build_stub_libcuda(tmp_path)
    if lib is None:
        pytest.skip("no C compiler for the stub libcuda")
    script = Path(__file__).with_name("sized_stubs.py")
    done = subprocess.run(
        [sys.executable, str(script), str(lib)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
