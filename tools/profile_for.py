"""Profile a Python script for at most N seconds and print where the time went (top
functions by cumulative and by own time), whether the script finishes or not:

    python tools/profile_for.py 120 benchmarks/generate.py --worker gpt2 kiln --device cuda

For runs that are too slow to finish under a time limit (the device tool's): the profile of
the part that ran is the answer to "where does it spend its time"."""

from __future__ import annotations

import cProfile
import pstats
import runpy
import signal
import sys


class _OutOfTime(BaseException):
    pass


def _alarm(signum, frame):
    raise _OutOfTime


def main() -> None:
    seconds, script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, str(__import__("pathlib").Path(script).resolve().parent))
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(float(seconds)))
    prof = cProfile.Profile()
    status = "finished"
    try:
        prof.runcall(runpy.run_path, script, run_name="__main__")
    except _OutOfTime:
        status = f"stopped after {seconds} s"
    except SystemExit:
        pass
    signal.alarm(0)
    print(f"\n[profile_for] {script}: {status}", file=sys.stderr)
    stats = pstats.Stats(prof, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
