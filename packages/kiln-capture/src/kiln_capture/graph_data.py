"""Captured torch-level graphs as plain data, and back (frame_store.py keeps them).

``describe(gm, inputs)`` gives tuples, lists, strings and numbers only (``marshal``-able):
per node its op, name, target (a function by its import path, recipes.py), arguments
(another node by name; literals, slices, dtypes, devices by value) and metadata
(``meta["val"]`` as a meta tensor's shape, strides, offset, dtype and requires_grad;
``nn_module_stack`` with each class by import path; ``stack_trace`` by lines, each line
written once; the other entries whose values are plain data). ``rebuild`` makes an equal ``GraphModule`` from it: the same code, so the
backend's own caches (kiln-inductor's artifact cache keys the graph's code and metadata)
find what an earlier process compiled. A graph this cannot describe (symbolic sizes, a
target without an import path, an attribute or submodule of its own) gives None.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from kiln_capture.recipes import (
    PLAIN,
    NotPersistable,
    Unresolved,
    import_recipe,
    resolve,
    torch_value_recipe,
)

FORMAT = 1


def _enc(v: Any) -> tuple:
    t = type(v)
    if isinstance(v, fx.Node):
        return ("n", v.name)
    if t in PLAIN:
        return ("v", v)
    if t is tuple:
        return ("t", tuple(_enc(x) for x in v))
    if isinstance(v, list):  # fx's immutable_list too
        return ("l", tuple(_enc(x) for x in v))
    if isinstance(v, dict) and all(type(k) is str for k in v):
        return ("d", tuple((k, _enc(x)) for k, x in v.items()))
    if t is slice:
        return ("s", _enc(v.start), _enc(v.stop), _enc(v.step))
    if v is Ellipsis:
        return ("e",)
    if t is torch.Tensor and v.device.type == "meta":
        if v.layout is not torch.strided or any(
            not isinstance(s, int) for s in (*v.shape, *v.stride())
        ):
            raise NotPersistable("a value with symbolic sizes or another layout")
        return (
            "T",
            tuple(v.shape),
            tuple(v.stride()),
            v.storage_offset(),
            str(v.dtype).removeprefix("torch."),
            v.requires_grad,
        )
    r = torch_value_recipe(v)
    if r is not None:
        return r
    raise NotPersistable(f"a graph value of type {t.__qualname__}")


def _dec(d: tuple, nodes: dict[str, fx.Node]) -> Any:
    kind = d[0]
    if kind == "n":
        return nodes[d[1]]
    if kind == "v":
        return d[1]
    if kind == "t":
        return tuple(_dec(x, nodes) for x in d[1])
    if kind == "l":
        return [_dec(x, nodes) for x in d[1]]
    if kind == "d":  # a node's kwargs: fx makes its own immutable copy
        return {k: _dec(x, nodes) for k, x in d[1]}
    if kind == "s":
        return slice(_dec(d[1], nodes), _dec(d[2], nodes), _dec(d[3], nodes))
    if kind == "e":
        return Ellipsis
    if kind == "T":
        _, shape, stride, offset, dtype, requires_grad = d
        t = torch.empty(0, dtype=getattr(torch, dtype), device="meta")
        t = (
            t.as_strided(shape, stride, offset)
            if offset
            else torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")
        )
        return t.requires_grad_(True) if requires_grad else t
    if kind == "lines":
        return "\n".join(d[1])
    if kind in ("torch", "device", "size"):
        return resolve(d, _no_paths)
    raise Unresolved(f"unknown graph value kind {kind!r}")


def _no_paths(expr: str) -> Any:
    raise Unresolved(f"a graph value cannot name a path ({expr})")


def _meta(meta: dict, same: dict) -> tuple:
    """A node's metadata; ``same`` makes equal strings and recipes one object, which
    ``marshal`` writes once (a stack trace's lines repeat over every node of a layer)."""
    out = []
    for k, v in meta.items():
        if k == "nn_module_stack":
            calls = []
            for key, (path, cls) in v.items():
                r = same.get(cls)  # each class looked up once per graph
                if r is None:
                    r = same[cls] = import_recipe(cls)
                if r is None:
                    raise NotPersistable(f"module class {cls.__qualname__} has no import path")
                calls.append(
                    (same.setdefault(key, key), same.setdefault(path, path), same.setdefault(r, r))
                )
            out.append((k, ("stack", tuple(calls))))
            continue
        if k == "stack_trace" and type(v) is str:
            # the same op of every layer has the same trace (code lines, not module paths)
            lines = same.get(("trace", v))
            if lines is None:
                lines = same[("trace", v)] = (
                    "lines",
                    tuple(same.setdefault(line, line) for line in v.split("\n")),
                )
            out.append((k, lines))
            continue
        try:
            out.append((k, _enc(v)))
        except NotPersistable:
            if k == "val":
                raise
            # other entries are notes (kiln-inductor keys only values and the code)
    return tuple(out)


def describe(gm: fx.GraphModule, inputs: list[str]) -> tuple | None:
    """``gm`` as plain data, with the source expressions of its inputs; None when it holds
    something that is not plain data (module docstring)."""
    same: dict = {}
    try:
        nodes = []
        for n in gm.graph.nodes:
            if n.op in ("get_attr", "call_module"):
                raise NotPersistable(f"a {n.op} node")
            if n.op == "call_function":
                target = same.get(("target", id(n.target)))  # each target found once
                if target is None:
                    target = import_recipe(n.target)
                    if target is None:
                        raise NotPersistable(f"target {n.target!r} has no import path")
                    same[("target", id(n.target))] = target
            else:
                target = ("v", n.target)
            nodes.append((n.op, n.name, target, _enc(n.args), _enc(n.kwargs), _meta(n.meta, same)))
    except NotPersistable:
        return None
    return (FORMAT, tuple(nodes), tuple(inputs))


def rebuild(data: tuple) -> tuple[fx.GraphModule, list[str]]:
    """The ``GraphModule`` ``describe`` described, and the source expressions of its inputs."""
    fmt, described, inputs = data
    if fmt != FORMAT:
        raise Unresolved(f"graph data of format {fmt}")
    graph = fx.Graph()
    nodes: dict[str, fx.Node] = {}
    memo: dict = {}
    for op, name, target, args, kwargs, meta in described:
        fn = resolve(target, _no_paths, memo)
        node = graph.create_node(op, fn, _dec(args, nodes), _dec(kwargs, nodes), name=name)
        if node.name != name:
            raise Unresolved(f"node {name} was named {node.name}")
        for k, v in meta:
            if v[0] == "stack":
                node.meta[k] = {key: (path, resolve(r, _no_paths, memo)) for key, path, r in v[1]}
            else:
                node.meta[k] = _dec(v, nodes)
        nodes[name] = node
    gm = fx.GraphModule(torch.nn.Module(), graph, class_name="KilnCaptured")
    return gm, list(inputs)
