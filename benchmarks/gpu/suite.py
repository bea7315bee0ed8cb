"""The GPU model suite spread over every GPU of the machine, then one table per dtype.

    python benchmarks/gpu/suite.py [--models a,b] [--dtypes bfloat16,float32] [--train gpt2]

Each job is one benchmarks/models.py run (one model, one dtype; eager vs torch.compile vs
kiln in one process, as models.py does) pinned to one GPU with CUDA_VISIBLE_DEVICES; a
free GPU takes the next job. On a one-GPU machine the jobs simply run in turn. The models
listed in --train also run forward+backward. JSON per job and the merged tables go to
--out ($OUT on the device machine).

Jobs on different GPUs share the host's CPU cores, and with --per-gpu > 1 jobs share a GPU
(to fit a time budget: most of a job is compiling), so timings are taken with other
processes running; models.py interleaves its eager and compiled rounds, which keeps the
ratios fair when the load varies. The table header says how the jobs ran.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

MODELS = (
    "gpt2,bert,llama,t5,hf_vit,hf_convnext,timm_resnet50,timm_convnext_tiny,"
    "timm_vit_small_patch16_224,timm_efficientnet_b0,timm_mixer_b16_224,mlp_mixer"
)


def main() -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", default=MODELS)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--train", default="gpt2", help="models also run forward+backward (float32)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--timeout", type=int, default=240, help="seconds per job")
    p.add_argument("--per-gpu", type=int, default=1, help="jobs sharing one GPU at once")
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results" / "gpu")))
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = max(torch.cuda.device_count(), 1)
    jobs: queue.Queue = queue.Queue()
    train = {m for m in a.train.split(",") if m}
    for dtype in a.dtypes.split(","):
        for m in a.models.split(","):
            jobs.put((m, dtype, m in train and dtype == "float32"))
    total = jobs.qsize()
    done: list[Path] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def work(gpu: int) -> None:
        while True:
            try:
                m, dtype, with_train = jobs.get_nowait()
            except queue.Empty:
                return
            path = out / f"models_cuda_{dtype}_{m}{'_train' if with_train else ''}.json"
            cmd = [
                sys.executable, str(HERE / "models.py"), "--device", "cuda", "--dtype", dtype,
                "--models", m, "--runs", str(a.runs), "--timeout", str(a.timeout),
                "--no-warm", "--out", str(path),
            ] + (["--train"] if with_train else [])  # fmt: skip
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
            log = (out / f"{path.stem}.log").open("w")
            subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
            with lock:
                done.append(path)
                print(
                    f"[{len(done)}/{total}] {m} {dtype}{' +train' if with_train else ''} "
                    f"on GPU {gpu} ({time.perf_counter() - t0:.0f}s)",
                    flush=True,
                )

    threads = [threading.Thread(target=work, args=(t % gpus,)) for t in range(gpus * a.per_gpu)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    from models import print_table

    merged: dict[str, list[dict]] = {}
    for path in sorted(done):
        if path.exists():
            data = json.loads(path.read_text())
            merged.setdefault(data["dtype"], []).extend(data["results"])
    text = []
    for dtype, results in merged.items():
        order = {m: i for i, m in enumerate(a.models.split(","))}
        results.sort(key=lambda r: (r.get("task", ""), order.get(r["model"], 99)))
        print(f"\n== cuda {dtype} ({gpus} GPU(s), {a.per_gpu} job(s) per GPU at once)")
        text.append(f"== cuda {dtype}\n" + print_table(results))
    (out / "suite.json").write_text(json.dumps(merged, indent=1))
    (out / "suite.txt").write_text("\n\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
