"""ATen graphs as plain data, and back: what a persistent cache keeps of a graph it may
have to compile again in another process (the backward, for new tangent strides).

# Plain data

``graph_data(gm)`` is a dict of strings, numbers, tuples and lists only: per node its op,
name, target, args and kwargs (a node referenced by name), and its ``meta["val"]`` (a
tensor's shape, strides, offset, dtype, device); the other node and graph metadata whose
values are plain data (``kiln_library_op``, ``recompute``, ``stack_trace``,
``kiln_aot_training`` ...). A target is named, never pickled: an ``OpOverload`` by its
namespace, name and overload, ``operator.getitem`` by name. ``graph_from_data`` looks
those names up in ``torch.ops`` and ``operator`` only, so loading data runs no code the
data brings. Graphs this cannot describe (a symbolic size, a tensor constant, a target
of another kind, an argument of another type) give None: they are not kept.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from kiln_aot.fake import FakeTensor

FORMAT = 1
_PLAIN = (str, int, float, bool, type(None))
_OPERATORS = {"getitem": operator.getitem}


class NotPlain(Exception):
    """A value ``graph_data`` cannot describe."""


def _is_plain(v: Any) -> bool:
    if isinstance(v, (tuple, list)):
        return all(_is_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _is_plain(x) for k, x in v.items())
    return isinstance(v, _PLAIN)


def _target(t: Any) -> tuple:
    if isinstance(t, torch._ops.OpOverload):
        namespace, name = t._schema.name.split("::")
        return ("op", namespace, name, t._overloadname)
    if t is operator.getitem:
        return ("operator", "getitem")
    raise NotPlain(f"target {t!r}")


def _load_target(d: tuple) -> Any:
    if d[0] == "op":
        return getattr(getattr(getattr(torch.ops, d[1]), d[2]), d[3])
    if d[0] == "operator" and d[1] in _OPERATORS:
        return _OPERATORS[d[1]]
    raise ValueError(f"unknown target {d!r}")


def _value(v: Any) -> Any:
    if isinstance(v, fx.Node):
        return ("node", v.name)
    if type(v) in (int, float, bool, str) or v is None:
        return ("v", v)
    if isinstance(v, torch.dtype):
        return ("dtype", str(v).removeprefix("torch."))
    if isinstance(v, torch.device):
        return ("device", str(v))
    if isinstance(v, torch.layout):
        return ("layout", str(v).removeprefix("torch."))
    if isinstance(v, torch.memory_format):
        return ("memory_format", str(v).removeprefix("torch."))
    if isinstance(v, (tuple, list)):
        return ("list" if isinstance(v, list) else "tuple", tuple(_value(x) for x in v))
    raise NotPlain(f"argument {v!r} of type {type(v).__name__}")


def _torch_attr(name: str, kind: type) -> Any:
    value = getattr(torch, name, None)
    if not isinstance(value, kind):
        raise ValueError(f"torch.{name} is no {kind.__name__}")
    return value


def _load_value(d: Any, nodes: dict[str, fx.Node]) -> Any:
    tag, v = d
    if tag == "node":
        return nodes[v]
    if tag == "v":
        return v
    if tag == "dtype":
        return _torch_attr(v, torch.dtype)
    if tag == "device":
        return torch.device(v)
    if tag == "layout":
        return _torch_attr(v, torch.layout)
    if tag == "memory_format":
        return _torch_attr(v, torch.memory_format)
    if tag in ("list", "tuple"):
        items = [_load_value(x, nodes) for x in v]
        return items if tag == "list" else tuple(items)
    raise ValueError(f"unknown value tag {tag!r}")


def _val(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        dims = (*v.shape, *v.stride(), v.storage_offset())
        if not all(type(s) is int for s in dims):
            raise NotPlain("a symbolic size")
        return ("tensor", tuple(v.shape), tuple(v.stride()), v.storage_offset(),
                str(v.dtype).removeprefix("torch."), str(v.device), v.requires_grad)  # fmt: skip
    if isinstance(v, (tuple, list)):
        return ("tuple", tuple(_val(x) for x in v))
    if type(v) in (int, float, bool) or v is None:
        return ("v", v)
    raise NotPlain(f"value {type(v).__name__}")


def _load_val(d: Any) -> Any:
    if d[0] == "tensor":
        _, shape, stride, offset, dtype, device, requires_grad = d
        meta = torch.empty_strided(shape, stride, dtype=_torch_attr(dtype, torch.dtype),
                                   device="meta")  # fmt: skip
        if offset:
            meta = meta.as_strided(shape, stride, offset)
        return FakeTensor(meta, torch.device(device), requires_grad)
    if d[0] == "tuple":
        return tuple(_load_val(x) for x in d[1])
    if d[0] == "v":
        return d[1]
    raise ValueError(f"unknown val tag {d[0]!r}")


def graph_data(gm: fx.GraphModule) -> dict[str, Any] | None:
    """``gm`` as plain data (module docstring), or None where it holds what that cannot say."""
    try:
        nodes = []
        for n in gm.graph.nodes:
            if n.op not in ("placeholder", "call_function", "output"):
                raise NotPlain(f"a {n.op} node")
            target = _target(n.target) if n.op == "call_function" else str(n.target)
            meta = {k: v for k, v in n.meta.items() if k != "val" and _is_plain(v)}
            val = _val(n.meta["val"]) if "val" in n.meta else None
            kwargs = _value(tuple(n.kwargs.items()))
            nodes.append((n.op, n.name, target, _value(n.args), kwargs, val, meta))
    except NotPlain:
        return None
    graph_meta = {k: v for k, v in gm.meta.items() if _is_plain(v)}
    return {"format": FORMAT, "nodes": nodes, "meta": graph_meta}


def graph_from_data(data: dict[str, Any]) -> fx.GraphModule:
    """The graph ``graph_data`` described; ValueError for data it did not write."""
    if data.get("format") != FORMAT:
        raise ValueError(f"graph data of format {data.get('format')}, this reads {FORMAT}")
    graph = fx.Graph()
    nodes: dict[str, fx.Node] = {}
    for op, name, target, args, kwargs, val, meta in data["nodes"]:
        args = _load_value(args, nodes)
        kwargs = dict(_load_value(kwargs, nodes))
        if op == "placeholder":
            node = graph.placeholder(target)
        elif op == "output":
            node = graph.output(args[0])
        else:
            node = graph.create_node(op, _load_target(target), tuple(args), kwargs, name)
        if node.name != name:
            raise ValueError(f"node {name!r} came back as {node.name!r}")
        node.meta.update(meta)
        if val is not None:
            node.meta["val"] = _load_val(val)
        nodes[name] = node
    gm = fx.GraphModule(torch.nn.Module(), graph)
    gm.meta.update(data["meta"])
    return gm
