"""fill_meta: every node's ``meta['val']`` from running the graph on the meta device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from kiln_shapes.unbacked import RULES

from ..errors import LoweringError


def fill_meta(
    gm: torch.fx.GraphModule,
    recompute: bool = False,
    adjust: Callable[[torch.fx.Node, Any], Any] | None = None,
) -> None:
    """Give every node a ``meta['val']`` by running the graph on the meta device
    (``recompute``: every computed node's, after a pass changed the graph; ``adjust`` may
    replace a node's result, where the real kernel's strides differ from the meta one's)."""
    if not recompute and all("val" in n.meta for n in gm.graph.nodes if n.op not in ("output",)):
        return
    env: dict[torch.fx.Node, Any] = {}

    def to_meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x

    for n in gm.graph.nodes:
        if n.op == "placeholder":
            if "val" not in n.meta:
                raise LoweringError(
                    f"placeholder {n.name}",
                    "it has no meta['val'] and no example input was given",
                    "pass example_inputs to compile_aten_graph",
                    n,
                )
            env[n] = to_meta(n.meta["val"])
        elif n.op == "get_attr":
            env[n] = to_meta(getattr(gm, n.target))
            n.meta.setdefault("val", env[n])
        elif n.op == "call_function" and "val" in n.meta and (not recompute or n.target in RULES):
            # a value the graph already has; a data-dependent op's (nonzero, .item()) is
            # sized by unbacked symbols that running it on meta could not make again
            env[n] = n.meta["val"]
        elif n.op == "call_function":
            args = torch.fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
            schema = getattr(n.target, "_schema", None)
            if schema is not None and any(a.name == "device" for a in schema.arguments):
                kwargs = {**kwargs, "device": "meta"}  # factories: compute metadata only
            out = n.target(*args, **kwargs)
            if adjust is not None:
                out = adjust(n, out)
            env[n] = out
            if recompute:
                n.meta["val"] = out
            else:
                n.meta.setdefault("val", out)
    # device of factory outputs: the device of the inputs
    return
