"""Print which ATen ops kiln-inductor lowers to its IR, calls as extern kernels, or runs
eagerly as fallbacks; with --core, the status of every op of kiln-aot's declared set.

    python tools/print_lowerings.py [--core] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

import kiln_inductor  # noqa: F401  (registers the lowerings)
from kiln_inductor.lowering.registry import EXTERN_OPS, FALLBACK_OPS, LOWERINGS


def status(op: object) -> str:
    if op in EXTERN_OPS:
        return "extern"
    if op in FALLBACK_OPS:
        return "fallback"
    if op in LOWERINGS:
        return "lowered"
    return "fallback (no lowering)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--core", action="store_true", help="only kiln-aot's CORE_ATEN_OPS and KEPT_OPS"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.core:
        import kiln_aot

        ops = sorted(set(kiln_aot.CORE_ATEN_OPS) | set(kiln_aot.KEPT_OPS), key=str)
    else:
        ops = sorted(set(LOWERINGS) | EXTERN_OPS | set(FALLBACK_OPS), key=str)
    table = {str(op): status(op) for op in ops}
    if args.json:
        json.dump(table, sys.stdout, indent=1)
        print()
        return 0
    for kind in ("lowered", "extern", "fallback", "fallback (no lowering)"):
        names = [name for name, s in table.items() if s == kind]
        print(f"== {kind}: {len(names)}")
        for name in names:
            reason = ""
            if kind == "fallback":
                op = next(o for o in ops if str(o) == name)
                reason = f"   ({FALLBACK_OPS[op]})"
            print(f"  {name}{reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
