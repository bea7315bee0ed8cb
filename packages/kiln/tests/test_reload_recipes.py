"""kiln-inductor's reload recipes (runtime/reload.py) through kiln's backend: a compiled
graph rebuilt from the artifact cache without its graph, equal to eager, and refused
(None: the graph is compiled) whenever the compiler, settings or cache differ; and
kiln-capture's kept captures using them in a fresh process (frame_store.py)."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
import kiln_aot.api
import kiln_capture
import kiln_cpp
import kiln_inductor
from kiln_inductor.regions import STATS as REGIONS
from kiln_inductor.runtime import artifacts


class Block(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.norm(self.fc(x))) * 0.5


class Stack(torch.nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).relu()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_ARTIFACT_CACHE", "1")
    monkeypatch.setenv("KILN_CAPTURE_FRAMES", "0")  # graphs from a capture of this process
    kiln.reset()
    yield tmp_path
    kiln.reset()


def _captured(model: torch.nn.Module, x: torch.Tensor):
    """The torch-level graph kiln-capture makes of ``model(x)``, and its example inputs."""
    found = []

    def backend(gm, example_inputs):
        found.append((gm, list(example_inputs)))
        return gm.forward

    kiln_capture.reset()
    with torch.no_grad():  # inference graphs and plans, as the reloads below ask for
        kiln_capture.optimize(backend)(model)(x)
    (graph,) = found
    return graph


def _no_graph():
    raise AssertionError("the graph was rebuilt")


def _compiled_and_recipe(model, x):
    gm, examples = _captured(model, x)
    with torch.no_grad():
        fn = kiln_cpp.compile_fx(gm, examples)
    recipe = fn.kiln_reload_recipe
    marshal.dumps(recipe)  # plain data: kiln-capture keeps it on disk
    return gm, examples, fn, recipe


def _no_tracing(monkeypatch) -> list:
    traced: list = []
    monkeypatch.setattr(kiln_aot.api, "trace", lambda *a, **k: traced.append(1))
    monkeypatch.setattr(kiln_aot.api, "trace_joint", lambda *a, **k: traced.append(1))
    return traced


@pytest.mark.parametrize("depth", [1, 4], ids=["whole", "regions"])
def test_a_recipe_reloads_without_the_graph(cache, monkeypatch, depth):
    torch.manual_seed(0)
    model = Stack(depth).eval()
    x = torch.randn(4, 16)
    gm, examples, fn, recipe = _compiled_and_recipe(model, x)
    assert recipe[3][0] == ("regions" if depth > 1 else "aot")
    traced = _no_tracing(monkeypatch)
    hits = artifacts.STATS.hits
    REGIONS.reset()
    with torch.no_grad():
        again = kiln_inductor.reload_fx(recipe, examples, _no_graph)
        assert again is not None
        got = again(*examples)
        ref = model(x)
        first = fn(*examples)
    torch.testing.assert_close(got[0], ref)
    torch.testing.assert_close(first[0], ref)
    assert not traced and artifacts.STATS.hits - hits == (1 if depth == 1 else 2)
    if depth > 1:  # the report and explain() still say which blocks were reused
        assert REGIONS.blocks and "reused for 4 instances" in REGIONS.blocks[0]
    assert again.kiln_reload_recipe == recipe


def test_a_recipe_does_not_hold_under_other_settings(cache, monkeypatch):
    torch.manual_seed(0)
    model = Stack(3).eval()
    x = torch.randn(4, 16)
    _, examples, _, recipe = _compiled_and_recipe(model, x)
    with monkeypatch.context() as m:
        m.setenv("KILN_ARTIFACT_CACHE", "0")
        assert kiln_inductor.reload_fx(recipe, examples, _no_graph) is None
    with monkeypatch.context() as m:  # compiled in regions: not what compile_fx does now
        m.setenv("KILN_REGIONAL_REUSE", "0")
        assert kiln_inductor.reload_fx(recipe, examples, _no_graph) is None
    with monkeypatch.context() as m:  # another compiler, machine or affects_cache setting
        m.setattr(artifacts, "context_key", lambda devices: "another")
        assert kiln_inductor.reload_fx(recipe, examples, _no_graph) is None
    assert kiln_inductor.reload_fx(("other", 1, True, ()), examples, _no_graph) is None
    assert kiln_inductor.reload_fx((*recipe[:3], ("regions", 5)), examples, _no_graph) is None


def test_a_plan_the_cache_lost_is_compiled_from_the_graph(cache):
    torch.manual_seed(0)
    model = Stack(3).eval()
    x = torch.randn(4, 16)
    gm, examples, _, recipe = _compiled_and_recipe(model, x)
    for entry in (cache / "artifacts").rglob("*"):
        if entry.is_file():
            entry.unlink()
    built = []

    def make_graph():
        built.append(1)
        return gm

    with torch.no_grad():
        again = kiln_inductor.reload_fx(recipe, examples, make_graph)
        torch.testing.assert_close(again(*examples)[0], model(x))
    assert built == [1]  # rebuilt once, for the pieces the cache no longer had


CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    sys.path.insert(0, sys.argv[1])
    from test_reload_recipes import Stack
    import kiln, kiln_aot.api
    from kiln_capture import frame_store, graph_data

    if sys.argv[2] == "warm":  # neither the graph nor a trace: the recipe gives it all
        def refuse(*a, **k):
            raise AssertionError("rebuilt or traced")
        graph_data.rebuild = refuse
        kiln_aot.api.trace = refuse
    import logging
    from kiln import report

    page = report.Report("child.py", [])  # what the HTML report would say
    handler = report._Collector(page)
    for name in ("kiln_capture", "kiln_inductor"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.DEBUG)
    torch.manual_seed(0)
    model = Stack(4).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        out = kiln.compile(model)(x)
        ref = model(x)
    s = frame_store.STATS
    print(json.dumps({
        "err": float((out - ref).abs().max()), "stats": kiln.stats(),
        "loaded": s.loaded, "reloaded": s.reloaded, "saved": s.saved,
        "kept": report.kept_captures_line(page), "reuse": report.regional_reuse_lines(page),
        "replayed": report.replayed_calls_line(page),
    }))
    """
)


def _process(tmp_path, mode: str, **env) -> dict:
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    environ = {
        **os.environ,
        "KILN_CACHE_DIR": str(tmp_path / "cache"),
        "KILN_ARTIFACT_CACHE": "1",
        "KILN_CAPTURE_CACHE": "1",
        "KILN_CAPTURE_FRAMES": "1",
        "KILN_CAPTURE_RAISE_INTERNAL": "1",
        "KILN_LOG": "timings,graphs",
        **env,
    }
    here = os.path.dirname(__file__)
    proc = subprocess.run(
        [sys.executable, str(child), here, mode],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["err"] < 1e-5, out
    assert out["stats"]["graphs"] == 1 and out["stats"]["fallbacks"] == 0, out
    return out


def test_a_warm_process_reloads_the_kept_capture(tmp_path):
    cold = _process(tmp_path, "cold")
    assert (cold["saved"], cold["loaded"], cold["reloaded"]) == (1, 0, 0)
    warm = _process(tmp_path, "warm")
    assert (warm["saved"], warm["loaded"], warm["reloaded"]) == (0, 1, 1)
    # the HTML report says so, and still lists the reused block
    assert "1 frame(s) loaded from disk" in warm["kept"], warm["kept"]
    assert "1 compiled graph(s) reloaded" in warm["kept"], warm["kept"]
    assert any("reused for 4 instances" in line for line in warm["reuse"]), warm["reuse"]
    assert cold["kept"].startswith("kept captures: none")
    # the cold process traced the first blocks and replayed the later ones
    assert "replayed (" in cold["replayed"] and "Block x" in cold["replayed"], cold["replayed"]
    assert warm["replayed"].startswith("calls traced once: none"), warm["replayed"]
    # without the artifact cache the recipe does not hold: the graph is rebuilt, compiled
    off = _process(tmp_path, "off", KILN_ARTIFACT_CACHE="0")
    assert (off["loaded"], off["reloaded"]) == (1, 0)
    # another compiler setting (kiln-capture's key does not hold it): the recipe does not
    # hold, the graph is compiled and its new recipe kept; the next such process reloads
    other = _process(tmp_path, "other", KILN_MAX_INLINE_OPS="119")
    assert (other["loaded"], other["reloaded"]) == (1, 0)
    again = _process(tmp_path, "warm", KILN_MAX_INLINE_OPS="119")
    assert (again["loaded"], again["reloaded"]) == (1, 1)


def test_the_report_lists_reloaded_blocks(cache, monkeypatch):
    import logging

    from kiln import report

    torch.manual_seed(0)
    model = Stack(3).eval()
    x = torch.randn(4, 16)
    _, examples, _, recipe = _compiled_and_recipe(model, x)
    page = report.Report("model.py", [])
    handler = report._Collector(page)
    logger = logging.getLogger("kiln_inductor")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    monkeypatch.setenv("KILN_LOG", "graphs,timings,cache")
    try:
        with torch.no_grad():
            again = kiln_inductor.reload_fx(recipe, examples, _no_graph)
            torch.testing.assert_close(again(*examples)[0], model(x))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    html = report.render(page)
    reuse = html[html.index("id='regional-reuse'") :]
    assert "Block: compiled once, reused for 3 instances" in reuse
    assert "reloaded from the artifact cache" in reuse
    assert "2 hit(s), 0 miss(es)" in html  # the block and the head, loaded


@pytest.mark.parametrize("depth", [1, 3], ids=["whole", "regions"])
def test_a_training_recipe_reloads_forward_and_backward(cache, monkeypatch, depth):
    torch.manual_seed(0)
    model = Stack(depth).train()
    x = torch.randn(4, 16, requires_grad=True)
    found = []

    def backend(gm, example_inputs):
        found.append((gm, list(example_inputs)))
        return gm.forward

    kiln_capture.reset()
    kiln_capture.optimize(backend)(model)(x)  # grad mode: training graphs and plans
    ((gm, examples),) = found
    fn = kiln_cpp.compile_fx(gm, examples)
    fn(*examples)[0].square().sum().backward()  # the backward compiles: the plan is saved
    model.zero_grad(set_to_none=True)
    x.grad = None
    traced = _no_tracing(monkeypatch)
    again = kiln_inductor.reload_fx(fn.kiln_reload_recipe, examples, _no_graph)
    out = again(*examples)[0]
    out.square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad(set_to_none=True)
    x.grad = None
    ref = model(x)
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref)
    for g, want in zip(got, [p.grad for p in model.parameters()] + [x.grad]):
        torch.testing.assert_close(g, want)
    assert not traced
