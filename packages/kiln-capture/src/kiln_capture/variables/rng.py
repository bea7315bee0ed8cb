"""The CPU generator's state in captured code: ``torch.manual_seed``, ``get_rng_state`` and
``set_rng_state`` (issue #17: OpInfo's random ops run inside ``freeze_rng_state()`` and
``torch.manual_seed(42)``).

Design. Random ops stay in the graph and run as library calls on ATen's default generator,
in program order (kiln-aot keeps them as fallback kernels), so the graph draws the numbers
eager code would draw from the generator state it starts in. The calls that read or write
that state are not graph ops; they run in the generated code, around the graph:

- before the graph (``out.prelude``), while the graph holds no random op yet: nothing the
  graph computes before that point depends on the generator, so moving the call ahead of
  the graph changes no value. ``get_rng_state()`` there gives an ``RngStateVar``, a
  local of the generated code (``__k_rng<i>``);
- after the graph (a side effect replayed in program order), once the graph holds a random
  op: the writes (``manual_seed``, ``set_rng_state``) then run after every random op of
  the graph, as in eager code, as long as no random op follows them. A random op recorded
  after such a write is a break (``RngOrder``: ``OutputGraph.record`` asks ``check_op``),
  as is ``get_rng_state()`` after a random op (its value would be mid-graph).

``torch._C._DisableTorchDispatch`` / ``_DisableFuncTorch`` (``no_dispatch()``, used by
``freeze_rng_state``) are no-op context managers here: captured code runs under no torch
dispatch mode or functorch transform, so they change nothing the trace records.
"""

from __future__ import annotations

import torch

from kiln_capture import breaks
from kiln_capture.errors import Unsupported
from kiln_capture.variables.base import Var
from kiln_capture.variables.constants import ConstVar

_SEEDS = (torch.manual_seed, torch.random.manual_seed, torch.seed)
_GET_STATE = (torch.get_rng_state, torch.random.get_rng_state)
_SET_STATE = (torch.set_rng_state, torch.random.set_rng_state)
RNG_FUNCTIONS = frozenset((*_SEEDS, *_GET_STATE, *_SET_STATE))
NO_OP_GUARDS = (torch._C._DisableTorchDispatch, torch._C._DisableFuncTorch)


def rng_function(fn) -> object | None:
    """The generator function ``fn`` is, through wrappers (``torch._disable_dynamo``
    wraps ``torch.manual_seed`` once torch's test utilities are imported); else None."""
    for _ in range(4):
        try:
            if fn in RNG_FUNCTIONS:
                return fn
        except TypeError:  # unhashable
            return None
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            return None
    return None


class RngStateVar(Var):
    """The generator state ``get_rng_state()`` returned, read before the graph."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = None

    def __repr__(self) -> str:
        return f"RngState({self.name})"

    def python_type(self) -> type:
        return torch.Tensor

    def reconstruct(self, cg) -> str:
        return self.name


def _random_op_recorded(out) -> bool:
    from kiln_capture.variables.fresh_modules import _graph_has_random_op

    return _graph_has_random_op(out)


def check_op(out, name: str) -> None:
    """Called before ``out`` records an op: a random op after a generator write that runs
    after the graph would draw from the wrong state."""
    from kiln_capture.variables.fresh_modules import _RANDOM_NAMES

    if getattr(out, "rng_write_after", False) and any(r in name.lower() for r in _RANDOM_NAMES):
        raise Unsupported(
            breaks.UNKNOWN_CALLABLE,
            f"random op {name} after a generator write (manual_seed/set_rng_state) "
            "in the same graph",
        )


def call_rng_function(tx, fn, args: list[Var], kwargs: dict[str, Var]) -> Var:
    out = tx.out
    g = out.guards
    if kwargs or len(args) > 1:
        raise Unsupported(breaks.UNKNOWN_CALLABLE, f"{fn.__name__} with these arguments")
    before = not _random_op_recorded(out) and not getattr(out, "rng_write_after", False)
    if fn in _GET_STATE:
        if not before:
            raise Unsupported(
                breaks.UNKNOWN_CALLABLE, "get_rng_state() after a random op of the graph"
            )
        name = f"__k_rng{len(out.prelude)}"
        out.prelude.append(f"{name} = {g.const(torch.get_rng_state)}()")
        return RngStateVar(name)
    if fn in _SEEDS:
        if fn is torch.seed or not (args and args[0].is_const()):
            raise Unsupported(breaks.UNKNOWN_CALLABLE, f"{fn.__name__} of a computed seed")
        statement = f"{g.const(torch.manual_seed)}({args[0].as_const()!r})"
        result: Var = out.wrap_value(torch.default_generator)
    else:
        if not args or not isinstance(args[0], RngStateVar):
            raise Unsupported(
                breaks.UNKNOWN_CALLABLE, "set_rng_state of a state not read by get_rng_state"
            )
        statement = f"{g.const(torch.set_rng_state)}({args[0].name})"
        result = ConstVar(None)
    if before:
        out.prelude.append(statement)
    else:
        out.rng_write_after = True
        out.side_effects.call_after(statement)
    return result
