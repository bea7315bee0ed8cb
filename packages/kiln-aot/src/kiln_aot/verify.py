"""``verify_graph``: check that a graph meets the ATen-level graph contract (run between
stages in tests, and by compilers that want to fail early)."""

from __future__ import annotations

import torch
from torch import fx

from kiln_aot import core_ops
from kiln_aot.errors import KilnAotError


class ContractViolation(KilnAotError):
    """A graph handed across the kiln-aot -> compiler boundary breaks the contract."""


def verify_graph(gm: fx.GraphModule) -> None:
    """Raise ``ContractViolation`` unless every node targets a core/kept ATen overload (or
    ``operator.getitem``, or a library op kept whole: ``meta["kiln_library_op"]``), none writes to its arguments, and every value node has
    ``meta["val"]``; the graph must return a tuple."""
    problems = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            if not core_ops.is_allowed(n.target) and not (
                n.meta.get("kiln_library_op") and core_ops.is_library_callable(n.target)
            ):
                problems.append(f"{n.name}: {n.target} is not in the core set or KEPT_OPS")
            elif isinstance(n.target, torch._ops.OpOverload) and core_ops.is_inplace(n.target):
                problems.append(f"{n.name}: {n.target} mutates its arguments")
        elif n.op in ("call_module", "call_method"):
            problems.append(f"{n.name}: {n.op} nodes are not allowed")
        if n.op in ("placeholder", "call_function", "get_attr") and "val" not in n.meta:
            problems.append(f"{n.name}: no meta['val']")
        if n.op == "output" and not isinstance(n.args[0], (tuple, list)):
            problems.append("the graph does not return a tuple")
    if problems:
        raise ContractViolation("graph breaks the ATen graph contract:\n  " + "\n  ".join(problems))
