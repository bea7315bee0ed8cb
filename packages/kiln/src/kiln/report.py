"""The compile report: `python -m kiln report script.py [args]` -> one self-contained HTML page.

How it is collected
===================
The script runs in this process (``runpy``) with every kiln package's logging on and a
fresh debug directory (``KILN_DEBUG_DIR``), into which the packages write one file per
stage and graph (``capture``, ``aot.fw``, ``aot.bw``, ``ir``, ``sched``, ``cpp``,
``triton``: DESIGN.md's observability contract). The report reads back:

- log records of the ``kiln*`` loggers, sorted into topics by their logger name and by
  the topic word they start with (graphs, guards, breaks, recompiles, kernels, timings);
- every file in the debug directory, grouped by stage (its extension or name prefix);
- ``kiln.explain``-style data where the capture package exposes it (``graph breaks``).

The page needs no network and no script: sections are ``<details>`` elements.
"""

from __future__ import annotations

import html
import logging
import os
import re
import runpy
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TOPICS = ("graphs", "guards", "breaks", "recompiles", "kernels", "timings")
STAGES = ("capture", "aot.fw", "aot.bw", "aot", "aten", "ir", "sched", "cpp", "triton", "wrapper")
# Timing lines: "capture: 0.12 s", "lower took 3 ms", or "{'lower_s': 0.1, 'codegen_s': ...}".
_TIMING = re.compile(
    r"(?P<stage>[A-Za-z][A-Za-z.\-]*?)(?:_(?P<unit1>s|ms))?'?\s*(?:took|:|=)\s*"
    r"(?P<sec>[0-9]+(?:\.[0-9]*)?(?:e-?[0-9]+)?)\s*(?P<unit2>ms|s)?\b"
)


@dataclass
class Report:
    script: str
    argv: list[str]
    wall_s: float = 0.0
    exit_status: str = "ok"
    records: dict[str, list[str]] = field(
        default_factory=lambda: {t: [] for t in (*TOPICS, "aot", "ir", "other")}
    )
    files: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # stage -> [(name, text)]
    timings: dict[str, float] = field(default_factory=dict)


class _Collector(logging.Handler):
    def __init__(self, report: Report) -> None:
        super().__init__(logging.DEBUG)
        self.report = report

    def emit(self, record: logging.LogRecord) -> None:
        try:  # a handler must never raise into the code that logs
            self._collect(record)
        except Exception:
            self.handleError(record)

    def _collect(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        topic = getattr(record, "topic", None)
        tagged = _TAG.match(message)
        if topic is None and tagged:  # "[topic] message", as packages log disabled topics
            topic, message = tagged["topic"], message[tagged.end() :]
        section = _section_of(record.name, topic or _topic_of(record.name, message))
        self.report.records[section].append(f"[{record.name}] {message}")
        if section == "timings":
            for stage, sec in parse_timings(message):
                if stage != "total":
                    self.report.timings[stage] = self.report.timings.get(stage, 0.0) + sec


_TAG = re.compile(r"\[(?:kiln[:_ ]?)?(?P<topic>[a-z]+)\]\s*")


def _section_of(logger: str, topic: str) -> str:
    """Where a record goes: graphs of the compiler stages get their own sections."""
    if topic == "graphs" and not logger.startswith(("kiln_capture", "kiln.")):
        return "aot" if logger.startswith("kiln_aot") else "ir"
    return topic if topic in TOPICS else "other"


def parse_timings(message: str) -> list[tuple[str, float]]:
    """(stage, seconds) pairs of a timing log line; only values that carry a unit."""
    found = []
    for m in _TIMING.finditer(message):
        unit = m["unit1"] or m["unit2"]
        if unit is None:
            continue
        found.append((m["stage"].strip("'\" "), float(m["sec"]) / (1000 if unit == "ms" else 1)))
    return found


def _topic_of(logger: str, message: str) -> str:
    for topic in TOPICS:
        if logger.endswith("." + topic) or message.lower().startswith(topic.rstrip("s")):
            return topic
    return "other"


def _stage_of(name: str) -> str:
    for stage in STAGES:
        if (
            name == stage
            or name.startswith(stage + ".")
            or name.endswith("." + stage)
            or f".{stage}." in name
        ):
            return stage
    return "other"


def collect(script: str, argv: list[str]) -> Report:
    """Run ``script`` with ``argv`` under kiln's logging and a fresh debug directory."""
    report = Report(script, argv)
    debug_dir = Path(tempfile.mkdtemp(prefix="kiln-report-"))
    os.environ["KILN_DEBUG_DIR"] = str(debug_dir)
    os.environ.setdefault("KILN_LOG", ",".join(TOPICS))
    handler = _Collector(report)
    loggers = [
        logging.getLogger(n)
        for n in ("kiln", "kiln_capture", "kiln_aot", "kiln_inductor", "kiln_cpp", "kiln_triton")
    ]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    saved_argv = sys.argv
    sys.argv = [script, *argv]
    start = time.perf_counter()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        report.exit_status = f"exit {e.code}"
    except Exception as e:  # the report shows how far the script got
        report.exit_status = f"{type(e).__name__}: {e}"
    finally:
        report.wall_s = time.perf_counter() - start
        sys.argv = saved_argv
        for lg in loggers:
            lg.removeHandler(handler)
    for path in sorted(p for p in debug_dir.rglob("*") if p.is_file()):
        rel = str(path.relative_to(debug_dir))
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        report.files.setdefault(_stage_of(path.name), []).append((rel, text))
    return report


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;border-bottom:1px solid #ddd;padding-bottom:.2em}
pre{background:#f6f8fa;padding:.7em;overflow-x:auto;font:12px/1.4 ui-monospace,monospace}
summary{cursor:pointer;font-weight:600;margin:.3em 0}table{border-collapse:collapse}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}.bar{background:#4a7;height:.8em}
.muted{color:#777}
"""


# Each package logs its own wall time, and the outer stages include the inner ones:
# capture's frame time holds the backend (AOT + compiler); AOT's compile time holds the
# compiler's. The breakdown subtracts to get each stage's own share.
_BREAKDOWN = (
    ("capture", "frame", ("backend",)),
    ("AOT (trace, decompose, partition)", "compile", ("lower", "codegen", "build")),
    ("lowering + scheduling", "lower", ()),
    ("kernel codegen", "codegen", ()),
    ("C++ / Triton compiler", "build", ()),
    ("artifact cache load", "artifact-load", ()),
    ("artifact cache save", "artifact-save", ()),
    ("regional reuse (find blocks, stitch)", "regions", ()),
)


def stage_breakdown(timings: dict[str, float]) -> dict[str, float]:
    """Exclusive seconds per compile stage, from the summed timing log values."""
    out = {}
    for label, total, inner in _BREAKDOWN:
        if total in timings:
            out[label] = max(0.0, timings[total] - sum(timings.get(i, 0.0) for i in inner))
    return out


def regional_reuse_lines(report: Report) -> list[str]:
    """The blocks kiln-inductor compiled once and reused (regions.py), one line each."""
    lines = [r for section in report.records.values() for r in section]
    marker = "regional reuse: "
    blocks = [r[r.index(marker) + len(marker) :] for r in lines if marker in r]
    blocks = [b for b in blocks if "compiled once" in b]
    return blocks or ["none (off, or no graph had a repeated block)"]


def replayed_calls_line(report: Report) -> str:
    """Module calls kiln-capture traced once and replayed for identical later calls
    (call_reuse.py), by module class."""
    lines = [r for section in report.records.values() for r in section]
    classes: dict[str, int] = {}
    for r in lines:
        m = _REPLAYED.search(r)
        if m:
            classes[m["cls"]] = classes.get(m["cls"], 0) + 1
    if not classes:
        return "calls traced once: none replayed (off, or no module call repeated)"
    counts = ", ".join(f"{cls} x{n}" for cls, n in sorted(classes.items(), key=lambda kv: -kv[1]))
    return f"calls traced once: {sum(classes.values())} replayed ({counts})"


_REPLAYED = re.compile(r"call of .* \((?P<cls>[\w.]+)\): replayed ")


def artifact_cache_line(report: Report) -> str:
    """Hits and misses of kiln-inductor's artifact cache (graphs compiled in an earlier
    process and loaded, or compiled here), with the time spent loading."""
    lines = [r for section in report.records.values() for r in section]
    hits = sum("artifact cache hit" in r for r in lines)
    misses = sum("artifact cache miss" in r for r in lines)
    if not hits and not misses:
        return "artifact cache: not used (off, or no graph reached kiln's compiler)"
    load = report.timings.get("artifact-load", 0.0)
    return f"artifact cache: {hits} hit(s), {misses} miss(es), load {load:.3f} s"


def kept_captures_line(report: Report) -> str:
    """Frames whose whole capture an earlier process kept on disk (kiln-capture's
    frame_store.py): loaded without tracing, and of those how many compiled graphs came
    back from the backend's reload recipe without rebuilding the graph."""
    lines = [r for section in report.records.values() for r in section]
    loaded = sum("kept capture of " in r and "frame_s=" in r for r in lines)
    reloaded = sum("reloaded from its recipe" in r for r in lines)
    if not loaded:
        return "kept captures: none loaded (off, a first run, or the frames changed)"
    return (
        f"kept captures: {loaded} frame(s) loaded from disk without tracing, "
        f"{reloaded} compiled graph(s) reloaded without their graph"
    )


def render(report: Report) -> str:
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>kiln compile report: {esc(Path(report.script).name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>kiln compile report: {esc(report.script)}</h1>",
        f"<p id='summary'>arguments: <code>{esc(' '.join(report.argv)) or '(none)'}</code> · "
        f"wall time {report.wall_s:.2f} s · script: {esc(report.exit_status)} · "
        f"graphs: {sum(1 for r in report.records['graphs'] if 'captured graph' in r)} · "
        f"kernels: {sum(len(report.files.get(s, [])) for s in ('cpp', 'triton'))} · "
        f"graph breaks: {len(report.records['breaks'])} · "
        f"recompiles: {len(report.records['recompiles'])}</p>",
    ]
    sections = [
        ("graphs", "Captured graphs", "capture"),
        ("breaks", "Graph breaks", None),
        ("guards", "Guards", None),
        ("recompiles", "Recompiles", None),
        ("aot", "ATen graphs (forward / backward)", ("aot.fw", "aot.bw", "aot", "aten")),
        ("ir", "Loop-level IR and schedule", ("ir", "sched")),
        ("kernels", "Kernels", ("cpp", "triton", "wrapper")),
    ]
    for anchor, title, stages in sections:
        parts.append(f"<h2 id='{anchor}'>{esc(title)}</h2>")
        shown = 0
        for stage in (stages,) if isinstance(stages, str) else stages or ():
            for name, text in report.files.get(stage, []):
                parts.append(
                    f"<details><summary>{esc(name)}</summary><pre>{esc(text)}</pre></details>"
                )
                shown += 1
        lines = report.records.get(anchor, [])
        if lines:
            parts.append(f"<pre>{esc(chr(10).join(lines))}</pre>")
        if not shown and not lines:
            parts.append("<p class='muted'>none</p>")
    parts.append("<h2 id='timings'>Compile time by stage</h2>")
    parts.append(f"<p id='artifact-cache'>{esc(artifact_cache_line(report))}</p>")
    parts.append(f"<p id='kept-captures'>{esc(kept_captures_line(report))}</p>")
    parts.append(f"<p id='replayed-calls'>{esc(replayed_calls_line(report))}</p>")
    reuse = "".join(f"<li>{esc(line)}</li>" for line in regional_reuse_lines(report))
    parts.append(
        f"<p>regional reuse (blocks compiled once):</p><ul id='regional-reuse'>{reuse}</ul>"
    )
    stages = stage_breakdown(report.timings)
    if stages:
        top = max(stages.values()) or 1.0
        parts.append("<table><tr><th>stage</th><th>seconds</th><th></th></tr>")
        for stage, sec in stages.items():
            parts.append(
                f"<tr><td>{esc(stage)}</td><td>{sec:.3f}</td>"
                f"<td><div class='bar' style='width:{200 * sec / top:.0f}px'></div></td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p class='muted'>no timings were logged</p>")
    if report.records["other"]:
        parts.append("<h2 id='log'>Other log lines</h2>")
        parts.append(f"<details><summary>{len(report.records['other'])} lines</summary>")
        parts.append(f"<pre>{esc(chr(10).join(report.records['other']))}</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: python -m kiln report [-o report.html] script.py [args...]")
        return 0 if argv else 2
    out = Path("kiln_report.html")
    if argv[0] == "-o":
        out, argv = Path(argv[1]), argv[2:]
    report = collect(argv[0], argv[1:])
    out.write_text(render(report))
    print(f"kiln report: {out} ({report.wall_s:.1f} s, script {report.exit_status})")
    return 0
