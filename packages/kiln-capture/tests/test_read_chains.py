"""read_chains.py: the read chains of guard expressions found from their text. Every key
is the one the ``ast`` walk names, hoisting gives the same lines, and what the scanner
does not know is left to ``ast``."""

from __future__ import annotations

import ast
import re

import pytest
import torch
from torch import nn

import kiln_capture
from kiln_capture import guards, hook, read_chains

EXPRESSIONS = [
    "self._modules['h']._modules['0']._parameters['weight'] is __k_C[3]",
    "__k_attrs(self._modules['h'], __k_C[1], __k_C[2], __k_C[3], __k_C[4])",
    "__k_C[51] not in self._modules['h']._modules['0'].__dict__",
    "type(args[0]) is __k_C[4] and len(args) == 1",
    "getattr(a.b, 'z').c(1, None).d == 2",
    "getattr(a.b, 'z').c(1.0, None) is x",
    "f(*a.b) and g(a.b, k=1) is g(a.b, k=1)",
    '__k_C[26](__k_C[19]["_REG"], "<class \'m.Bert\'>") is __k_C[8]',
    "tuple(__k_C[26](__k_C[19]['_REG'], 'x')) == ('a', 'b')",
    "a[b.c] == a[-1] and a[0x10] and a[1:2] == [x.y, {'k': z.w}]",
    "x.y if p.q else (r.s)",
    "not (__k_C[50]._global_forward_hooks or __k_C[50]._global_backward_hooks)",
    "__k_tensor_check(self.w, __k_C[1], __k_C[2], (4, 8), (8, 1), False)",
    "a.b in ['a.b', b'x'] and None is not a.c and f(a.b)(1)",
    "__k_same_literal(self.config.eps, __k_C[7])",
]
LEFT_TO_AST = [
    "not any(getattr(__k_C[1], n) for n in ('p', 'q'))",
    "(lambda v: v.x)(a.b)",
    "(a.b ==\n 1)",
    "__k_G['é'].a == 'ü'",
    "f'{a.b}' == 'x'",
    "(y := a.b) is y",
    "a.b == '''x'''",
    "a.b == 'x\\'y'",
    "a[0x10].d == 1",
]


def _ast_keys(e: str) -> set[str]:
    keys: set[str] = set()
    guards._scan(ast.parse(e, mode="eval").body, keys)
    return keys


@pytest.mark.parametrize("e", EXPRESSIONS)
def test_keys_are_the_ast_walks(e):
    keys: set[str] = set()
    assert read_chains.scan(e, keys) is not None
    assert keys <= _ast_keys(e)
    # what the scanner leaves out it only misses (never a wrong key): here, constant
    # subscripts of another form than a string or a non-negative int
    assert not (_ast_keys(e) - keys) or "0x10" in e


@pytest.mark.parametrize("e", LEFT_TO_AST)
def test_what_the_scanner_does_not_know_is_left_to_ast(e):
    assert read_chains.scan(e, set()) is None


def _hoisted(exprs: list[str], scanned: bool) -> list[str]:
    if scanned:
        return guards.hoist_reads(exprs)
    real = read_chains.scan
    read_chains.scan = lambda e, keys: None
    try:
        return guards.hoist_reads(exprs)
    finally:
        read_chains.scan = real


def _unhoisted(lines: list[str]) -> list[str]:
    defs = {}
    conds = []
    for line in lines:
        if line.startswith("if not ("):
            conds.append(line[len("if not (") : -len("): return False")])
        else:
            name, _, text = line.partition(" = ")
            defs[name] = text

    def expand(text: str) -> str:
        return re.sub(r"\b__r\d+\b", lambda m: expand(defs[m.group()]), text)

    return [expand(c) for c in conds]


def _same_code(a: list[str], b: list[str]) -> bool:
    """Equal up to spelling (a key's first spelling names it: ``x["k"]``, ``x['k']``)."""
    return [ast.dump(ast.parse(e, mode="eval")) for e in a] == [
        ast.dump(ast.parse(e, mode="eval")) for e in b
    ]


def test_hoisting_is_the_ast_ones_and_reads_what_each_guard_read():
    exprs = EXPRESSIONS + LEFT_TO_AST[:1]
    lines = _hoisted(exprs, scanned=True)
    assert lines == _hoisted(exprs, scanned=False)
    assert _same_code(_unhoisted(lines), exprs)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return x + torch.relu(self.norm(self.fc(x)))


def test_a_models_guards_hoist_as_with_ast():
    model = nn.Sequential(*[Block() for _ in range(4)])
    kiln_capture.reset()
    fn = kiln_capture.optimize(lambda gm, ex: gm.forward)(model)
    x = torch.randn(3, 8)
    torch.testing.assert_close(fn(x), model(x))
    (entry,) = hook.cache_entries(type(model).forward.__code__)
    conds = entry.guard_set._conditions(entry.guard_set.guards)
    assert len(conds) > 40
    lines = _hoisted(conds, scanned=True)
    assert lines == _hoisted(conds, scanned=False)
    assert _same_code(_unhoisted(lines), conds)
    kiln_capture.reset()
