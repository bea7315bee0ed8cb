"""kiln's persistent artifact cache on the GPU: the same Triton graph (an embedding with
its index check, a layer norm, a gather) compiled in one fresh process and loaded in a
second one, which must hit the cache, match eager, and still raise eager's error for a
bad index (the error rows are rebuilt on load):

    python3 benchmarks/gpu/artifact_check.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

DEV = os.environ.get("KILN_CHECK_DEVICE", "cuda")  # cpu: a dry run of the script


def child() -> None:
    import torch
    import torch.nn.functional as F

    import kiln
    from kiln_inductor.runtime.artifacts import STATS

    def fn(ids, w, b, idx):
        h = F.layer_norm(F.embedding(ids, w), (w.shape[1],), bias=b) * 2
        return h + torch.gather(h, 1, idx)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (4, 16), generator=g).to(DEV)
    w = torch.randn(100, 64, generator=g).to(DEV)
    b = torch.randn(64, generator=g).to(DEV)
    idx = torch.randint(0, 16, (4, 16, 64), generator=g).to(DEV)
    compiled = kiln.compile(fn)
    ok = torch.allclose(compiled(ids, w, b, idx), fn(ids, w, b, idx), atol=1e-5, rtol=1e-5)
    bad = ids.clone()
    bad[1, 3] = 100000
    try:
        compiled(bad, w, b, idx)
        raised = "nothing"
    except IndexError as e:
        raised = "IndexError: " + str(e).splitlines()[0]
    except RuntimeError as e:
        raised = "RuntimeError: " + str(e).splitlines()[0]
    again = torch.allclose(compiled(ids, w, b, idx), fn(ids, w, b, idx), atol=1e-5, rtol=1e-5)
    if DEV == "cuda":
        torch.cuda.synchronize()
    stats = kiln.stats()
    print(
        json.dumps(
            {
                "equal": ok,
                "bad index": raised,
                "equal after": again,
                "hits": STATS.hits,
                "misses": STATS.misses,
                "saves": STATS.saves,
                "graphs": stats["graphs"],
                "fallbacks": stats["fallbacks"],
            }
        )
    )


def main() -> int:
    env = dict(os.environ, KILN_ARTIFACT_CACHE="1")
    env["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-artifacts-")
    results = []
    for run in ("cold", "warm"):
        p = subprocess.run(
            [sys.executable, __file__, "child"], env=env, capture_output=True, text=True
        )
        line = (p.stdout.strip().splitlines() or ["{}"])[-1]
        print(f"{run}: {line}" if p.returncode == 0 else f"{run}: FAILED\n{p.stderr[-2000:]}")
        results.append(json.loads(line) if p.returncode == 0 else None)
    good = (
        all(results)
        and results[1]["hits"] >= 1
        and all(
            r["equal"] and r["equal after"] and r["bad index"].startswith("IndexError")
            for r in results
        )
    )
    print("artifact cache on the GPU:", "ok" if good else "FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        child()
    else:
        sys.exit(main())
