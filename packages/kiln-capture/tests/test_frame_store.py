"""frame_store.py: whole captures kept on disk. Each test runs fresh processes on one
cache directory, as warm starts do: a warm process must give eager's result from a graph
its backend built, without evaluating the frame's bytecode, and must capture again
(with eager's result) whenever the disk holds something that does not fit: damaged
entries, another program (edited code), other shapes, a directory it cannot write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from helpers import CountingBackend
from torch import nn

import kiln_capture
from kiln_capture import code_cache, frame_store, hook

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn

    from helper_fns import gate


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
            self.norm = nn.LayerNorm(8)
            self.scale = 0.5

        def forward(self, x):
            for layer in self.layers:
                x = gate(layer(x)) * self.scale
            return self.norm(x)
    """
)
HELPER = "import torch\n\n\ndef gate(x):\n    return torch.relu(x) + 1\n"
CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import torch
    import kiln_capture
    from kiln_capture import frame_store, hook
    from model import Block

    rows = int(sys.argv[1])
    torch.manual_seed(0)
    m = Block()
    x = torch.randn(rows, 8)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    if sys.argv[2] == "patched":  # the same name, another function: never the kept code
        import model

        model.gate = lambda t: torch.sigmoid(t) - 1
    if sys.argv[2] == "no-capture":  # a warm process must not evaluate any bytecode
        def refuse(*a, **k):
            raise AssertionError("the frame was captured")
        hook.compile_frame = refuse
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = kiln_capture.optimize(backend)(m)(x)
        again = kiln_capture.optimize(backend)(m)(x)
    ref = m(x)
    s = frame_store.STATS
    print(json.dumps({
        "err": float((out - ref).abs().max()), "err2": float((again - ref).abs().max()),
        "graphs": len(graphs), "stats": kiln_capture.stats(),
        "saved": s.saved, "loaded": s.loaded, "skipped": s.skipped, "unsaved": s.unsaved,
        "warnings": [str(w.message) for w in caught],
    }))
    """
)


@pytest.fixture
def project(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.py").write_text(MODEL)
    (src / "helper_fns.py").write_text(HELPER)
    (src / "child.py").write_text(CHILD)
    return tmp_path


def _run(project, rows=4, mode="capture", cache=None, env=None) -> dict:
    environ = {
        **os.environ,
        "KILN_CACHE_DIR": str(cache or project / "cache"),
        "KILN_CAPTURE_CACHE": "1",
        "KILN_CAPTURE_FRAMES": "1",
        "KILN_CAPTURE_RAISE_INTERNAL": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        **(env or {}),
    }
    proc = subprocess.run(
        [sys.executable, str(project / "src" / "child.py"), str(rows), mode],
        cwd=project / "src",
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["err"] < 1e-5 and out["err2"] < 1e-5  # eager's result, both calls
    assert out["graphs"] == 1 and out["stats"]["graphs"] == 1
    assert out["stats"]["eager_frames"] == 0 and out["stats"]["breaks"] == 0
    return out


def _frames(project):
    return sorted(p for p in (project / "cache" / "capture" / "frames").rglob("*") if p.is_file())


def test_a_warm_process_runs_the_kept_capture_without_tracing(project):
    cold = _run(project)
    assert (cold["saved"], cold["loaded"]) == (1, 0)
    assert len(_frames(project)) == 1
    warm = _run(project, mode="no-capture")  # capturing would raise
    assert (warm["saved"], warm["loaded"], warm["skipped"]) == (0, 1, 0)
    assert not [w for w in warm["warnings"] if "kiln" in w]


@pytest.mark.parametrize("how", ["truncated", "corrupt", "foreign", "empty"])
def test_a_damaged_entry_warns_and_the_frame_is_captured(project, how):
    _run(project)
    (path,) = _frames(project)
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "corrupt":
        path.write_bytes(data[:-40] + bytes(b ^ 0x5A for b in data[-40:]))
    elif how == "foreign":
        path.write_bytes(b"kiln-capture-frame\n" + json.dumps({"format": 99}).encode() + b"\n")
    else:
        path.write_bytes(b"")
    warm = _run(project)
    assert (warm["saved"], warm["loaded"]) == (1, 0)
    assert any("damaged entry" in w for w in warm["warnings"])
    if how != "truncated":
        return
    # written whole again: the next process loads it, silently
    again = _run(project, mode="no-capture")
    assert again["loaded"] == 1 and not [w for w in again["warnings"] if "kiln" in w]


def test_edited_code_is_captured_again(project):
    _run(project)
    model = project / "src" / "model.py"
    model.write_text(MODEL.replace("* self.scale", "* self.scale * 2"))
    edited = _run(project)  # the frame's own code changed: another key
    assert (edited["saved"], edited["loaded"]) == (1, 0)
    (project / "src" / "helper_fns.py").write_text(HELPER.replace("+ 1", "+ 2"))
    helper = _run(project)  # an inlined function's file changed: the record is not used
    assert (helper["saved"], helper["loaded"], helper["skipped"]) == (1, 0, 1)
    assert _run(project, mode="no-capture")["loaded"] == 1


def test_a_global_function_replaced_at_run_time_is_not_the_kept_one(project):
    _run(project)
    patched = _run(project, mode="patched")  # eager's result with the new function
    assert (patched["saved"], patched["loaded"], patched["skipped"]) == (1, 0, 1)


def test_other_shapes_are_captured_and_both_are_kept(project):
    _run(project, rows=4)
    other = _run(project, rows=6)  # the kept record's tensor guards fail
    assert (other["saved"], other["loaded"], other["skipped"]) == (1, 0, 1)
    assert _run(project, rows=4, mode="no-capture")["loaded"] == 1
    assert _run(project, rows=6, mode="no-capture")["loaded"] == 1


def test_an_unwritable_directory_warns_and_captures(project):
    blocker = project / "blocker"
    blocker.write_text("a file where the cache directory should be")
    out = _run(project, cache=blocker / "cache")
    assert (out["saved"], out["loaded"]) == (1, 0) or out["loaded"] == 0
    assert any("cannot be written" in w for w in out["warnings"])


def test_the_switch_turns_it_off(project):
    off = {"KILN_CAPTURE_FRAMES": "0"}
    assert _run(project, env=off)["saved"] == 0 and not _frames_or_none(project)
    _run(project)
    assert _run(project, env=off)["loaded"] == 0
    assert _run(project, env={"KILN_CAPTURE_CACHE": "0"})["loaded"] == 0


def _frames_or_none(project):
    root = project / "cache" / "capture" / "frames"
    return _frames(project) if root.exists() else []


# -- in one process --------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = 0.5

    def forward(self, x):
        return torch.tanh(self.fc(x)) * self.scale


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_CAPTURE_CACHE", "1")
    monkeypatch.setenv("KILN_CAPTURE_FRAMES", "1")
    code_cache.reset()
    frame_store.reset()
    hook._met.clear()
    yield tmp_path
    hook._met.clear()


def _fresh(model, x):
    """Call ``model`` compiled as a new process would meet it (the disk read again)."""
    kiln_capture.reset()
    hook._met.clear()
    b = CountingBackend()
    loaded = frame_store.STATS.loaded
    out = kiln_capture.optimize(b)(model)(x)
    assert len(b.graphs) == 1
    return out, frame_store.STATS.loaded - loaded


def test_a_changed_attribute_is_guarded_as_on_a_cache_hit(cache_dir):
    torch.manual_seed(0)
    m, x = Net(), torch.randn(3, 8)
    out, loaded = _fresh(m, x)
    assert loaded == 0
    torch.testing.assert_close(out, m(x))
    out, loaded = _fresh(m, x)
    assert loaded == 1
    torch.testing.assert_close(out, m(x))
    m.scale = 0.25  # a guard of the kept record fails: captured again
    out, loaded = _fresh(m, x)
    assert loaded == 0
    torch.testing.assert_close(out, m(x))
    other = Net()  # another instance of the same class: found by its path, not identity
    out, loaded = _fresh(other, x)
    assert loaded == 1
    torch.testing.assert_close(out, other(x))


def test_a_loaded_entry_recompiles_as_a_captured_one(cache_dir):
    torch.manual_seed(0)
    m, x = Net(), torch.randn(3, 8)
    _fresh(m, x)
    kiln_capture.reset()
    hook._met.clear()
    b = CountingBackend()
    opt = kiln_capture.optimize(b)(m)
    loaded = frame_store.STATS.loaded
    torch.testing.assert_close(opt(x), m(x))
    assert frame_store.STATS.loaded == loaded + 1
    y = torch.randn(5, 8)  # the loaded entry's tensor guard fails: a recompile, named
    torch.testing.assert_close(opt(y), m(y))
    assert len(b.graphs) == 2 and kiln_capture.stats()["recompiles"] == 1
    (entry,) = [e for e in hook.cache_entries(Net.forward.__code__) if e.graphs[0] is b.graphs[0]]
    assert "x: float32[3, 8]" in entry.guard_set.first_failure(
        m.forward.__func__, entry.params, (m, y), entry.globals
    )


def _names_in_set_order(x):
    out, names = x, []
    for name in {"k", "a", "z", "q"}:  # str hashes are salted per process: so is this order
        names.append(name)
        out = out + len(name)
    return out, names, hash("kiln")


def test_what_differs_between_processes_is_not_kept(cache_dir):
    unsaved = frame_store.STATS.unsaved
    b = CountingBackend()
    x = torch.randn(3)
    out, names, h = kiln_capture.optimize(b)(_names_in_set_order)(x)
    assert (names, h) == (list({"k", "a", "z", "q"}), hash("kiln")) and len(b.graphs) == 1
    torch.testing.assert_close(out, x + 4)
    assert (
        frame_store.STATS.unsaved == unsaved + 1 and not (cache_dir / "capture" / "frames").exists()
    )


def test_explain_captures(cache_dir):
    m, x = Net(), torch.randn(3, 8)
    _fresh(m, x)
    hook._met.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = kiln_capture.explain(m)(x)
    assert report.graph_count == 1 and report.guards


def _applying(op):
    def apply(a, b):
        return op(a, b)

    return apply


def test_closures_over_functions_sharing_one_code_are_told_apart(cache_dir):
    """torch's ``Tensor.__rmod__``, ``__rpow__`` and ``__rsub__`` are one decorator's wrapper
    (one code object) around different functions. A kept capture of a closure over one of
    them was loaded for a closure over another: its fingerprint held the wrapper's code, not
    what the wrapper's closure holds (OpInfo's ``__rpow__`` after ``__rmod__``: wrong
    results). Each is now a capture of its own, equal to eager."""
    torch.manual_seed(0)
    x, y = torch.randn(5), torch.randn(5)
    ops = (torch.Tensor.__rmod__, torch.Tensor.__rpow__, torch.Tensor.__rsub__)
    assert len({op.__code__ for op in ops}) == 1
    for op in ops:
        fn = _applying(op)
        kiln_capture.reset()
        hook._met.clear()
        b = CountingBackend()
        got = kiln_capture.optimize(b)(fn)(x, y)
        assert len(b.graphs) == 1
        torch.testing.assert_close(got, op(x, y), equal_nan=True)
    # a closure over the same function again is the kept capture, loaded
    loaded = frame_store.STATS.loaded
    kiln_capture.reset()
    hook._met.clear()
    torch.testing.assert_close(
        kiln_capture.optimize(CountingBackend())(_applying(ops[0]))(x, y), ops[0](x, y)
    )
    assert frame_store.STATS.loaded == loaded + 1
