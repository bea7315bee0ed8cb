"""compile_aten_graph and compile_fx: the pipeline, as an ordered list of named stages.

    lower (graph.GraphLowering) → fuse_nodes → fuse_templates (where the backend has
    templates) → plan_memory → codegen kernels (backend) → load kernels (backend, cached)
    → generate_wrapper

Each stage's output is written to ``$KILN_DEBUG_DIR/<graph>/<stage>`` when that is set.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx

from . import log
from .backend import KernelSource, get_backend
from .config import read_config
from .errors import AotUnavailableError
from .graph import GraphLowering
from .ir.nodes import ComputedBuffer, InputBuffer, StorageView
from .ir.printer import print_ir
from .ir.symbols import shape_env
from .runtime import reload
from .runtime.layout_copies import record_layout_copy
from .scheduler.fuse import FusedGroup, fuse_nodes
from .scheduler.memory import plan_memory
from .scheduler.templates import TemplateGroup, fuse_templates
from .verify import verify_ir, verify_schedule
from .wrapper import WrapperCodegen

_graph_ids = itertools.count()


class CompiledGraph:
    """The callable a compiled graph becomes: ``compiled(*args) -> tuple of tensors``."""

    def __init__(
        self,
        call: Callable[[list[Any]], tuple],
        source: str,
        stats: dict[str, Any],
        layouts: Sequence[tuple[tuple[int, ...], tuple[int, ...]] | None] = (),
    ):
        self._call = call
        self.index_errors: Any = None  # index_check.DeviceIndexErrors of GPU kernels, if any
        self.wrapper_source = source
        self.stats = stats
        self.artifact: GraphArtifact | None = None  # set by compile_aten_graph
        self.name = "graph"  # "graph<n>", set by wrapper_graph: names copy sites
        # kernels index inputs with the strides the graph was compiled for
        self._layouts = list(layouts)
        # (position, strides) of the inputs to check on each call, in one list: the loop
        # runs over every input of a model whose parameters are graph inputs
        self._checked = [(i, want[1]) for i, want in enumerate(self._layouts) if want is not None]

    def __call__(self, *args: Any) -> tuple:
        if len(args) == 1 and isinstance(args[0], list):
            args = tuple(args[0])
        for i, stride in self._checked:
            if args[i].stride() != stride:
                args = self._restride(args, i, self._layouts[i], self.name)
        return self._call(args)

    def call_stealing(self, args: list[Any]) -> tuple:
        """The call for a list of inputs the caller gives up (kiln-aot's backward passes
        the saved activations this way): the wrapper empties the list after reading it,
        so each input is freed at its last use in the graph, as eager's autograd frees a
        node's saved tensors once the node ran, instead of all at the end of the call."""
        for i, stride in self._checked:
            if args[i].stride() != stride:
                args[:] = self._restride(tuple(args), i, self._layouts[i], self.name)
        return self._call(args)

    def kiln_guarded_call(self, *args: Any) -> tuple:
        """The call for inputs whose dtype, device, sizes and strides the caller has
        checked against the graph's (kiln-aot's protocol; kiln-capture's guards do):
        no layout check of the inputs."""
        return self._call(args, False)

    @staticmethod
    def _restride(
        args: tuple, i: int, want: tuple[tuple[int, ...], tuple[int, ...]], name: str = "graph"
    ) -> tuple:
        x = args[i]
        if tuple(x.shape) != want[0]:
            raise ValueError(
                f"kiln: input {i} has shape {tuple(x.shape)} but the graph was compiled for "
                f"{want[0]}\n  fix: compile again for this shape (kiln_aot and kiln.compile do so)"
            )
        log.log(
            "layouts",
            f"input {i}: strides {tuple(x.stride())}, the graph was compiled for {want[1]}: "
            "copied on this call",
        )
        record_layout_copy(f"{name} input {i}", x, want[1])
        fixed = torch.empty_strided(want[0], want[1], dtype=x.dtype, device=x.device).copy_(x)
        return (*args[:i], fixed, *args[i + 1 :])


def graph_debug_dir(cfg: Any) -> tuple[int, Path | None]:
    """A new graph's number and its dump folder (None without ``KILN_DEBUG_DIR``)."""
    gid = next(_graph_ids)
    return gid, Path(cfg.debug_dir) / f"graph{gid}" if cfg.debug_dir else None


def _dump(debug: Path | None, stage: str, text: str | Callable[[], str]) -> None:
    """``text`` (or what it makes: printing the IR of a large graph takes a while, done
    only with a debug directory) written to the debug directory, if any."""
    if debug is not None:
        debug.mkdir(parents=True, exist_ok=True)
        (debug / stage).write_text(text() if callable(text) else text)


def _format_schedule(steps: list[Any]) -> str:
    lines = []
    for s in steps:
        if isinstance(s, TemplateGroup):
            lines.append(f"{s.name}: template {s.extern.op if s.extern else ''} with epilogue")
        if isinstance(s, FusedGroup):
            blocks = "; ".join(f"{b.kind}[{', '.join(n.name for n in b.nodes)}]" for b in s.blocks)
            lines.append(f"{s.name}: outer={list(s.outer)} {blocks} local={sorted(s.local)}")
        else:
            lines.append(f"{s.name}: {s.kind} {s.op}")
    return "\n".join(lines) + "\n"


def is_aten_graph(gm: torch.fx.GraphModule) -> bool:
    import operator

    def aten_node(n: torch.fx.Node) -> bool:
        if isinstance(n.target, torch._ops.OpOverload):
            return True
        # getitem takes an output of a multi-output op; on a tensor it is torch-level
        # indexing (``x[[1, 2]]``)
        src = n.args[0] if n.target is operator.getitem and n.args else None
        return isinstance(src, torch.fx.Node) and isinstance(src.meta.get("val"), (tuple, list))

    return all(aten_node(n) for n in gm.graph.nodes if n.op == "call_function") and not any(
        n.op in ("call_module", "call_method") for n in gm.graph.nodes
    )


def _donated_inputs(gm: torch.fx.GraphModule, ir: Any) -> dict[str, str]:
    """Output buffer -> the graph input it may be written into: the graph's outputs that
    are new values of inputs its caller writes back (``gm.meta["kiln_input_writes"]``,
    pairs of output and input positions, from kiln-aot), where the output is a whole
    buffer of the input's layout that no other output returns."""
    pairs = gm.meta.get("kiln_input_writes", ())
    if not pairs:
        return {}
    names = Counter(o.buffer.name for o in ir.outputs if isinstance(o, StorageView))
    donated: dict[str, str] = {}
    for out_pos, in_pos in pairs:
        out = ir.outputs[out_pos] if out_pos < len(ir.outputs) else None
        inp = ir.inputs[in_pos] if in_pos < len(ir.inputs) else None
        if not isinstance(out, StorageView) or not isinstance(inp, InputBuffer):
            continue
        buf = out.buffer
        if (
            isinstance(buf, ComputedBuffer)
            and names[buf.name] == 1
            and out.layout == buf.layout == inp.layout
            and inp.name not in donated.values()
        ):
            donated[buf.name] = inp.name
    return donated


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
    """Compile an ATen-level FX graph (DESIGN.md contract 3) into a callable."""
    cfg = read_config()
    gid, debug = graph_debug_dir(cfg)
    t0 = time.perf_counter()
    _dump(debug, "aten.py", gm.code)
    with log.collect_warnings() as notes:
        lowering = GraphLowering(gm, example_inputs, debug)
        ir = lowering.run()
        # the size symbols' ranges stay in force for scheduling and kernel generation
        with shape_env(lowering.shape_env):
            compiled = _compile_lowered(gm, lowering, ir, cfg, gid, debug, t0)
    if compiled.artifact is not None:
        compiled.artifact.warnings = list(notes)
    return compiled


def _compile_lowered(
    gm: torch.fx.GraphModule,
    lowering: GraphLowering,
    ir: Any,
    cfg: Any,
    gid: int,
    debug: Path | None,
    t0: float,
) -> CompiledGraph:
    _dump(debug, "ir", lambda: print_ir(ir))
    if cfg.verify:
        verify_ir(ir)
    steps = fuse_nodes(ir)
    groups = [s for s in steps if isinstance(s, FusedGroup)]
    backend = get_backend(lowering.device.type) if groups else None
    accepts = getattr(backend, "template_accepts", None)
    if accepts is not None:
        steps = fuse_templates(steps, ir, accepts)
        groups = [s for s in steps if isinstance(s, FusedGroup)]
    if cfg.verify:
        verify_schedule(ir, steps)
    plan = plan_memory(steps, ir, _donated_inputs(gm, ir))
    _dump(debug, "sched", lambda: _format_schedule(steps))
    t1 = time.perf_counter()
    sources = [backend.codegen_kernel(g, ir.buffers) for g in groups] if backend else []
    for g, src in zip(groups, sources):
        _dump(debug, f"{g.name}.{src.language}", src.source)
        log.log("kernels", f"{g.name}: {_format_schedule([g]).strip()}\n{src.source}")
    t2 = time.perf_counter()
    loaded = backend.load_kernels(sources) if backend else []
    t3 = time.perf_counter()
    codegen = WrapperCodegen(ir, steps, plan, backend)
    kernels = {g.name: codegen._global("kernel_", fn) for g, fn in zip(groups, loaded)}
    source = codegen.generate(kernels, {g.name: src for g, src in zip(groups, sources)})
    _dump(debug, "wrapper.py", source)
    wrapper_globals = dict(codegen.globals)
    stats = {
        "kernels": len(groups),
        "nodes": len(ir.nodes),
        "externs": sum(1 for s in steps if not isinstance(s, FusedGroup) and s.kind == "extern"),
        "fallbacks": list(lowering.fallback_ops),
        "reused_buffers": plan.reused,
        "lower_s": t1 - t0,
        "codegen_s": t2 - t1,
        "build_s": t3 - t2,
    }
    layouts = [
        (tuple(int(s) for s in b.layout.size), tuple(int(s) for s in b.layout.stride))
        if b is not None
        and all(getattr(v, "is_Integer", False) for v in (*b.layout.size, *b.layout.stride))
        else None
        for b in ir.inputs
    ]
    compiled = wrapper_graph(source, wrapper_globals, stats, layouts, gid)
    stats["total_s"] = time.perf_counter() - t0
    log.log("timings", f"graph{gid}: {stats}")
    log.log("graphs", f"graph{gid}:\n{_format_schedule(steps)}{source}")
    # what the artifact cache stores to rebuild this graph without lowering it
    compiled.artifact = GraphArtifact(
        device=lowering.device.type,
        source=source,
        globals=wrapper_globals,
        kernels={kernels[g.name]: src for g, src in zip(groups, sources)},
        call_targets=dict(codegen.call_targets),
        layouts=layouts,
        stats=dict(stats),
    )
    return compiled


@dataclass
class GraphArtifact:
    """Everything a compiled graph is rebuilt from without lowering: the wrapper's source
    and globals, the kernel source behind each ``kernel_*`` global (loaded again through
    the backend and its kernel cache), the op behind each ``aten_*`` global that holds a
    ``call_target`` (runtime/artifacts.py serializes it)."""

    device: str
    source: str
    globals: dict[str, Any]
    kernels: dict[str, KernelSource]
    call_targets: dict[str, Any]
    layouts: list[Any]
    stats: dict[str, Any]
    warnings: list[tuple[str, str]] = field(default_factory=list)  # log.warn_once's, replayed


def wrapper_graph(
    source: str,
    wrapper_globals: dict[str, Any],
    stats: dict[str, Any],
    layouts: Sequence[Any],
    gid: int | None = None,
) -> CompiledGraph:
    """The CompiledGraph of a wrapper's source run with its globals (a fresh compile and
    an artifact cache hit alike)."""
    gid = next(_graph_ids) if gid is None else gid
    namespace = dict(wrapper_globals)
    exec(compile(source, f"<kiln wrapper graph{gid}>", "exec"), namespace)
    compiled = CompiledGraph(namespace["call"], source, stats, layouts)
    compiled.name = f"graph{gid}"
    # checked by CUDA graph runners after replay
    compiled.index_errors = wrapper_globals.get("index_errors")
    return compiled


def _core_only(gm: torch.fx.GraphModule) -> bool:
    """An ATen graph of kiln's core ops only goes straight to lowering; other ATen ops
    (``_safe_softmax``, ops torch's capture leaves whole) are decomposed by kiln_aot first."""
    from kiln_aot import core_ops

    return all(
        core_ops.is_allowed(n.target) or n.meta.get("kiln_library_op")
        for n in gm.graph.nodes
        if n.op == "call_function"
    )


def regional_reuse_applies(example_inputs: Sequence[Any]) -> bool:
    """Regional reuse applies: on, and the graph is not on a CUDA device unless asked."""
    cfg = read_config()
    if not cfg.regional_reuse:
        return False
    if cfg.regional_reuse_gpu:
        return True
    return not any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)


def compile_fx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    compile_graph: Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]] | None = None,
) -> Callable[..., Any]:
    """DESIGN.md contract 1: compile a torch-level or ATen-level FX graph into a callable.

    ATen graphs are compiled directly; torch-level graphs go through kiln_aot, which hands
    each ATen graph (forward, and backward when training) to ``compile_aten_graph``, or to
    ``compile_graph`` when given (kiln-triton wraps training graphs in CUDA graph runners
    this way). Any callable (an ``nn.Module`` too) is accepted the same way: kiln_aot
    traces it.

    Plans compiled from a torch-level graph persist in the artifact cache
    (runtime/artifacts.py; ``KILN_ARTIFACT_CACHE``) unless ``compile_graph`` is given.
    A torch-level graph whose module calls repeat (transformer layers) compiles each
    repeated block once (regions.py; ``KILN_REGIONAL_REUSE``); on CUDA devices only when
    ``KILN_REGIONAL_REUSE_GPU`` asks for it (whole graphs run faster there)."""
    if regional_reuse_applies(example_inputs) and isinstance(gm, torch.fx.GraphModule):
        from .config import settings
        from .regions import compile_regions

        def compile_piece(piece: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
            with settings.scope(regional_reuse=False):
                return compile_fx(piece, inputs, compile_graph=compile_graph)

        if not is_aten_graph(gm):
            stitched = compile_regions(gm, example_inputs, compile_piece)
            if stitched is not None:
                return stitched
    if isinstance(gm, torch.fx.GraphModule) and is_aten_graph(gm) and _core_only(gm):
        return (compile_graph or compile_aten_graph)(gm, list(example_inputs))
    store = None
    if compile_graph is None:  # the graphs are kiln-inductor's: the artifact cache keeps them
        compile_graph = compile_aten_graph
        from .runtime.artifacts import plan_store_for

        store = plan_store_for(gm, example_inputs)
    import kiln_aot

    aot_graph = getattr(kiln_aot, "aot_graph", None)
    if aot_graph is None:
        raise AotUnavailableError("aot_graph")
    fn = aot_graph(
        gm, example_inputs, fw_compiler=compile_graph, bw_compiler=compile_graph, plan_store=store
    )
    # what runtime/reload.py rebuilds this callable from in another process
    reuse = regional_reuse_applies(example_inputs)
    return reload.attach(fn, reload.make_recipe(reuse, reload.whole_body(gm, store)))
