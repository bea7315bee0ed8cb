"""kiln_triton.compile_fx: kiln-inductor's compile_fx with Triton kernels, plus modes.

``mode`` follows torch.compile: ``None``/``"default"``; ``"reduce-overhead"`` (CUDA
graphs); ``"max-autotune"`` (every launch configuration measured, and CUDA graphs);
``"max-autotune-no-cudagraphs"``. ``options`` may set ``"triton.cudagraphs"`` and
``"max_autotune"`` explicitly (they win over the mode).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx

import kiln_inductor
from kiln_inductor.config import MODES  # the one table of modes

from .config import settings_scope
from .cudagraphs import CudaGraphRunner

OPTIONS = ("triton.cudagraphs", "max_autotune")
_ids = itertools.count()


def resolve_options(mode: str | None, options: dict[str, Any] | None) -> dict[str, bool]:
    if mode not in MODES:
        raise ValueError(
            f"kiln-triton: unknown mode {mode!r}; expected one of {[m for m in MODES if m]}"
        )
    unknown = set(options or {}) - set(OPTIONS)
    if unknown:
        raise ValueError(
            f"kiln-triton: unknown options {sorted(unknown)}; it reads {list(OPTIONS)}"
        )
    out = {"triton.cudagraphs": False, "max_autotune": False}
    out.update(MODES[mode])
    out.update({k: bool(v) for k, v in (options or {}).items()})
    return out


def _training_runners(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """An ATen graph compiled; the forward and the backward graph of a training step (as
    kiln-aot marks them) each in a CUDA graph runner that lends what only the other one
    reads (the saved tensors) and the gradients (cudagraphs.py, "copied and lent
    outputs"). The runner around the whole step replays inference graphs."""
    compiled = kiln_inductor.compile_aten_graph(gm, example_inputs)
    training = gm.meta.get("kiln_aot_training")
    if training is None:
        return compiled
    copied = int(training["outputs"]) if training["role"] == "forward" else 0
    return CudaGraphRunner(compiled, f"graph{next(_ids)}.{training['role']}", copied=copied)


# kiln-aot compiles the backward with the forward here, not on its first call (its
# backward_variants.py, "Lazy compilation"): compiling and autotuning inside a backward
# that a user's torch.cuda.graph capture of the whole step records would fail there
_training_runners.kiln_eager_backward = True  # type: ignore[attr-defined]


def compile_fx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """Compile a torch-level or ATen-level FX graph of CUDA tensors into a callable
    (DESIGN.md contract 1: usable as ``torch.compile(fn, backend=kiln_triton.compile_fx)``)."""
    opts = resolve_options(mode, options)
    graphs = opts["triton.cudagraphs"]
    with settings_scope(max_autotune=opts["max_autotune"], cudagraphs=graphs):
        compiled = kiln_inductor.compile_fx(
            gm, list(example_inputs), compile_graph=_training_runners if graphs else None
        )
    if graphs:
        runner = CudaGraphRunner(compiled, f"graph{next(_ids)}")
        inner = getattr(compiled, "kiln_guarded_call", None)
        if inner is not None:  # kiln-capture calls it on cache hits its guards cover
            runner.kiln_guarded_call = runner.guarded(inner)  # type: ignore[attr-defined]
        return runner
    return compiled
