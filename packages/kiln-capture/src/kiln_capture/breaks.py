"""The registry of graph-break reasons: stable ids, an explanation and a hint each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BreakKind:
    id: str
    why: str
    hint: str


def _k(id: str, why: str, hint: str) -> BreakKind:
    return BreakKind(id, why, hint)


PRINT = _k(
    "B001",
    "print() writes to the outside world",
    "move the print out of the model, or accept the break",
)
TENSOR_BRANCH = _k(
    "B002",
    "control flow depends on a tensor's value",
    "use torch.where, or compute the condition on shapes",
)
DATA_DEPENDENT = _k(
    "B003",
    "the op's output shape or value depends on tensor data",
    "the op runs eagerly; compute it outside the compiled function, or use an op whose "
    "output shape does not depend on the data (torch.where instead of boolean indexing)",
)
TENSOR_TO_PYTHON = _k(
    "B004", "a tensor value is converted to a Python value", "keep the value as a tensor"
)
UNKNOWN_CALLABLE = _k(
    "B005",
    "a call into a function kiln cannot trace (C function or unsupported object)",
    "the call runs eagerly; wrap it in kiln_capture.disable to silence this",
)
UNSUPPORTED_BYTECODE = _k(
    "B006",
    "a bytecode instruction kiln does not evaluate",
    "rewrite the construct, or accept the break",
)
DISABLED = _k(
    "B007", "the function is marked kiln_capture.disable", "remove the decorator to capture it"
)
NO_META = _k(
    "B008",
    "the op has no meta-device implementation, so its output cannot be described without running it",
    "the op runs eagerly; register a fake (meta) implementation for it "
    "(torch.library.register_fake) to capture it",
)
UNSUPPORTED_VALUE = _k(
    "B009",
    "an operation on a Python value kiln does not model",
    "the step runs eagerly; use tensors, constants, lists, tuples, dicts or plain objects "
    "there, or move the step out of the compiled function",
)
EXCEPTION = _k(
    "B010",
    "the captured code raises an exception",
    "the step runs eagerly and raises eager's exception; fix what makes it raise, or catch "
    "it outside the compiled function",
)
GENERIC_WITH = _k(
    "B011",
    "a with-block of a context manager kiln does not model holds a graph break "
    "(or its __enter__ cannot be traced)",
    "the manager is entered in Python and capture resumes inside its block; move the "
    "break out of the block, or use a manager kiln models (torch.no_grad, torch.autocast, "
    "a @contextlib.contextmanager function)",
)
REGION_BOUNDARY = _k(
    "B012",
    "a call of a module whose forward is compiled as a region of its own (a module "
    "sharded with fully_shard): its hooks run eagerly between the two regions",
    "nothing to do: not counted as a break; kiln.stats() counts it in region_boundaries",
)

ALL: tuple[BreakKind, ...] = (
    PRINT,
    TENSOR_BRANCH,
    DATA_DEPENDENT,
    TENSOR_TO_PYTHON,
    UNKNOWN_CALLABLE,
    UNSUPPORTED_BYTECODE,
    DISABLED,
    NO_META,
    UNSUPPORTED_VALUE,
    EXCEPTION,
    GENERIC_WITH,
    REGION_BOUNDARY,
)


@dataclass(frozen=True)
class GraphBreak:
    """One graph break as reported by explain() and the ``breaks`` log."""

    kind: BreakKind
    detail: str
    filename: str
    lineno: int
    line: str
    resumed: bool = True
    inlined_from: tuple[str, ...] = ()  # the inlined calls that led there, innermost first

    def __str__(self) -> str:
        how = "resumed after the step" if self.resumed else "the rest of the frame runs eagerly"
        via = "".join(f"\n  in {c}" for c in self.inlined_from)
        return (
            f"[{self.kind.id}] {self.detail}\n  at {self.filename}:{self.lineno}   {self.line.strip()}{via}\n"
            f"  why: {self.kind.why}\n  fix: {self.kind.hint} ({how})"
        )
