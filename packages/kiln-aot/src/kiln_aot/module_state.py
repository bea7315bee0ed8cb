"""Run a module with some of its parameters and buffers replaced (by fakes while tracing,
by the real tensors at run time), so that they become graph inputs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch


def state_names(module: torch.nn.Module) -> list[str]:
    """Dotted names of the module's parameters, then its buffers (duplicates removed)."""
    names, seen = [], set()
    for name, t in [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]:
        if id(t) not in seen:
            seen.add(id(t))
            names.append(name)
    return names


def state_tensors(module: torch.nn.Module, names: Sequence[str]) -> list[torch.Tensor]:
    return [_lookup(module, n) for n in names]


def _owner(module: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    *path, leaf = name.split(".")
    for p in path:
        module = getattr(module, p)
    return module, leaf


def _lookup(module: torch.nn.Module, name: str) -> torch.Tensor:
    owner, leaf = _owner(module, name)
    return getattr(owner, leaf)


@contextlib.contextmanager
def swapped_state(
    module: torch.nn.Module, names: Sequence[str], values: Sequence[torch.Tensor]
) -> Iterator[None]:
    """Within the block, ``module.<name>`` is ``value`` (for every alias of that tensor)."""
    by_id = {id(_lookup(module, n)): v for n, v in zip(names, values)}
    restore = []
    for mod in module.modules():
        for table in (mod._parameters, mod._buffers):
            for key, t in list(table.items()):
                if t is not None and id(t) in by_id:
                    restore.append((table, key, t))
                    table[key] = by_id[id(t)]
    try:
        yield
    finally:
        for table, key, t in reversed(restore):
            table[key] = t


class SourceTrackingInterpreter(torch.fx.Interpreter):
    """Runs a torch-level GraphModule node by node, telling the running tracer which source
    line (``meta["stack_trace"]``, set by graph capture) each ATen op comes from."""

    def run_node(self, n: torch.fx.Node):
        from kiln_aot.op_tracer import CARRIED_META, current_tracer, format_stack_trace

        tracer = current_tracer()
        if tracer is not None:
            tracer.stack_trace = n.meta.get("stack_trace")
            tracer.source = format_stack_trace(tracer.stack_trace)
            tracer.annotations = {k: n.meta[k] for k in CARRIED_META if k in n.meta}
            # the sides of data branches the capture took inside this op (kiln-capture)
            tracer.speculation = list(n.meta.get("kiln_speculation", ()))
        return super().run_node(n)


def call_module(module: torch.nn.Module, args: Sequence) -> object:
    """``module(*args)``; GraphModules run through ``SourceTrackingInterpreter``."""
    if not isinstance(module, torch.fx.GraphModule):
        return module(*args)
    from kiln_aot.op_tracer import current_tracer

    try:
        return SourceTrackingInterpreter(module).run(*args)
    finally:
        tracer = current_tracer()
        if tracer is not None:
            tracer.source = tracer.stack_trace = None  # later ops (the backward) have none
            tracer.annotations = {}
