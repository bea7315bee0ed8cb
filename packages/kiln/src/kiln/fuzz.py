"""A differential fuzzer: random programs compiled with kiln.compile and run against eager.

    python -m kiln fuzz --seconds 60                 # programs from seed 0 on, for a minute
    python -m kiln fuzz --seed 1234 --count 1 -v     # one program: print it and its verdict
    python -m kiln fuzz --seconds 3600 --save failures/   # keep each failing program

Each program is Python source (so a failure is a file anyone can read and rerun) made from
one seed: inputs of random shapes (sizes 0, 1 and small primes included), dtypes (float32,
float64, bfloat16, float16, int64, int32, bool) and layouts (transposed, strided, offset,
expanded: overlapping, stride 0), then a chain of operations kiln lowers: pointwise math,
comparisons and ``where`` with broadcasting, casts, reductions, softmax, cumsum, views
(transpose, permute, reshape, slicing with steps, select, narrow, expand, unsqueeze), cat,
matmul, in-place updates of views and of inputs, indirect reads (gather, index_select,
``x[i]``, ``x[:, i]``, embedding) and accumulating indirect writes (index_add, scatter_add,
index_put with accumulate=True), whose index inputs come with the range eager accepts. The generator runs each operation eagerly as it writes it, so every program is
valid for its inputs.

Each program is then checked (``check_program``):

1. compiled and called on its inputs: outputs and inputs written in place must match eager
   (dtype-aware tolerances, NaNs equal);
2. when it has index inputs, called with one index made bad (past the end, or negative where
   eager does not wrap): it must raise the exception type eager raises, not return;
3. called on the good inputs again: still eager's results.

The driver (``main``) runs programs in a worker process and restarts it if it dies, so a
crash (a segmentation fault) is reported with its seed rather than ending the run.
"""

from __future__ import annotations

import argparse
import json
import linecache
import os
import random
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FLOATS = ("torch.float32", "torch.float64", "torch.bfloat16", "torch.float16")
INTS = ("torch.int64", "torch.int32")
DTYPES = (*FLOATS, *INTS, "torch.bool")
SIZES = (0, 1, 1, 2, 3, 3, 4, 5, 7, 8)
MAX_NUMEL = 4096


@dataclass
class IndexInput:
    """An index input: eager accepts values in [low, high); ``bad`` values it rejects."""

    name: str
    low: int
    high: int
    bad: tuple[int, ...]


@dataclass
class Program:
    seed: int
    inputs: list[str] = field(default_factory=list)  # lines of make_inputs
    names: list[str] = field(default_factory=list)  # input names, in order
    body: list[str] = field(default_factory=list)  # lines of program()
    outputs: list[str] = field(default_factory=list)
    indices: list[IndexInput] = field(default_factory=list)
    # the lowest precision any value reaches: outputs computed through a float16 value
    # agree with eager to float16's precision only, whatever dtype they end in
    low_precision: bool = False
    # likewise a float64 output computed through a float32 value (a float32 cumsum cast to
    # float64 agrees with eager to float32's precision: seed 777008)
    float32_reached: bool = False

    def source(self) -> str:
        bad = {ix.name: (ix.low, ix.high, ix.bad) for ix in self.indices}
        lines = [
            f"# kiln fuzz program, seed {self.seed}",
            "import torch",
            "import torch.nn.functional as F",
            "",
            "",
            "def make_inputs(g):",
            *(f"    {ln}" for ln in self.inputs),
            f"    return [{', '.join(self.names)}]",
            "",
            "",
            "# index inputs: name -> (low, high, values eager rejects)",
            f"INDICES = {bad!r}",
            "",
            "",
            f"def program({', '.join(self.names)}):",
            *(f"    {ln}" for ln in self.body),
            f"    return ({', '.join(self.outputs)}{',' if len(self.outputs) == 1 else ''})",
            "",
        ]
        return "\n".join(lines)


class Generator:
    """Writes one program, running each line eagerly to know the values' shapes and dtypes."""

    def __init__(self, seed: int, ops: int = 12):
        self.rng = random.Random(seed)
        self.program = Program(seed)
        self.g = torch.Generator().manual_seed(seed)
        self.env: dict[str, Any] = {"torch": torch, "F": torch.nn.functional, "g": self.g}
        self.values: list[str] = []  # names of tensors the program may use
        self.indexed: set[str] = set()  # results of indirect accesses
        self.n = 0
        self.n_ops = ops

    # -- helpers -------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def shape(self, ndim: int | None = None) -> tuple[int, ...]:
        ndim = self.rng.choice((0, 1, 2, 2, 3, 3)) if ndim is None else ndim
        return tuple(self.rng.choice(SIZES) for _ in range(ndim))

    def t(self, name: str) -> torch.Tensor:
        return self.env[name]

    def pick(self, pred: Any = None) -> str | None:
        cands = [v for v in self.values if pred is None or pred(self.t(v))]
        return self.rng.choice(cands) if cands else None

    def try_lines(self, lines: list[str], new: str | None, *, into: str = "body") -> bool:
        """Run ``lines``; keep them if they run and ``new`` is a small tensor."""
        env = dict(self.env)
        try:
            exec("\n".join(lines), env)  # the generator's own code
        except Exception:  # an invalid combination: try another
            return False
        if new is not None:
            v = env[new]
            if not isinstance(v, torch.Tensor) or v.numel() > MAX_NUMEL:
                return False
        self.env = env
        getattr(self.program, into).extend(lines)
        if new is not None and env[new].dtype in (torch.float16, torch.bfloat16):
            self.program.low_precision = True
        if new is not None and env[new].dtype == torch.float32:
            self.program.float32_reached = True
        if new is not None:
            self.values.append(new)
        return True

    # -- inputs ----------------------------------------------------------------------------
    def add_input(self, shape: tuple[int, ...] | None = None, dtype: str | None = None) -> str:
        name = self.fresh("a")
        shape = self.shape() if shape is None else shape
        dtype = dtype or self.rng.choice(DTYPES)
        layout = self.rng.choice(("plain", "plain", "transposed", "strided", "offset", "expanded"))
        if layout == "transposed" and len(shape) >= 2:
            base_shape = (*shape[:-2], shape[-1], shape[-2])
            make, post = base_shape, ".transpose(-1, -2)"
        elif layout == "strided" and len(shape) >= 1:
            make, post = (*shape[:-1], shape[-1] * 2), "[..., ::2]"
        elif layout == "offset" and len(shape) >= 1:
            make, post = (shape[0] + 1, *shape[1:]), "[1:]"
        elif layout == "expanded" and len(shape) >= 1:
            make, post = (1, *shape[1:]), f".expand({', '.join(map(str, shape))})"
        else:
            make, post = shape, ""
        if dtype in FLOATS:
            gen = f"torch.randn({make!r}, generator=g).to({dtype})"
        elif dtype == "torch.bool":
            gen = f"(torch.rand({make!r}, generator=g) > 0.5)"
        else:
            gen = f"torch.randint(-8, 9, {make!r}, generator=g).to({dtype})"
        line = f"{name} = {gen}{post}"
        ok = self.try_lines([line], name, into="inputs")
        assert ok, line
        self.program.names.append(name)
        return name

    def add_index(self, shape: tuple[int, ...], size: int, wrap: bool) -> str:
        """An int64 index input of ``shape`` with values valid for a dimension of ``size``."""
        name = self.fresh("i")
        low = -size if wrap else 0
        line = f"{name} = torch.randint({low}, {max(size, 1)}, {shape!r}, generator=g)"
        self.try_lines([line], None, into="inputs")
        self.program.names.append(name)
        bad = (size, size + 3, 10**6) + ((-size - 1,) if wrap else (-1, -size - 1))
        self.program.indices.append(IndexInput(name, low, size, bad))
        return name

    # -- operations ------------------------------------------------------------------------
    def op(self) -> None:
        kind = self.rng.choice(
            ["unary"] * 4 + ["binary"] * 4 + ["reduce"] * 2 + ["view"] * 3
            + ["cast", "cat", "matmul", "inplace", "index", "index", "softmax", "cumsum", "where"]
            + ["scatter"]
        )  # fmt: skip
        getattr(self, f"op_{kind}")()

    def _float(self, t: torch.Tensor) -> bool:
        return t.dtype.is_floating_point

    def op_unary(self) -> None:
        x = self.pick(self._float)
        if x is None:
            return
        f = self.rng.choice(
            ["torch.exp({})", "torch.sin({})", "torch.tanh({})", "torch.sigmoid({})",
             "torch.relu({})", "torch.abs({})", "-{}", "torch.sqrt(torch.abs({}))",
             "torch.log1p(torch.abs({}))", "torch.erf({})", "({} * {})", "F.gelu({})",
             "F.silu({})", "torch.clamp({}, -0.5, 0.5)", "torch.cos({})"]
        )  # fmt: skip
        y = self.fresh("v")
        self.try_lines([f"{y} = {f.format(x, x)}"], y)

    def op_binary(self) -> None:
        a = self.pick()
        b = self.pick(lambda t: t.dtype == self.t(a).dtype) if a else None
        if a is None or b is None:
            return
        numeric = self.t(a).dtype != torch.bool
        ops = ["{} + {}", "{} * {}", "torch.maximum({}, {})", "torch.minimum({}, {})", "{} - {}"]
        if not numeric:
            ops = ["{} & {}", "{} | {}", "{} ^ {}"]
        elif self._float(self.t(a)):
            ops += ["{} / ({}.abs() + 1)"]
        y = self.fresh("v")
        if self.rng.random() < 0.3 and numeric:  # a scalar operand
            line = f"{y} = {a} * {self.rng.choice([2, -3, 0.5])} + {self.rng.choice([1, 0])}"
        else:
            line = f"{y} = {self.rng.choice(ops).format(a, b)}"
        self.try_lines([line], y)

    def op_where(self) -> None:
        a = self.pick(lambda t: t.dtype != torch.bool)
        b = self.pick(lambda t: t.dtype == self.t(a).dtype) if a else None
        if a is None or b is None:
            return
        y = self.fresh("v")
        self.try_lines([f"{y} = torch.where({a} > {b}, {a}, {b})"], y)

    def op_cast(self) -> None:
        x = self.pick()
        if x is None:
            return
        y = self.fresh("v")
        dtype = self.rng.choice(DTYPES)
        if self._float(self.t(x)) and dtype in INTS:
            # NaN, inf and out-of-range floats have no defined integer (eager's and C++'s
            # conversions differ): cast only finite values in range
            self.try_lines(
                [f"{y} = torch.where({x} == {x}, {x} * 4, 0).clamp(-1000, 1000).to({dtype})"], y
            )
        else:
            self.try_lines([f"{y} = {x}.to({dtype})"], y)

    def _dim(self, t: torch.Tensor) -> int | None:
        return self.rng.randrange(-t.dim(), t.dim()) if t.dim() else None

    def op_reduce(self) -> None:
        x = self.pick(lambda t: t.dim() >= 1 and t.dtype != torch.bool)
        if x is None:
            return
        t = self.t(x)
        d = self._dim(t)
        keep = self.rng.choice([True, False])
        fs = ["{}.sum({}, keepdim={})", "{}.amax({}, keepdim={})", "{}.amin({}, keepdim={})"]
        if self._float(t):
            fs += ["{}.mean({}, keepdim={})", "{}.var({}, keepdim={})"]
        if t.shape[d] > 0 and x in self.program.names:  # no ties between computed values
            fs += ["{}.argmax({}, keepdim={})"]
        y = self.fresh("v")
        self.try_lines([f"{y} = {self.rng.choice(fs).format(x, d, keep)}"], y)

    def op_softmax(self) -> None:
        x = self.pick(lambda t: t.dim() >= 1 and t.dtype in (torch.float32, torch.float64))
        if x is None:
            return
        y = self.fresh("v")
        f = self.rng.choice(["torch.softmax", "torch.log_softmax"])
        self.try_lines([f"{y} = {f}({x}, {self._dim(self.t(x))})"], y)

    def op_cumsum(self) -> None:
        x = self.pick(lambda t: t.dim() >= 1 and t.dtype in (torch.float32, torch.int64))
        if x is None:
            return
        y = self.fresh("v")
        self.try_lines([f"{y} = torch.cumsum({x}, {self._dim(self.t(x))})"], y)

    def op_view(self) -> None:
        x = self.pick(lambda t: t.dim() >= 1)
        if x is None:
            return
        t = self.t(x)
        n = t.dim()
        d = self.rng.randrange(n)
        choices = [
            f"{x}.transpose(0, {n - 1})",
            f"{x}.permute({', '.join(map(str, self.rng.sample(range(n), n)))})",
            f"{x}.reshape(-1)",
            f"{x}.unsqueeze({d})",
            f"{x}.flip({d})",
            f"{x}.contiguous()",
        ]
        if t.shape[d] >= 2:
            choices += [
                f"{x}.narrow({d}, 1, {t.shape[d] - 1})",
                f"{x}.select({d}, {self.rng.randrange(t.shape[d])})",
                f"{x}[{'..., ' * 0}{':, ' * d}::2]",
                f"{x}[{':, ' * d}{t.shape[d] // 2}:]",
            ]
        if t.shape[d] == 1:
            shape = list(t.shape)
            shape[d] = self.rng.choice([2, 3])
            choices.append(f"{x}.expand({', '.join(map(str, shape))})")
        y = self.fresh("v")
        self.try_lines([f"{y} = {self.rng.choice(choices)}"], y)

    def op_cat(self) -> None:
        a = self.pick(lambda t: t.dim() >= 1)
        if a is None:
            return
        ta = self.t(a)
        b = self.pick(lambda t: t.dim() == ta.dim() and t.dtype == ta.dtype)
        d = self.rng.randrange(ta.dim())
        y = self.fresh("v")
        self.try_lines([f"{y} = torch.cat([{a}, {b}], {d})"], y)

    def op_matmul(self) -> None:
        a = self.pick(lambda t: t.dim() == 2 and t.dtype in (torch.float32, torch.float64))
        if a is None:
            return
        ta = self.t(a)
        w = self.add_input((ta.shape[1], self.rng.choice((1, 3, 8))), str(ta.dtype))
        y = self.fresh("v")
        self.try_lines([f"{y} = {a} @ {w}"], y)

    def op_inplace(self) -> None:
        x = self.pick(lambda t: t.dim() >= 1 and t.dtype in (torch.float32, torch.float64))
        if x is None:
            return
        t = self.t(x)
        y = self.fresh("v")
        d = self.rng.randrange(t.dim())
        view = self.rng.choice(
            [f"{y}[{':, ' * d}::2]", f"{y}.select({d}, 0)", f"{y}.transpose(0, -1)", y]
        )
        update = self.rng.choice(["add_(1.5)", "mul_(-2)", "clamp_(-1, 1)", "zero_()", "exp_()"])
        if x in self.program.names and self.rng.random() < 0.3 and t.is_contiguous():
            # the caller's tensor itself, written in place (compared after the call)
            self.try_lines([f"{view.replace(y, x)}.{update}", f"{y} = {x} * 1"], y)
        else:
            self.try_lines([f"{y} = {x}.clone()", f"{view}.{update}"], y)

    def op_index(self) -> None:
        x = self.pick(lambda t: t.dim() >= 1 and t.numel() > 0 and t.dtype != torch.bool)
        if x is None:
            return
        t = self.t(x)
        y = self.fresh("v")
        self.indexed.add(y)
        kind = self.rng.choice(["gather", "index_select", "getitem", "getitem_dim1", "embedding"])
        if kind == "gather":
            d = self.rng.randrange(t.dim())
            shape = tuple(self.rng.randint(1, max(s, 1)) if s else 0 for s in t.shape)
            shape = tuple(
                min(s, t.shape[k]) if k != d else self.rng.choice((1, 2, 4))
                for k, s in enumerate(shape)
            )
            i = self.add_index(shape, t.shape[d], wrap=False)
            self.try_lines([f"{y} = torch.gather({x}, {d}, {i})"], y)
        elif kind == "index_select":
            d = self.rng.randrange(t.dim())
            i = self.add_index((self.rng.choice((1, 3, 6)),), t.shape[d], wrap=False)
            self.try_lines([f"{y} = torch.index_select({x}, {d}, {i})"], y)
        elif kind == "getitem":
            i = self.add_index(self.shape(self.rng.choice((1, 2))), t.shape[0], wrap=True)
            self.try_lines([f"{y} = {x}[{i}]"], y)
        elif kind == "getitem_dim1" and t.dim() >= 2:
            i = self.add_index((self.rng.choice((1, 4)),), t.shape[1], wrap=True)
            self.try_lines([f"{y} = {x}[:, {i}]"], y)
        elif kind == "embedding" and t.dim() == 2 and self._float(t):
            i = self.add_index(self.shape(self.rng.choice((1, 2))), t.shape[0], wrap=False)
            self.try_lines([f"{y} = F.embedding({i}, {x})"], y)

    def op_scatter(self) -> None:
        """Accumulating writes through indices (duplicates included, so sums are compared
        whatever the order): index_add, scatter_add, index_put with accumulate=True."""
        x = self.pick(
            lambda t: t.dim() >= 1 and t.numel() > 0 and t.dtype != torch.bool and t.dim() <= 3
        )
        if x is None:
            return
        t = self.t(x)
        y = self.fresh("v")
        self.indexed.add(y)
        d = self.rng.randrange(t.dim())
        kind = self.rng.choice(["index_add", "scatter_add", "index_put"])
        dtype = str(t.dtype)
        if kind == "index_add":
            n = self.rng.choice((1, 3, 6))
            i = self.add_index((n,), t.shape[d], wrap=False)
            src = self.add_input(tuple(n if k == d else s for k, s in enumerate(t.shape)), dtype)
            self.try_lines([f"{y} = torch.index_add({x}, {d}, {i}, {src})"], y)
        elif kind == "scatter_add":
            shape = tuple(
                self.rng.choice((1, 2, 5)) if k == d else self.rng.randint(1, s)
                for k, s in enumerate(t.shape)
            )
            i = self.add_index(shape, t.shape[d], wrap=False)
            src = self.add_input(shape, dtype)
            self.try_lines([f"{y} = torch.scatter_add({x}, {d}, {i}, {src})"], y)
        else:
            n = self.rng.choice((1, 4))
            i = self.add_index((n,), t.shape[0], wrap=True)
            src = self.add_input((n, *t.shape[1:]), dtype)
            self.try_lines([f"{y} = {x}.index_put(({i},), {src}, accumulate=True)"], y)

    # -- the program -----------------------------------------------------------------------
    def generate(self) -> Program:
        for _ in range(self.rng.choice((1, 2, 2, 3))):
            self.add_input()
        for _ in range(self.n_ops):
            self.op()
        computed = [v for v in self.values if v not in self.program.names]
        if not computed:
            x = self.values[0]
            y = self.fresh("v")
            self.try_lines(
                [f"{y} = {x} * 1" if self.t(x).dtype != torch.bool else f"{y} = ~{x}"], y
            )
            computed = [y]
        outs = computed[-2:] + self.rng.sample(computed, min(len(computed), 2))
        # every indexing result is an output: a compiler (kiln's and torch's) computes only
        # what reaches an output, so a bad index into a dead or partly read result is never
        # read there, where eager reads it and raises
        outs += [v for v in computed if v in self.indexed]
        self.program.outputs = list(dict.fromkeys(outs))
        return self.program


def generate(seed: int, ops: int = 12) -> Program:
    return Generator(seed, ops).generate()


# -- checking ------------------------------------------------------------------------------


def load(source: str, filename: str) -> dict[str, Any]:
    """Run a program's source as a module of ``filename`` (registered with linecache, so
    capture and error messages see its lines)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns: dict[str, Any] = {"__name__": f"kiln_fuzz_{abs(hash(filename))}"}
    exec(compile(source, filename, "exec"), ns)  # the fuzzer's own programs
    return ns


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.bfloat16, torch.float16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype == torch.float32:
        return {"rtol": 1e-4, "atol": 1e-4}
    return {"rtol": 1e-7, "atol": 1e-7}


def _compare(got: Any, want: Any, what: str, low: bool = False, mid: bool = False) -> str | None:
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{what}: got {type(got).__name__}, eager a tensor"
        if got.shape != want.shape or got.dtype != want.dtype:
            return (
                f"{what}: got {got.dtype}{tuple(got.shape)}, eager {want.dtype}{tuple(want.shape)}"
            )
        try:
            if want.dtype.is_floating_point:
                floor = torch.float16 if low else torch.float32 if mid else torch.float64
                tol = _tolerance(max(floor, want.dtype, key=lambda d: -d.itemsize))
                torch.testing.assert_close(got, want, equal_nan=True, **tol)
            else:
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        except AssertionError as e:
            return f"{what}: {str(e).splitlines()[0]} {' '.join(str(e).split())[:300]}"
        return None
    if isinstance(want, (tuple, list)):
        if len(got) != len(want):
            return f"{what}: {len(got)} values, eager {len(want)}"
        for k, (a, b) in enumerate(zip(got, want)):
            bad = _compare(a, b, f"{what}[{k}]", low, mid)
            if bad:
                return bad
        return None
    return None if got == want else f"{what}: {got!r} != {want!r}"


def _clone(xs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _run(fn: Any, inputs: list[Any]) -> tuple[Any, list[Any], BaseException | None]:
    args = _clone(inputs)
    try:
        return fn(*args), args, None
    except Exception as e:  # the exception is the result compared
        return None, args, e


@dataclass
class Verdict:
    seed: int
    status: str  # "ok", "mismatch", "error" (kiln raised where eager did not), "skipped"
    detail: str = ""
    fallbacks: int = 0
    bad_calls: int = 0  # calls with a bad index that raised as eager does
    # why graphs ran eagerly (kiln's warnings, first line): findings of their own
    fallback_reasons: list[str] = field(default_factory=list)


def check_program(program: Program, compile_fn: Any = None) -> Verdict:
    """Compile ``program`` (kiln.compile by default) and compare it with eager."""
    import kiln

    compile_fn = compile_fn or kiln.compile
    ns = load(program.source(), f"kiln_fuzz_{program.seed}.py")
    inputs = ns["make_inputs"](torch.Generator().manual_seed(program.seed))
    fn = ns["program"]
    want, want_args, eager_error = _run(fn, inputs)
    if eager_error is not None:
        return Verdict(program.seed, "skipped", f"eager raised {eager_error!r}")
    kiln.reset()
    compiled = compile_fn(fn)
    v = Verdict(program.seed, "ok")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _check_compiled(program, fn, compiled, inputs, want, want_args, v)
    v.fallbacks = kiln.stats()["fallbacks"]
    v.fallback_reasons = sorted(
        {str(w.message).splitlines()[0][:200] for w in caught if "eager" in str(w.message)}
    )
    return v


def _check_compiled(
    program: Program, fn: Any, compiled: Any, inputs: list, want: Any, want_args: list, v: Verdict
) -> None:

    def call(args: list[Any], when: str) -> str | None:
        got, got_args, err = _run(compiled, args)
        if err is not None:
            return f"{when}: kiln raised {type(err).__name__}: {err}\n{''.join(traceback.format_exception(err))[-2000:]}"
        low, mid = program.low_precision, program.float32_reached
        return _compare(got, want, f"{when}: outputs", low, mid) or _compare(
            got_args, want_args, f"{when}: inputs after the call", low, mid
        )

    bad = call(inputs, "first call")
    used = [ix for ix in program.indices if any(ix.name in ln for ln in program.body)]
    if bad is None and used:
        ix = random.Random(program.seed).choice(used)
        pos = program.names.index(ix.name)
        corrupt = _clone(inputs)
        if corrupt[pos].numel():
            flat = corrupt[pos].view(-1)
            flat[len(flat) // 2] = ix.bad[program.seed % len(ix.bad)]
            _, _, eager_err = _run(fn, corrupt)
            _, _, kiln_err = _run(compiled, corrupt)
            if eager_err is not None:
                if kiln_err is None:
                    bad = f"bad index in {ix.name}: eager raised {eager_err!r}, kiln returned"
                elif type(kiln_err) is not type(eager_err):
                    bad = f"bad index in {ix.name}: eager raised {eager_err!r}, kiln {kiln_err!r}"
                else:
                    v.bad_calls += 1
            if bad is None:
                bad = call(inputs, "after the bad call")
    if bad is not None:
        v.status = "error" if "kiln raised" in bad else "mismatch"
        v.detail = bad


# -- the driver ----------------------------------------------------------------------------


def _worker(start: int, count: int, ops: int) -> int:
    """Check programs ``start .. start+count-1``; a line per program on stdout."""
    for seed in range(start, start + count):
        print(f"BEGIN {seed}", flush=True)
        program = generate(seed, ops)
        try:
            v = check_program(program)
        except Exception as e:  # the fuzzer's own failure is a finding too
            v = Verdict(
                seed, "error", f"check_program raised {e!r}\n{traceback.format_exc()[-2000:]}"
            )
        print("RESULT " + json.dumps(v.__dict__), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--count", type=int, default=0, help="programs to run (0: until --seconds)")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--ops", type=int, default=12, help="operations per program")
    p.add_argument("--save", default="", help="folder to write each failing program to")
    p.add_argument("--out", default="", help="JSON summary path")
    p.add_argument("-v", "--verbose", action="store_true", help="print each program")
    p.add_argument("--worker", nargs=2, type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a.worker[0], a.worker[1], a.ops)

    t0 = time.monotonic()
    seed, end = a.seed, a.seed + a.count if a.count else None
    counts = {"ok": 0, "mismatch": 0, "error": 0, "skipped": 0, "crash": 0}
    failures: list[dict] = []
    stats = {"fallback_programs": 0, "bad_calls": 0}
    reasons: dict[str, int] = {}
    batch = 200
    while (end is None or seed < end) and time.monotonic() - t0 < a.seconds:
        n = batch if end is None else min(batch, end - seed)
        cmd = [
            sys.executable,
            "-m",
            "kiln",
            "fuzz",
            "--worker",
            str(seed),
            str(n),
            "--ops",
            str(a.ops),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        running = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("BEGIN "):
                running = int(line.split()[1])
            elif line.startswith("RESULT "):
                v = json.loads(line[7:])
                running = None
                counts[v["status"]] += 1
                stats["bad_calls"] += v["bad_calls"]
                stats["fallback_programs"] += v["fallbacks"] > 0
                for r in v["fallback_reasons"]:
                    reasons[r] = reasons.get(r, 0) + 1
                seed = v["seed"] + 1
                if v["status"] in ("mismatch", "error"):
                    failures.append(v)
                    _report(v, a.save, a.ops)
                elif a.verbose:
                    print(generate(v["seed"], a.ops).source(), v, sep="\n")
                if time.monotonic() - t0 > a.seconds:
                    proc.kill()
                    break
        code = proc.wait()
        if running is not None and code not in (0, -9):
            v = {"seed": running, "status": "crash", "detail": f"the worker died (exit {code})"}
            counts["crash"] += 1
            failures.append(v)
            _report(v, a.save, a.ops)
            seed = running + 1
        done = sum(counts.values())
        print(
            f"[kiln fuzz] {done} programs in {time.monotonic() - t0:.0f}s: {counts}",
            file=sys.stderr,
            flush=True,
        )
    summary = {"first_seed": a.seed, "next_seed": seed, "seconds": round(time.monotonic() - t0, 1),
               "ops": a.ops, "counts": counts, **stats, "failures": failures,
               "fallback_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1]))}  # fmt: skip
    print(
        json.dumps({k: v for k, v in summary.items() if k not in ("failures", "fallback_reasons")})
    )
    for reason, n in list(summary["fallback_reasons"].items())[:10]:
        print(f"  {n:5d} programs fell back: {reason}")
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=2))
    return 1 if failures else 0


def _report(v: dict, save: str, ops: int) -> None:
    print(f"[kiln fuzz] seed {v['seed']}: {v['status']}: {v['detail'][:1500]}", file=sys.stderr)
    if save:
        os.makedirs(save, exist_ok=True)
        src = generate(v["seed"], ops).source()
        Path(save, f"seed_{v['seed']}.py").write_text(
            src + f"\n# {v['status']}: " + v["detail"].replace("\n", "\n# ") + "\n"
        )


if __name__ == "__main__":
    sys.exit(main())
