"""Compile kernel sources for a GPU target without a GPU (run as a script, with
TRITON_INTERPRET unset): ``python compile_for_gpu.py kernels.json [arch]``.

``kernels.json`` holds ``[{"source": ..., "meta": ...}, ...]`` (KernelSource fields). Each
kernel is compiled by Triton's real compiler (TTIR → PTX → cubin through the bundled
ptxas) for every candidate launch configuration, with pointers specialized as 16-byte
aligned as at run time. Prints one JSON line per kernel: its configs' registers, spills
and vector widths, or the error.

A kernel with size arguments (``meta["size_args"]``) is compiled for the sizes in the
entry's ``"sizes"`` (default: each 4095), specialized as Triton's JIT would specialize
those values (1 a constant, int32 or int64, divisibility by 16), with the candidate
configurations of their size bucket, as the function the launcher runs there (``kernel``
or ``kernel_persistent``: ``SizedMeta.at``).
"""

from __future__ import annotations

import json
import os
import re
import sys

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "unset TRITON_INTERPRET"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kiln_triton.config import read_triton_config  # noqa: E402
from kiln_triton.runtime.buckets import SizedMeta, bucket_of  # noqa: E402
from kiln_triton.runtime.configs import candidate_configs  # noqa: E402
from kiln_triton.runtime.launcher import load_module, source_key  # noqa: E402
from kiln_triton.runtime.template import matmul_configs  # noqa: E402

TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64",
         "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
         "bool": "i1"}  # fmt: skip


def size_specialization(names, values):
    """Signature entries, constexprs and attributes of int size arguments at ``values``."""
    sig, constexprs, attrs = {}, {}, {}
    for name, v in zip(names, values):
        if v == 1:
            sig[name], constexprs[name] = "constexpr", 1
            continue
        sig[name] = "i32" if -(2**31) <= v < 2**31 else "i64"
        if v % 16 == 0:
            attrs[name] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def main() -> None:
    kernels = json.load(open(sys.argv[1]))
    arch = int(sys.argv[2]) if len(sys.argv) > 2 else 90
    cfg = read_triton_config()
    for k in kernels:
        module = load_module(k["source"], source_key(k["source"], cfg))
        fn = module.kernel
        n = len(k["meta"]["arg_dtypes"])
        sig = {name: "*" + TYPES[t] for name, t in zip(fn.arg_names, k["meta"]["arg_dtypes"])}
        template = k["meta"]["kind"] == "mm_template"
        blocks = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M") if template else ("XBLOCK", "RBLOCK")
        sig |= {b: "constexpr" for b in blocks}
        meta, size_const, size_attrs = k["meta"], {}, {}
        if meta.get("size_args"):
            sizes = k.get("sizes") or [4095] * len(meta["size_args"])
            size_sig, size_const, size_attrs = size_specialization(meta["size_args"], sizes)
            sig |= size_sig
            meta = SizedMeta(meta).at(bucket_of(sizes))
            fn = getattr(module, meta["variant"])
        configs = matmul_configs(meta, False) if template else candidate_configs(meta, False)
        index = {name: i for i, name in enumerate(fn.arg_names)}
        report: dict = {"kind": meta["kind"], "configs": []}
        try:
            for c in configs:
                src = ASTSource(
                    fn,
                    sig,
                    constexprs={
                        **size_const,
                        **{b: getattr(c, b) for b in blocks},
                    },
                    attrs={
                        **{(i,): [["tt.divisibility", 16]] for i in range(n)},
                        **{(index[s],): a for s, a in size_attrs.items()},
                    },
                )
                ck = triton.compile(
                    src,
                    target=GPUTarget("cuda", arch, 32),
                    options={"num_warps": c.num_warps, "num_stages": c.num_stages},
                )
                ptx = ck.asm["ptx"]
                report["configs"].append({
                    "config": c.as_dict(),
                    "vector_loads": len(re.findall(r"ld\.global(?:\.[\w:]+)*\.v[248]", ptx)),
                    "loads": len(re.findall(r"ld\.global", ptx)),
                    "mma": len(re.findall(r"wgmma|mma\.sync", ptx)),
                })  # fmt: skip
        except Exception as e:  # reported, the test fails on it
            report["error"] = f"{type(e).__name__}: {str(e)[-600:]}"
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
