"""With-statements on context managers kiln does not model (user classes,
``contextlib.contextmanager`` generators, ``nullcontext``, ``warnings.catch_warnings``,
``torch.random.fork_rng``): a graph break inside the block enters the manager in Python
and capture resumes inside the block; the manager's own log is part of each result, so
the corpus checks that ``__enter__``/``__exit__`` ran once each, in order."""

import contextlib
import warnings

import torch
from torch import nn

from corpus import T, case
from kiln_capture import disable


class Recorder:
    """A context manager with no tensor semantics that logs its calls."""

    def __init__(self, log, tag):
        self.log = log
        self.tag = tag
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        self.log.append(("enter", self.tag))
        return self

    def __exit__(self, typ, value, tb):
        self.depth -= 1
        self.log.append(("exit", self.tag, typ))
        return False


class Suppress(Recorder):
    def __exit__(self, typ, value, tb):
        super().__exit__(typ, value, tb)
        return typ is not None and issubclass(typ, ValueError)


@contextlib.contextmanager
def scope(log, tag):
    log.append(("enter", tag))
    try:
        yield tag
    finally:
        log.append(("exit", tag))


@disable
def eager_note(log, what):
    log.append(("note", what))


@disable
def fail(x):
    raise ValueError(f"bad {x.shape}")


@case(graphs=3, breaks=2)
def user_with_break_resumes_inside(x):
    log = []
    y = x * 2
    with Recorder(log, "a") as r:
        y = y + 1
        print("inside a user context manager")
        y = y * r.depth
    return y - 1, log


class Depth:
    """A global manager whose state is the same before and after each call."""

    depth = 0

    def __enter__(self):
        self.depth += 1

    def __exit__(self, *exc):
        self.depth -= 1


_GLOBAL_CTX = Depth()


@case(graphs=2, breaks=2)
def global_user_context(x):
    with _GLOBAL_CTX:
        y = x * 2
        print("inside a global user context manager")
    return y + _GLOBAL_CTX.depth


@case(graphs=1, breaks=2)  # no op before the with, none between it and the break
def enter_result_used_after_break(x):
    log = []
    with Recorder(log, "r") as r:
        eager_note(log, r.tag)
        y = x + r.depth
    return y, log


@case(graphs=1, breaks=0)
def generator_context_manager(x):
    log = []
    y = x * 2
    with scope(log, "g") as tag:  # its setup and teardown are traced into the graph
        y = y + len(tag)
    return y * 3, log


@case(graphs=3, breaks=3)  # the with (entered in Python), the eager call, the real __exit__
def generator_context_manager_with_break(x):
    log = []
    y = x.sin()
    with scope(log, "g"):
        y = y + 1
        eager_note(log, "in")
        y = y.cos()
    return y, log


@case(graphs=2, breaks=2)  # its __enter__/__exit__ are traced: B011 and the print
def nullcontext_with_break(x):
    y = x * 2
    with contextlib.nullcontext(y) as z:
        print("inside nullcontext")
        y = z + 1
    return y.exp()


@case(graphs=1, breaks=0)
def nullcontext_without_break(x):
    with contextlib.nullcontext():
        y = x * 2
    return y + 1


@case(graphs=3, breaks=3)
def catch_warnings_with_break(x):
    y = x * 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = y.relu()
    return y + 1


@case(graphs=2, breaks=1)  # fork_rng restores the state after the graph: the next rand breaks
def fork_rng_with_break(x):
    y = x * 2
    with torch.random.fork_rng():
        torch.manual_seed(3)
        y = y + torch.rand(4, 4)
    return y + torch.rand(4, 4)


@case(graphs=3, breaks=3)  # the outer with, then the inner one, then the print
def nested_user_withs_break_in_inner(x):
    log = []
    y = x * 2
    with Recorder(log, "outer"):
        y = y + 1
        with Recorder(log, "inner") as inner:
            print("inside two user context managers")
            y = y * (inner.depth + 1)
        y = y - 3
    return y, log


@case(graphs=2, breaks=2, args=lambda: (T(4, 4, grad=True),))
def user_with_inside_no_grad(x):
    log = []
    with torch.no_grad():
        y = x * 2
        with Recorder(log, "u"):
            print("user context inside no_grad")
            z = y * x
    return y, z, z.requires_grad, log


@case(graphs=2, breaks=2, args=lambda: (T(4, 4, grad=True),))
def no_grad_inside_user_with(x):
    log = []
    with Recorder(log, "u"):
        y = x * 2
        with torch.no_grad():
            print("no_grad inside a user context")
            z = y * x
        w = z + y
    return w, w.requires_grad, log


@case(graphs=6, breaks=9)  # per iteration: the with, the eager call, the loop head
def user_with_break_in_loop(x):
    log = []
    y = x
    for i in range(3):
        with Recorder(log, i) as r:
            y = y + 1
            eager_note(log, i)
            y = y * (r.depth + i)
        y = y - 1
    return y, log


@case(graphs=3, breaks=2)  # the raise re-enters the frame's code: its handler is captured too
def exception_suppressed_by_exit(x):
    log = []
    y = x * 2
    with Suppress(log, "s"):
        y = y + 1
        fail(y)
        y = y * 100  # not reached
    return y - 1, log


@case(graphs=2, breaks=2)
def return_inside_user_with_after_break(x):
    log = []
    with Recorder(log, "ret"):
        y = x.tanh()
        print("returning from inside a with")
        return y * 2, log


class _LoggedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, log):
        with Recorder(log, "block"):
            h = self.lin(x)
            if h.sum() > 1000:  # a tensor-dependent branch inside the block
                h = h / 2
        return h.relu()


_LOGGED = _LoggedBlock()


@case(graphs=3, breaks=3)
def user_with_in_module_forward(x):
    log = []
    return _LOGGED(x, log) * 2, log


@case(graphs=2, breaks=6)  # per iteration run: the with, the eager call, the loop head
def break_and_continue_inside_user_with(x):
    log = []
    for i in range(4):
        with Recorder(log, i):
            x = eager_note(log, i) or x * 2
            if i == 1:
                break
            if i == 0:
                continue
            x = x + 1
    return x, log


@case(graphs=3, breaks=4, args=lambda: (T(3, 3), T(3, 3, grad=True)))
def inference_mode_with_break(x, w):  # the mode is entered in Python; inputs keep their flag
    y = x @ w
    with torch.inference_mode():
        z = y * 2
        print("inside inference_mode")
        z = z + w
    return z, z.is_inference(), y.requires_grad, torch.is_inference_mode_enabled()
