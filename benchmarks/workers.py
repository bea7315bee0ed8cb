"""Running a benchmark's rows in worker processes: each row's progress is streamed as it
happens (a row that runs out of time still says how far it got) and its result is returned
as soon as it exists, so a suite cut short by a time limit keeps every finished row."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

_START = time.perf_counter()


def progress(msg: str) -> None:
    """A worker's progress line, with the seconds since the worker started."""
    print(f"  [{time.perf_counter() - _START:7.1f}s] {msg}", file=sys.stderr, flush=True)


def result(res: dict) -> None:
    """A worker's result (the last thing it prints)."""
    print("RESULT " + json.dumps(res), flush=True)


def run_worker(cmd: list[str], timeout: float | None = None, env=None) -> dict:
    """Run one worker; its stderr goes through to ours line by line. Returns the worker's
    RESULT, or ``{"error": ...}`` with its last stderr line (or the timeout)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    last: list[str] = []

    def pump() -> None:
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if line.strip():
                last[:] = [line.strip()]

    out: list[str] = []
    threads = [
        threading.Thread(target=pump, daemon=True),
        threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"error": f"timed out after {timeout:.0f} s (last: {last[0] if last else '-'})"}
    for t in threads:
        t.join(timeout=5)
    for line in out:
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": last[0] if last else f"exit status {proc.returncode}"}
