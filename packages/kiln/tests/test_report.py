"""`python -m kiln report`: a script run with logging on becomes one self-contained HTML page."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import torch
    import kiln

    def f(x, y):
        z = torch.softmax(x @ y, dim=-1).relu() * 2
        print("a graph break")
        return z.sum(dim=0) + 1

    g = kiln.compile(f)
    x, y = torch.randn(16, 8), torch.randn(8, 32)
    torch.testing.assert_close(g(x, y), f(x, y))
    g(torch.randn(4, 8), torch.randn(8, 32))   # new shape: a recompile
    """
)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    # One run of the script for every test of the page: each run compiles from a cold cache.
    tmp_path = tmp_path_factory.mktemp("report")
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "report.html"
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, "-m", "kiln", "report", "-o", str(out), str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "script ok" in result.stdout, result.stdout
    return out.read_text()


def test_report_holds_every_section(page):
    for anchor in ("graphs", "breaks", "guards", "recompiles", "kernels", "timings"):
        assert f"id='{anchor}'" in page


def section(page: str, anchor: str) -> str:
    start = page.index(f"id='{anchor}'")
    end = page.find("<h2", start)
    return page[start : end if end != -1 else None]


def test_report_shows_graph_code_kernels_and_breaks(page):
    assert "torch.softmax" in section(page, "graphs")  # the captured torch-level graph
    assert "aten.amax" in section(page, "aot")  # its ATen graph
    assert "kernel0.cpp" in section(page, "kernels")  # a generated kernel, with its source
    assert "extern &quot;C&quot;" in section(page, "kernels")
    breaks = section(page, "breaks")
    assert "print()" in breaks and "script.py:7" in breaks  # reason and source line
    assert "guard failed" in section(page, "recompiles")
    assert "graphs: 4" in page and "graph breaks: 2" in page


def test_report_is_self_contained(page):
    assert "<script" not in page
    assert "http://" not in page and "https://" not in page


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed")
def test_report_renders_in_a_headless_browser(page, tmp_path):
    path = tmp_path / "page.html"
    path.write_text(page)
    shot = tmp_path / "shot.png"
    result = subprocess.run(
        [
            "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}", "--window-size=1200,2000", path.as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 10_000, result.stderr
    dom = subprocess.run(
        [
            "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile2'}",
            "--dump-dom", path.as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert "kiln compile report" in dom and 'id="timings"' in dom
