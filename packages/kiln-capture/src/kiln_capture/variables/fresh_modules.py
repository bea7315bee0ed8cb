"""torch.nn modules built inside the captured frame (``nn.Sequential(nn.ReLU())(x)``, an
``nn.Linear`` made on each call).

Design note: "fresh modules"
----------------------------
Eager code builds a new module object on every call, so guarding the object's identity
(as for a module read from the frame) recompiles every call. A fresh module is instead
built twice, the same way each time:

- while capturing, once, for real (a template: its attributes, parameters' shapes and
  dtypes, submodules), with the RNG state put back afterwards, so that capture consumes
  no random numbers;
- by the generated code, before the graph runs, on every call (``__k_m<i> = Linear(4, 3)``),
  as the frame would: the parameters are the eager ones (initialized from the RNG as eager
  initializes them), graph inputs read from ``__k_m<i>`` (FreshSource) with no guard, and
  the object is the one the frame's code sees if it escapes (returned, stored).

What a fresh module does depends only on its class and constructor arguments: the class is
a constant of the trace, the arguments are constants (guarded where they were read) or
other fresh modules, and the default dtype and device are guarded. Only torch.nn's own
module classes are built this way (their constructors have no effect but the RNG's), and
subclasses with no constructor of their own; modules of other classes made in captured
code still break the graph.

Building before the graph moves the construction's random numbers before the graph's: a
module is built fresh only while the graph holds no random op yet (else the call breaks).
"""

from __future__ import annotations

import torch
from torch import nn

from kiln_capture.sources import FreshSource
from kiln_capture.variables.base import Var
from kiln_capture.variables.modules import ModuleVar

# op names of random-number consumers (matched on a graph node's target name)
_RANDOM_NAMES = (
    "rand",
    "dropout",
    "bernoulli",
    "multinomial",
    "normal",
    "uniform",
    "poisson",
    "exponential",
    "cauchy",
    "geometric",
    "random",
    "rrelu",  # training=True draws each negative slope
    "fractional_max_pool",  # draws its pooling offsets unless given _random_samples
    "gumbel",
    "scaled_dot_product_attention",  # dropout_p > 0 draws a mask
    "multi_head_attention_forward",  # likewise
)


class FreshModuleVar(ModuleVar):
    """A module built by the generated code before the graph (see the design note)."""

    def __repr__(self) -> str:
        return f"FreshModule({type(self.value).__name__})"


def _is_torch_module_class(cls: type) -> bool:
    """torch.nn's own module classes, and the user's subclasses that define no
    constructor of their own (``class Block(nn.Module): def forward(...)``): built by
    ``nn.Module.__init__`` alone, they too have no effect but making the object."""
    if not issubclass(cls, nn.Module):
        return False
    if (cls.__module__ or "").startswith("torch.nn."):
        return True
    own = cls.__mro__[: cls.__mro__.index(nn.Module)]
    return not any("__init__" in vars(k) or "__new__" in vars(k) for k in own)


def _graph_has_random_op(out) -> bool:
    for node in out.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if any(r in name.lower() for r in _RANDOM_NAMES):
            return True
    return False


def _argument(v: Var) -> tuple[object, str] | None:
    """The real value and the generated-code expression of a constructor argument."""
    if isinstance(v, FreshModuleVar):
        return v.value, v.source.expr()
    if v.is_const() and not isinstance(v.as_const(), nn.Module):
        return v.as_const(), ""
    return None


def build_keeping_rng(cls: type, args: list, kwargs: dict) -> nn.Module | None:
    """``cls(*args, **kwargs)`` built while capturing, with the RNG state put back (its
    parameters' initialization must not shift the random numbers eager code draws); None
    when the constructor raises (capture then breaks there and eager code raises it)."""
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        return cls(*args, **kwargs)
    except Exception:
        return None
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def build_fresh_module(tx, cls: type, args: list[Var], kwargs: dict[str, Var]) -> Var | None:
    """``cls(*args, **kwargs)`` as a fresh module, or None where it cannot be one."""
    if not _is_torch_module_class(cls) or _graph_has_random_op(tx.out):
        return None
    parts = [_argument(a) for a in args]
    named = {k: _argument(v) for k, v in kwargs.items()}
    if any(p is None for p in parts) or any(p is None for p in named.values()):
        return None
    out = tx.out
    module = build_keeping_rng(cls, [p[0] for p in parts], {k: p[0] for k, p in named.items()})
    if (
        module is None
        or module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
    ):
        return None
    out.guard_factory_defaults()

    def expr(p: tuple[object, str]) -> str:
        value, text = p
        return text or out.guards.const(value)

    source = FreshSource(len(out.prelude))
    call = ", ".join([*(expr(p) for p in parts), *(f"{k}={expr(p)}" for k, p in named.items())])
    out.prelude.append(f"{source.expr()} = {out.guards.const(cls)}({call})")
    out.freeze(source)
    out.module_sources.add(source)
    return FreshModuleVar(module, source)


__all__ = ["FreshModuleVar", "build_fresh_module", "build_keeping_rng"]
