"""kiln-aot partitioning benchmark: bytes saved for backward, and trace time.

    python benchmarks/aot_partition.py            # table + benchmarks/results/aot_partition.json
    python benchmarks/aot_partition.py --quick    # smaller models (a smoke run)

For a GELU MLP and a pre-norm transformer block (train mode, dropout on) it measures the
bytes of the tensors kept for the backward by

- eager autograd,
- kiln's ``save_all_partition`` (save every forward value the backward reads),
- kiln's ``min_cut_partition`` (max-flow/min-cut with recomputation of cheap ops),
- torch's own AOTAutograd min-cut partitioner (the reference peer, when importable),

all measured the same way: ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor
saved during one forward (autograd nodes' saved tensors, or the compiled
``autograd.Function``'s ``save_for_backward``), and bytes are summed over distinct storages
(a view shares its base's bytes). Compiled graphs run eagerly (no kernels: the figures are
about what is saved, not speed). It checks outputs and gradients against eager too.

It also times tracing a 12-layer small transformer (inference graph, joint graph) and the
min-cut partition of that joint graph.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "packages" / "kiln-aot" / "tests"))

from models import Block, GeluMLP, TinyTransformer  # noqa: E402  (kiln-aot's test models)

import kiln_aot  # noqa: E402
from kiln_aot.joint import trace_joint  # noqa: E402
from kiln_aot.module_state import state_names, state_tensors, swapped_state  # noqa: E402


def eager_compiler(gm, example_inputs):
    kiln_aot.verify_graph(gm)
    return gm


def saved_storage_bytes(run):
    """(bytes over distinct storages, number of saved tensors, output) of one forward."""
    storages: dict[int, int] = {}
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return sum(storages.values()), count, out


def torch_min_cut(model):
    """torch's AOTAutograd with its min-cut partitioner (the peer), graphs run eagerly."""
    try:
        from functorch.compile import (
            aot_module,
            make_boxed_func,
            min_cut_rematerialization_partition,
        )
    except ImportError:
        return None
    return aot_module(
        model, lambda gm, _: make_boxed_func(gm), partition_fn=min_cut_rematerialization_partition
    )


def measure(name, model, make_input):
    torch.manual_seed(0)
    x = make_input()
    variants = {"eager": model}
    for label, pf in (
        ("save_all", kiln_aot.save_all_partition),
        ("min_cut", kiln_aot.min_cut_partition),
    ):
        variants[label] = kiln_aot.aot_module(copy.deepcopy(model), eager_compiler, partition_fn=pf)
    peer = torch_min_cut(copy.deepcopy(model))
    if peer is not None:
        variants["torch_min_cut"] = peer
    row = {"model": name}
    ref_out = ref_grads = None
    for label, m in variants.items():
        m(x)  # compile outside the measurement (and warm up)
        torch.manual_seed(1)
        nbytes, count, out = saved_storage_bytes(lambda m=m: m(x))
        g = torch.ones_like(out)
        out.backward(g)
        params = list((m.orig_module if hasattr(m, "orig_module") else m).parameters())
        grads = [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        if ref_out is None:
            ref_out, ref_grads = out.detach(), grads
        else:
            torch.testing.assert_close(out.detach(), ref_out, rtol=1e-5, atol=1e-5)
            for a, b in zip(grads, ref_grads):
                torch.testing.assert_close(
                    a, b, rtol=1e-4, atol=1e-4
                )  # sums over 1k tokens: reordering
        row[label] = {"bytes": nbytes, "tensors": count}
    return row


def trace_times(layers, width, seq, batch, repeats):
    model = TinyTransformer(vocab=256, d=width, layers=layers, heads=4, p=0.1, seq=seq).train()
    idx = torch.randint(0, 256, (batch, seq))
    names = state_names(model)
    params = state_tensors(model, names)

    def flat_fn(*flat):
        with swapped_state(model, names, flat[: len(names)]):
            return model(*flat[len(names) :])

    flat = [*params, idx]
    rg = [isinstance(a, torch.Tensor) and a.requires_grad for a in flat]
    fw_t, joint_t, part_t = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gm = kiln_aot.trace(flat_fn, flat)
        fw_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        joint, info = trace_joint(flat_fn, flat, rg)
        joint_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        kiln_aot.min_cut_partition(joint, flat, num_fwd_outputs=info.num_fwd_outputs)
        part_t.append(time.perf_counter() - t0)
    return {
        "layers": layers,
        "width": width,
        "seq": seq,
        "batch": batch,
        "inference_nodes": len(gm.graph.nodes),
        "joint_nodes": len(joint.graph.nodes),
        "trace_inference_s": statistics.median(fw_t),
        "trace_joint_s": statistics.median(joint_t),
        "min_cut_partition_s": statistics.median(part_t),
    }


def mib(n):
    return f"{n / 2**20:8.3f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small models, one repeat")
    ap.add_argument("--out", default=str(ROOT / "results" / "aot_partition.json"))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    if args.quick:
        mlp, mlp_in = GeluMLP(64, 256), lambda: torch.randn(32, 64)
        block, block_in = Block(64, 4, 0.1).train(), lambda: torch.randn(4, 32, 64)
        tt = dict(layers=12, width=32, seq=16, batch=2, repeats=1)
    else:
        mlp, mlp_in = GeluMLP(256, 1024), lambda: torch.randn(256, 256)
        block, block_in = Block(256, 8, 0.1).train(), lambda: torch.randn(8, 128, 256)
        tt = dict(layers=12, width=64, seq=64, batch=4, repeats=3)
    rows = [measure("gelu_mlp", mlp, mlp_in), measure("transformer_block", block, block_in)]
    labels = [k for k in ("eager", "save_all", "min_cut", "torch_min_cut") if k in rows[0]]
    print("bytes saved for backward (MiB over distinct storages; tensors saved in parentheses)")
    print(f"{'model':<20}" + "".join(f"{label:>22}" for label in labels) + f"{'min_cut/eager':>15}")
    for r in rows:
        cells = "".join(f"{mib(r[k]['bytes'])} ({r[k]['tensors']:3d})".rjust(22) for k in labels)
        print(f"{r['model']:<20}{cells}{r['min_cut']['bytes'] / r['eager']['bytes']:>15.3f}")
        r["min_cut_below_eager"] = r["min_cut"]["bytes"] < r["eager"]["bytes"]
    times = trace_times(**tt)
    print(
        f"\ntrace time, {times['layers']}-layer transformer (width {times['width']}, seq {times['seq']}, batch {times['batch']}): "
        f"inference graph {times['trace_inference_s']:.3f}s ({times['inference_nodes']} nodes), "
        f"joint graph {times['trace_joint_s']:.3f}s ({times['joint_nodes']} nodes), "
        f"min-cut partition {times['min_cut_partition_s']:.3f}s"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "torch": torch.__version__,
        "kiln_aot": kiln_aot.__version__,
        "saved_bytes": rows,
        "trace": times,
    }
    out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {out}")
    if not all(r["min_cut_below_eager"] for r in rows):
        print("min_cut did NOT save fewer bytes than eager on every model", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
