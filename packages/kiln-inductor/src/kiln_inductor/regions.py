"""Regional reuse: the repeated blocks of a torch-level graph compiled once.

# Regional reuse

A transformer's layers, a ResNet stage's blocks, a ``ModuleList`` loop: the captured graph
holds the same code once per instance, over each instance's own parameters. Compiled as
one graph, every instance is traced, decomposed, lowered and scheduled again (the kernel
cache only shares the C++/Triton build, identical layers giving identical kernel sources),
so compile time grows with depth. ``plan_regions`` finds the instances that are the same
computation, ``compile_regions`` compiles one of them and calls that compiled block for
each instance, with the instance's own values as arguments.

Finding them. Capture marks each node with the module calls it was made in
(``meta["nn_module_stack"]``: call key -> (path, class), outermost first; kiln-capture
and torch's own capture both write it). Each call's nodes are canonicalized: every node
as (op, target, arguments, the metadata of its value: shape, stride, storage offset,
dtype, device, requires_grad), with values made outside the call numbered in order of
first use (the block's inputs) and values read after it (its outputs) listed. Two calls
whose canonical forms are equal compute the same function of their inputs. Walking the
call tree from the outside in, the first call whose form another call shares, with at
least ``MIN_OPS`` operations, is a region; calls inside it are not looked at.

Soundness. Equal forms mean equal graphs: any attribute, config value or shape that
changed the code a layer ran changed its nodes, their constants or their metadata, and
the layer is not shared. The guards of the captured graph are capture's, unchanged; a
block's compiled plan is kiln-aot's, which still checks each call's arguments (an
instance whose inputs differ in layout compiles a plan of its own, correctly). Regions
are not used (the graph compiles whole) when the graph has symbolic sizes, sets global
state (grad mode, autocast) inside itself, passes a value that is not a tensor between
pieces, or writes in place to a tensor another piece made (its aliases across pieces
would not see the write). Nor when it holds collectives fetched ahead of their use
(``collective_group``: FSDP2's all-gathers, kiln/fsdp_graph.py): the collectives pass
issues a unit's gather under the previous unit's compute, which a piece boundary would
prevent (each piece would wait on its own block's gather at its start).

Running them. The graph becomes pieces in program order: each region instance, and each
run of nodes between regions. Every piece is compiled through ``compile_fx`` (kiln-aot:
inference, or forward and backward when training; then kiln-inductor) with example
inputs: the graph's own for its inputs, zero tensors of the recorded metadata for values
another piece makes. A region's pieces share one compiled callable. A short generated
function (``stitched``) calls the pieces in order; in training each piece is its own
autograd node, so autograd composes the backward from each instance's saved values.
Fusion across a region's boundary is given up (a residual add with the next layer's
norm), and each piece call checks its arguments: a few microseconds per instance.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from kiln_aot.fx_walk import ancestry

from . import log
from .passes.collectives import GROUP as COLLECTIVE_GROUP
from .runtime import reload

MIN_OPS = 5  # a block of fewer operations is not worth a boundary (fusion lost across it)
STACK = "nn_module_stack"
_GLOBAL_STATE = {
    torch._C._set_grad_enabled,
    getattr(torch.amp, "_enter_autocast", None),
    getattr(torch.amp, "_exit_autocast", None),
}
_INPLACE_OPERATORS = {
    operator.setitem,
    operator.iadd,
    operator.isub,
    operator.imul,
    operator.itruediv,
    operator.ifloordiv,
    operator.imod,
    operator.ipow,
    operator.iand,
    operator.ior,
    operator.ixor,
    operator.ilshift,
    operator.irshift,
    operator.imatmul,
}


@dataclass
class Call:
    """One module call of the graph: its nodes (contiguous in program order) and form."""

    key: str
    path: str
    cls: type | str  # torch's capture writes the class's qualified name
    parent: str | None
    nodes: list[torch.fx.Node] = field(default_factory=list)
    children: list[str] = field(default_factory=list)


@dataclass
class Piece:
    """A contiguous run of the graph's nodes, compiled as one graph; ``group`` is the
    region group it belongs to (None for the nodes between regions)."""

    nodes: list[torch.fx.Node]
    inputs: list[torch.fx.Node]
    outputs: list[torch.fx.Node]
    group: int | None = None
    path: str = ""
    # values computed from constants alone that every instance of the group reads, made
    # inside the piece instead of passed in (``_constant_inputs``), in program order
    consts: list[torch.fx.Node] = field(default_factory=list)


@dataclass
class RegionGroup:
    """Structurally equal module calls: one compiled block serves them all."""

    cls: type | str
    paths: list[str]
    ops: int

    @property
    def name(self) -> str:
        return getattr(self.cls, "__name__", str(self.cls).rsplit(".", 1)[-1])

    def describe(self) -> str:
        shown = ", ".join(self.paths[:3]) + (", ..." if len(self.paths) > 3 else "")
        return (
            f"{self.name}: compiled once, reused for {len(self.paths)} instances "
            f"({self.ops} ops each): {shown}"
        )


@dataclass
class RegionPlan:
    pieces: list[Piece]
    groups: list[RegionGroup]
    source: str = ""  # the stitched function (_stitch_source)


@dataclass
class ReuseStats:
    """Since the last reset: region groups compiled, and instances that reused a block."""

    blocks_compiled: int = 0
    instances: int = 0
    graphs_split: int = 0
    blocks: list[str] = field(default_factory=list)  # RegionGroup.describe() of each

    def reset(self) -> None:
        self.blocks_compiled = self.instances = self.graphs_split = 0
        self.blocks.clear()


STATS = ReuseStats()


# -- finding regions -------------------------------------------------------------------


def plan_regions(gm: torch.fx.GraphModule) -> RegionPlan | None:
    """The pieces of ``gm`` with its repeated blocks as regions, or None when no block
    repeats or the graph must compile whole (module docstring, "Soundness")."""
    shape_env = gm.meta.get("shape_env")
    if shape_env is not None and getattr(shape_env, "symbols", None):
        return None
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    if not nodes or any(n.target in _GLOBAL_STATE for n in nodes):
        return None
    if any(n.meta.get(COLLECTIVE_GROUP) for n in nodes):
        return None  # prefetched collectives: only the whole graph overlaps them
    if not any(n.meta.get(STACK) for n in nodes):
        return None
    calls, roots = _module_calls(nodes)
    position = {n: i for i, n in enumerate(nodes)}
    shapes: dict[torch.fx.Node, tuple | None] = {}  # _node_shape of each node, made once
    numbers: dict[tuple, int] = {}  # each distinct form by a number (hashed once)
    forms: dict[str, int] = {}
    for key, call in calls.items():
        first, last = position[call.nodes[0]], position[call.nodes[-1]]
        if last - first + 1 == len(call.nodes) and len(call.nodes) >= MIN_OPS:
            form = _form(call.nodes, shapes)
            if form is not None:
                forms[key] = numbers.setdefault((call.cls, form), len(numbers))
    starts: dict[int, set[torch.fx.Node]] = {}
    for key, form in forms.items():
        starts.setdefault(form, set()).add(calls[key].nodes[0])
    chosen: list[Call] = []

    def visit(keys: list[str]) -> None:
        for key in keys:
            form = forms.get(key)
            if form is not None and len(starts[form]) >= 2:
                chosen.append(calls[key])
            else:
                visit(calls[key].children)

    visit(roots)
    by_form: dict[int, list[Call]] = {}
    for call in chosen:
        by_form.setdefault(forms[call.key], []).append(call)
    regions = {f: cs for f, cs in by_form.items() if len(cs) >= 2}
    if not regions:
        return None
    groups = [
        RegionGroup(cs[0].cls, [c.path for c in cs], len(cs[0].nodes)) for cs in regions.values()
    ]
    group_of = {c.key: g for g, cs in enumerate(regions.values()) for c in cs}
    pieces = _pieces(gm, nodes, [c for c in chosen if c.key in group_of], group_of)
    if pieces is None:
        return None
    _constant_inputs(pieces)
    plan = RegionPlan(pieces, groups)
    try:
        plan.source = _stitch_source(gm, plan)
    except (KeyError, ValueError):  # an output the stitched function cannot return
        return None
    return plan


def _module_calls(nodes: list[torch.fx.Node]) -> tuple[dict[str, Call], list[str]]:
    calls: dict[str, Call] = {}
    roots: list[str] = []
    for n in nodes:
        parent = None
        for key, (path, cls) in n.meta.get(STACK, {}).items():
            call = calls.get(key)
            if call is None:
                call = calls[key] = Call(key, str(path), cls, parent)
                (calls[parent].children if parent is not None else roots).append(key)
            call.nodes.append(n)
            parent = key
    return calls, roots


_HOLE = ("node",)  # where a node stands in a node's arguments (_node_shape)


def _node_shape(n: torch.fx.Node) -> tuple | None:
    """What of ``n``'s canonical form does not depend on the run of nodes it is looked at
    in: op, target, arguments with each node a hole, value metadata, and the nodes that
    fill the holes, in order; None when one of its values cannot be described. Made once
    per node (a node is in every module call around it)."""
    refs: list[torch.fx.Node] = []

    def arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            refs.append(a)
            return _HOLE
        if isinstance(a, tuple | list):
            return (type(a).__name__, tuple(arg(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, arg(v)) for k, v in a.items()))
        if isinstance(a, slice):
            return ("slice", arg(a.start), arg(a.stop), arg(a.step))
        if isinstance(a, float):
            return ("float", repr(a))  # -0.0 and nan kept apart
        if a is None or isinstance(a, bool | int | str | torch.dtype | torch.device):
            return (type(a).__name__, a)
        if isinstance(a, torch.layout | torch.memory_format) or a is Ellipsis:
            return ("const", a)
        return ("object", id(a))  # the same object in both calls, or not equal

    try:
        return (n.op, _target(n.target), arg(n.args), arg(n.kwargs), _meta(n), tuple(refs))
    except _Undescribed:
        return None


def _form(nodes: list[torch.fx.Node], shapes: dict | None = None) -> tuple | None:
    """The canonical form of a run of nodes (module docstring, "Finding them"), or None
    when one of its values cannot be described. Each node's part that does not depend on
    the run comes from ``shapes`` (filled on first use); the holes of its arguments are
    numbered here: a node of the run by its index, a value made outside it by ``-1 - k``
    for the ``k``-th such value first used (the block's inputs)."""
    shapes = {} if shapes is None else shapes
    index = {n: i for i, n in enumerate(nodes)}
    inputs: dict[torch.fx.Node, int] = {}
    body = []
    for n in nodes:
        shape = shapes.get(n, False)
        if shape is False:
            shape = shapes[n] = _node_shape(n)
        if shape is None:
            return None
        holes = []
        for a in shape[5]:
            i = index.get(a)
            if i is None:
                i = inputs.get(a)
                if i is None:
                    i = inputs[a] = len(inputs)
                i = -1 - i
            holes.append(i)
        body.append((*shape[:5], tuple(holes)))
    outputs = tuple(i for i, n in enumerate(nodes) if any(u not in index for u in n.users))
    try:
        ins = tuple(_meta(a) for a in inputs)
    except _Undescribed:
        return None
    return (tuple(body), ins, outputs)


class _Undescribed(Exception):
    pass


def _target(t: Any) -> Any:
    try:
        hash(t)
        return t
    except TypeError:
        return ("object", id(t))


def _meta(n: torch.fx.Node) -> tuple:
    if n.op == "get_attr":
        return ("get_attr", n.target)  # the same attribute, or not equal
    val = n.meta.get("val")
    device = n.meta.get("device")
    return (_value_meta(val), str(device) if device is not None else None)


def _value_meta(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return (
            tuple(val.shape),
            tuple(val.stride()),
            val.storage_offset(),
            val.dtype,
            val.requires_grad,
        )
    if isinstance(val, tuple | list):
        return tuple(_value_meta(v) for v in val)
    if val is None or isinstance(val, bool | int | str):
        return (type(val).__name__, val)
    if isinstance(val, float):
        return ("float", repr(val) if not math.isnan(val) else "nan")
    raise _Undescribed


# -- pieces ----------------------------------------------------------------------------


def _pieces(
    gm: torch.fx.GraphModule,
    nodes: list[torch.fx.Node],
    regions: list[Call],
    group_of: dict[str, int],
) -> list[Piece] | None:
    """``gm``'s compute nodes cut into region instances and the runs between them."""
    region_at = {c.nodes[0]: c for c in regions}
    runs: list[tuple[list[torch.fx.Node], Call | None]] = []
    i = 0
    while i < len(nodes):
        call = region_at.get(nodes[i])
        if call is not None:
            runs.append((call.nodes, call))
            i += len(call.nodes)
            continue
        if not runs or runs[-1][1] is not None:
            runs.append(([], None))
        runs[-1][0].append(nodes[i])
        i += 1
    pieces = []
    for run, call in runs:
        piece = _piece(run)
        if piece is None:
            return None
        if call is not None:
            piece.group, piece.path = group_of[call.key], call.path
        pieces.append(piece)
    return pieces


def _piece(run: list[torch.fx.Node]) -> Piece | None:
    members = set(run)
    inputs: dict[torch.fx.Node, None] = {}
    for n in run:
        for a in n.all_input_nodes:
            if a not in members:
                inputs.setdefault(a, None)
    outputs = [n for n in run if any(u not in members for u in n.users)]
    for v in [*inputs, *outputs]:
        if v.op not in ("placeholder", "get_attr") and not isinstance(
            v.meta.get("val"), torch.Tensor
        ):
            return None  # a size or another non-tensor value between pieces
    for n in run:
        written = _written(n)
        if written is not None and written in inputs and written.op != "placeholder":
            return None  # its aliases in other pieces would miss the write
    return Piece(run, list(inputs), outputs)


# constant inputs made inside each region instance: at most this many nodes, of at most
# this many elements each (a mask from aranges: kiln-aot folds a causal one away)
CONST_NODES, CONST_NUMEL = 64, 1 << 24
_RANDOM_WORDS = ("rand", "dropout", "normal", "bernoulli", "multinomial", "poisson", "uniform")


def _constant_inputs(pieces: list[Piece]) -> None:
    """Region inputs computed from constants alone (no graph input, no random op, no
    write), the same node for every instance of a group, are recomputed inside each
    instance: the decoder's causal mask that transformers builds from ``arange``s reaches
    every layer as such an input, and only inside the piece can kiln-aot see it is a
    constant (and run exactly causal attention as ``is_causal=True``, without the mask)."""
    by_group: dict[int, list[Piece]] = {}
    for piece in pieces:
        if piece.group is not None:
            by_group.setdefault(piece.group, []).append(piece)
    for members in by_group.values():
        shared = [
            a
            for k, a in enumerate(members[0].inputs)
            if all(len(m.inputs) > k and m.inputs[k] is a for m in members)
        ]
        consts: list[torch.fx.Node] = []
        for a in shared:
            ancestry = _constant_ancestry(a)
            if ancestry is not None:
                consts.extend(n for n in ancestry if n not in consts)
        if not consts:
            continue
        made = set(consts)
        position = {n: i for i, n in enumerate(members[0].nodes[0].graph.nodes)}
        consts.sort(key=position.__getitem__)
        for m in members:
            m.inputs = [a for a in m.inputs if a not in made]
            m.consts = list(consts)


def _constant_ancestry(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """``node`` and the nodes it is computed from, when they are all deterministic calls
    on constants (module attributes included) and small; None otherwise."""
    return ancestry(node, _constant_call, CONST_NODES)


def _constant_call(n: torch.fx.Node) -> bool:
    if n.op == "get_attr":
        return True
    if n.op not in ("call_function", "call_method"):
        return False
    name = str(getattr(n.target, "__name__", n.target)).lower()
    if any(w in name for w in _RANDOM_WORDS) or _written(n) is not None:
        return False
    val = n.meta.get("val")
    return not (isinstance(val, torch.Tensor) and (val.numel() > CONST_NUMEL or val.requires_grad))


def _written(n: torch.fx.Node) -> torch.fx.Node | None:
    """The input an in-place node writes (its first argument, or ``out=``), if any."""
    out = n.kwargs.get("out")
    if isinstance(out, torch.fx.Node):
        return out
    first = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
    if n.op == "call_method":
        name = str(n.target)
        return first if name.endswith("_") and not name.startswith("__") else None
    if n.target in _INPLACE_OPERATORS or n.kwargs.get("inplace") is True:
        return first
    if getattr(n.target, "__module__", None) == "_operator":
        return None  # operator.and_, or_, not_: named with a "_", writing nothing
    schema = getattr(n.target, "_schema", None)
    if schema is not None and getattr(schema, "is_mutable", False):
        return first
    name = getattr(n.target, "__name__", "")
    return first if name.endswith("_") and not name.startswith("__") else None


# -- compiling and running -------------------------------------------------------------


def compile_regions(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    compile_piece: Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]],
) -> Callable[..., Any] | None:
    """``gm`` compiled piece by piece, each region group's block once (module docstring);
    None when ``plan_regions`` finds no region."""
    start = time.perf_counter()
    plan = plan_regions(gm)
    if plan is None:
        return None
    examples = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for ph, value in zip(placeholders, example_inputs):
        examples[ph] = value
    blocks: dict[int, tuple[int, Callable[..., Any]]] = {}
    compiled: list[Callable[..., Any]] = []
    # the reload recipe (runtime/reload.py): each piece's, or the block of an earlier one
    bodies: list[tuple | None] = []
    planned = time.perf_counter()
    for k, piece in enumerate(plan.pieces):
        if piece.group is not None and piece.group in blocks:
            first, fn = blocks[piece.group]
            compiled.append(fn)
            bodies.append(("same", first))
            STATS.instances += 1
            continue
        sub = _piece_module(gm, piece, k)
        fn = compile_piece(sub, [_example(gm, a, examples) for a in piece.inputs])
        compiled.append(fn)
        recipe = reload.recipe_of(fn)
        bodies.append(recipe[3] if recipe is not None and recipe[3][0] == "aot" else None)
        if piece.group is not None:
            blocks[piece.group] = (k, fn)
            STATS.blocks_compiled += 1
            STATS.instances += 1
    STATS.graphs_split += 1
    stitch_start = time.perf_counter()
    for g in plan.groups:
        STATS.blocks.append(g.describe())
        log.log("graphs", f"regional reuse: {g.describe()}")
    source = plan.source
    namespace: dict[str, Any] = {f"piece{k}": fn for k, fn in enumerate(compiled)}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            namespace[f"attr_{n.name}"] = _fetch(gm, n.target)
    exec(compile(source, "<kiln regions>", "exec"), namespace)
    stitched = namespace["stitched"]
    stitched.kiln_regions = plan  # type: ignore[attr-defined]
    stitched.kiln_pieces = compiled  # type: ignore[attr-defined]
    if None not in bodies and not any(n.op == "get_attr" for n in gm.graph.nodes):
        described = tuple(g.describe() for g in plan.groups)
        body = ("regions", source, tuple(bodies), described)
        reload.attach(stitched, reload.make_recipe(True, body))
    log.log("graphs", f"regional reuse: stitched graph\n{source}")
    # the time regional reuse itself took (finding blocks, stitching), the pieces'
    # compiles aside: the report's compile-time breakdown shows it as its own stage
    own = (planned - start) + (time.perf_counter() - stitch_start)
    log.log("timings", f"regions: {own:.4f} s")
    return stitched


def _piece_module(gm: torch.fx.GraphModule, piece: Piece, k: int) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    local: dict[torch.fx.Node, torch.fx.Node] = {}
    for a in piece.inputs:
        local[a] = graph.placeholder(a.name)
        local[a].meta = dict(a.meta)
    for n in piece.consts:
        local[n] = graph.node_copy(n, local.__getitem__)
    for n in piece.nodes:
        local[n] = graph.node_copy(n, local.__getitem__)
    graph.output(tuple(local[o] for o in piece.outputs))
    sub = torch.fx.GraphModule(gm, graph, class_name=f"KilnPiece{k}")
    sub.meta.update(gm.meta)
    return sub


def _example(gm: torch.fx.GraphModule, node: torch.fx.Node, examples: dict) -> Any:
    if node in examples:
        return examples[node]
    if node.op == "get_attr":
        return _fetch(gm, node.target)
    val = node.meta["val"]
    device = node.meta.get("device") or val.device
    out = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=device).zero_()
    if val.requires_grad:
        out.requires_grad_(True)
    return out


def _fetch(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _stitch_source(gm: torch.fx.GraphModule, plan: RegionPlan) -> str:
    """``def stitched(<the graph's inputs>)``: each piece called in order."""
    names: dict[torch.fx.Node, str] = {}
    params = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            names[n] = f"a{len(params)}"
            params.append(names[n])
        elif n.op == "get_attr":
            names[n] = f"attr_{n.name}"
    lines = [f"def stitched({', '.join(params)}):"]
    for k, piece in enumerate(plan.pieces):
        args = ", ".join(names[a] for a in piece.inputs)
        what = f"  # {piece.path}" if piece.group is not None else ""
        lines.append(f"    out{k} = piece{k}({args}){what}")
        for j, o in enumerate(piece.outputs):
            names[o] = f"v{k}_{j}"
            lines.append(f"    {names[o]} = out{k}[{j}]")
    out = gm.graph.output_node().args[0]
    lines.append(f"    return {_render(out, names)}")
    return "\n".join(lines) + "\n"


def _render(value: Any, names: dict[torch.fx.Node, str]) -> str:
    if isinstance(value, torch.fx.Node):
        return names[value]
    if isinstance(value, tuple | list):
        inner = ", ".join(_render(v, names) for v in value)
        return f"({inner},)" if isinstance(value, tuple) else f"[{inner}]"
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    raise ValueError(f"graph output {value!r}")


__all__ = ["STATS", "RegionGroup", "RegionPlan", "compile_regions", "plan_regions"]
