"""torch's OpInfo database through kiln, against eager: how many ops compile and are right.

    python benchmarks/opinfo_sweep.py                                  # every compiler below
    python benchmarks/opinfo_sweep.py --compilers kiln --ops add,cumprod,fmax
    python benchmarks/opinfo_sweep.py --limit 100                      # the first 100 ops

Every OpInfo with float32 CPU support, up to ``--samples`` sample inputs each; a case is
``op(sample.input, *sample.args, **sample.kwargs)`` as a function of its tensors. Compilers:

- ``kiln``: ``kiln.compile(fn, options={"raise_on_error": True})`` (kiln's capture and
  compiler; an error is a failure, never an eager run); a pass also needs a graph built and
  no graph falling back;
- ``kiln-cpp@torch``: ``torch.compile(fn, backend=kiln_cpp.compile_fx)`` (kiln's compiler
  under torch's capture);
- ``kiln-triton@torch``: the same with kiln-triton's code generator under Triton's
  interpreter (``TRITON_INTERPRET=1`` in its worker);
- ``torch.compile``: the reference (``backend="inductor"``).

A case is ``pass`` (matches eager: values with torch's default tolerances, NaNs equal,
dtypes and shapes), ``wrong`` (a result that does not match), ``error`` (the compiler
raised), ``eager`` (kiln built no graph, or a graph fell back), ``eager-error`` (eager itself
raised), ``random`` (eager's result depends on the RNG, or is uninitialized memory:
``empty*``) and ``no-op`` (kiln captured the case whole, no break and no frame run
eagerly, and it holds no tensor op: ``torch.broadcast_shapes``, ``torch.equal`` of tensors
of different shapes; no compiler can build a graph for it): the last three are not
counted, and the table says how many there were. Each compiler runs in worker
processes (chunks of ops; a crash is recorded for its case and the run goes on). The
table gives pass rates over the cases eager runs, and kiln's rate relative to the cases
torch.compile passes; JSON with every failure goes to benchmarks/results/opinfo_<compiler>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
# statuses of cases no compiler is judged on; "no-op": kiln captured the whole case (no
# break, no frame run eagerly) and found no tensor op to compile (torch.broadcast_shapes,
# torch.equal of tensors of different shapes): no compiler can build a graph for it
NOT_COUNTED = ("eager-error", "random", "no-op")
COMPILERS = ("kiln", "kiln-cpp@torch", "kiln-triton@torch", "torch.compile")


def _cases(ops_filter: set[str] | None, limit: int, samples: int):
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    chosen = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]
    if ops_filter:
        chosen = [
            op
            for op in chosen
            if op.name in ops_filter or f"{op.name}.{op.variant_test_name}" in ops_filter
        ]
    if limit:
        chosen = chosen[:limit]
    return chosen


def _case_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _as_function(op, sample):
    """(fn, tensors): fn(*tensors) calls the op on the sample, every tensor an argument."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    where = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    tensors = [leaves[k] for k in where]

    def fn(*ts):
        values = list(leaves)
        for k, t in zip(where, ts):
            values[k] = t
        inp, args, kwargs = tree_unflatten(values, spec)
        return op(inp, *args, **kwargs)

    return fn, tensors


def _compile(name: str, fn):
    import torch

    if name == "kiln":
        import kiln

        return kiln.compile(fn, options={"raise_on_error": True})
    if name == "kiln-cpp@torch":
        import kiln_cpp

        return torch.compile(fn, backend=kiln_cpp.compile_fx)
    if name == "kiln-triton@torch":
        import kiln_triton

        return torch.compile(fn, backend=kiln_triton.compile_fx)
    return torch.compile(fn)


def _compare(got, want) -> str | None:
    import torch
    from torch.utils._pytree import tree_flatten

    g, _ = tree_flatten(got)
    w, _ = tree_flatten(want)
    if len(g) != len(w):
        return f"{len(g)} outputs, eager {len(w)}"
    for a, b in zip(g, w):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"got {type(a).__name__}, eager a tensor"
            try:
                torch.testing.assert_close(a, b, equal_nan=True, check_stride=False)
            except AssertionError as e:
                return " ".join(str(e).split())[:300]
        elif a != b and not (a != a and b != b):
            return f"{a!r} != {b!r}"
    return None


def worker(compiler: str, names: list[str], samples: int) -> None:
    import warnings

    import torch

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    backend = None
    if compiler == "kiln-triton@torch":
        from kiln_triton.testing import use_triton_for_cpu

        backend = use_triton_for_cpu()
        backend.__enter__()
    import torch._dynamo

    for op in _cases(set(names), 0, samples):
        for k, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=False)):
            if k >= samples:
                break
            case = f"{_case_name(op)}#{k}"
            print(f"BEGIN {case}", flush=True)
            res = {"case": case, "op": _case_name(op)}
            fn, tensors = _as_function(op, sample)
            try:
                torch.manual_seed(0)
                want = fn(*[t.clone() for t in tensors])
                torch.manual_seed(1)
                again = fn(*[t.clone() for t in tensors])
            except Exception as e:
                res.update(status="eager-error", detail=f"{type(e).__name__}: {e}"[:200])
                print("RESULT " + json.dumps(res), flush=True)
                continue
            if op.name.startswith(("empty", "new_empty")):  # uninitialized memory
                res.update(status="random", detail="the op returns uninitialized memory")
                print("RESULT " + json.dumps(res), flush=True)
                continue
            if _compare(again, want) is not None:  # random values: nothing to compare
                res.update(status="random", detail="eager's result depends on the RNG")
                print("RESULT " + json.dumps(res), flush=True)
                continue
            torch.manual_seed(0)
            torch._dynamo.reset()
            stats0 = None
            if compiler == "kiln":
                import kiln

                kiln.reset()
            try:
                got = _compile(compiler, fn)(*[t.clone() for t in tensors])
                bad = _compare(got, want)
                if compiler == "kiln" and bad is None:
                    stats0 = kiln.stats()
                    if stats0["graphs"] == 0 and not (stats0["breaks"] or stats0["eager_frames"]):
                        res.update(status="no-op", detail="captured whole: no tensor op to compile")
                        print("RESULT " + json.dumps(res), flush=True)
                        continue
                    if stats0["graphs"] == 0:
                        bad = "no graph was built (the case ran eagerly)"
                    elif stats0["fallbacks"]:
                        bad = "a graph fell back to eager"
                res.update(status="pass" if bad is None else "wrong", detail=bad or "")
                if bad and bad.startswith(("no graph", "a graph fell")):
                    res["status"] = "eager"
            except Exception as e:
                while getattr(e, "inner_exception", None) or e.__cause__:  # torch wraps errors
                    e = getattr(e, "inner_exception", None) or e.__cause__
                tb = traceback.extract_tb(e.__traceback__)
                where = next(
                    (
                        f"{f.filename.split('/src/')[-1]}:{f.lineno}"
                        for f in reversed(tb)
                        if "/packages/" in f.filename
                    ),
                    "",
                )
                res.update(
                    status="error",
                    kind=type(e).__name__,
                    detail=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300],
                    where=where,
                )
            print("RESULT " + json.dumps(res), flush=True)


def run(compiler: str, ops: list[str], samples: int, chunk: int, timeout: int) -> list[dict]:
    results: list[dict] = []
    env = dict(os.environ)
    if compiler == "kiln-triton@torch":
        env["TRITON_INTERPRET"] = "1"
    t0 = time.monotonic()
    for start in range(0, len(ops), chunk):
        todo = ops[start : start + chunk]
        while todo:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                compiler,
                "--samples",
                str(samples),
                "--ops",
                ",".join(todo),
            ]
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
            )
            running, done_ops = None, set()
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if line.startswith("BEGIN "):
                        running = line.split()[1]
                    elif line.startswith("RESULT "):
                        r = json.loads(line[7:])
                        results.append(r)
                        done_ops.add(r["op"])
                        running = None
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
            if running is None:
                break
            op = running.split("#")[0]
            results.append(
                {
                    "case": running,
                    "op": op,
                    "status": "error",
                    "kind": "crash",
                    "detail": f"the worker died (exit {proc.returncode})",
                }
            )
            todo = todo[todo.index(op) + 1 :] if op in todo else []
        n = len({r["op"] for r in results})
        print(
            f"[{compiler}] {n}/{len(ops)} ops, {len(results)} cases, {time.monotonic() - t0:.0f}s",
            file=sys.stderr,
            flush=True,
        )
    return results


def summarize(results: list[dict]) -> dict:
    counted = [r for r in results if r["status"] not in NOT_COUNTED]
    by = {s: sum(r["status"] == s for r in counted) for s in ("pass", "wrong", "error", "eager")}
    kinds: dict[str, int] = {}
    for r in counted:
        if r["status"] in ("error", "eager"):
            key = r.get("kind") or r["status"]
            kinds[key] = kinds.get(key, 0) + 1
    return {
        "cases": len(counted),
        **by,
        "rate": by["pass"] / max(len(counted), 1),
        "error_kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--ops", default="")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--chunk", type=int, default=40, help="ops per worker process")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per worker")
    p.add_argument("--worker", default="")
    p.add_argument(
        "--out",
        default="",
        help="folder for the JSON results (default benchmarks/results; a subset's run "
        "belongs elsewhere, e.g. /tmp)",
    )
    a = p.parse_args()
    ops_filter = {o for o in a.ops.split(",") if o}
    if a.worker:
        worker(a.worker, sorted(ops_filter), a.samples)
        return 0
    ops = [_case_name(op) for op in _cases(ops_filter or None, a.limit, a.samples)]
    out_dir = Path(a.out) if a.out else HERE / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = {}
    all_results = {}
    for c in [c for c in a.compilers.split(",") if c]:
        res = run(c, ops, a.samples, a.chunk, a.timeout)
        all_results[c] = res
        summaries[c] = summarize(res)
        (out_dir / f"opinfo_{c.replace('@', '_at_')}.json").write_text(
            json.dumps({"summary": summaries[c], "results": res}, indent=1)
        )
    reference = all_results.get("torch.compile")
    tc_file = HERE / "results" / "opinfo_torch.compile.json"
    if reference is None and tc_file.exists():  # torch.compile's results from an earlier run
        reference = json.loads(tc_file.read_text())["results"]
    ref = {r["case"] for r in reference or [] if r["status"] == "pass"}
    print(
        f"{'compiler':20} {'cases':>6} {'pass':>6} {'rate':>7} {'wrong':>6} {'error':>6} {'eager':>6} {'of tc passes':>13}"
    )
    for c, s in summaries.items():
        rel = ""
        if ref and c != "torch.compile":
            # over the cases both count (an uninitialized or RNG result, or eager raising,
            # in either run is not a case)
            ok = {r["case"] for r in all_results[c] if r["status"] == "pass"}
            both = ref - {r["case"] for r in all_results[c] if r["status"] in NOT_COUNTED}
            rel = f"{len(ok & both) / max(len(both), 1):.1%}"
        print(
            f"{c:20} {s['cases']:6d} {s['pass']:6d} {s['rate']:7.1%} {s['wrong']:6d} {s['error']:6d} {s['eager']:6d} {rel:>13}"
        )
        print(f"{'':20} failures by kind: {s['error_kinds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
