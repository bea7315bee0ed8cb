"""The read chains of guard expressions, found in their text without parsing them.

Design note: "scanning read chains"
-----------------------------------
``guards.hoist_reads`` computes every read chain that several guards share once (the
"lean guard functions" note in guards.py). It found the chains by parsing each
expression with ``ast``; a 24-layer transformer has ~1,500 guards and ~250 KB of text,
mostly chains a dozen reads deep (``self._modules['encoder']._modules['layer']...``),
and parsing them into trees and walking the trees cost ~0.2 s of a cold first call,
growing with depth. kiln writes these expressions itself, so a scanner of their text
answers the same question: one regular expression splits an expression into tokens
(a whole attribute / constant-subscript chain is one token), and a small recursive walk
over the tokens finds calls of chains on chains and constants.

``scan`` gives the same nodes (span, key) that the ``ast`` walk gives for every chain
(``guards._scan``'s keys, the same text) or None, meaning "let ``ast`` do it": an
expression of several lines, one with a scope of its own (``lambda``, a comprehension:
its names are not the function's), an assignment expression, a triple-quoted or
f-string, or anything the scanner does not know. Where the scanner is unsure whether
something is a chain it says it is not: a chain it misses is only read where it stands.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

_STR = r"""(?:[bB]?(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))"""
_SUB = rf"\[(?:{_STR}|\d+)\]"
_NAME = r"[^\W\d]\w*"
_KEYWORDS = (
    "False|None|True|and|as|assert|async|await|break|class|continue|def|del|elif|else|"
    "except|finally|for|from|global|if|import|in|is|lambda|nonlocal|not|or|pass|raise|"
    "return|try|while|with|yield"
)
_TOKEN = re.compile(
    rf"""
    (?P<bad>'''|\"\"\"|[rRuUfF][bB]?['"]|[bB][rR]['"]|:=|\b(?:lambda|for|await|yield)\b)
    |(?P<str>{_STR})
    |(?P<chain>(?!(?:{_KEYWORDS})\b){_NAME}(?:\.{_NAME}|{_SUB})*)
    |(?P<word>{_NAME})
    |(?P<trail>(?:\.{_NAME}|{_SUB})+)
    |(?P<num>(?:0[xXoObB][\da-fA-F_]+|\d[\d_]*\.?[\d_]*(?:[eE][+-]?\d+)?j?|\.\d[\d_]*(?:[eE][+-]?\d+)?j?))
    |(?P<op>\*\*|==|!=|<=|>=|//|<<|>>|->|[-+*/%@&|^~<>=!:;.,(){{}}\[\]])
    |(?P<space>[ \t]+)
    |(?P<other>.)
    """,
    re.VERBOSE,
)
_NAME_RE = re.compile(_NAME)
_PART = re.compile(rf"\.({_NAME})|\[({_STR}|\d+)\]")
_NOT_CHAINS = ("type", "len", "tuple")  # as guards.py: cheap, and compared as they are
_CONSTANT_WORDS = ("None", "True", "False")
_PLAIN_LITERAL = re.compile(r"'[A-Za-z0-9_.]*'|[1-9][0-9]*|0")
_LITERALS: dict[str, str] = {}  # a literal's text -> repr of its value (the key's text)
_CHAINS: dict[str, tuple] = {}  # a chain token -> _chain_parts (tokens repeat across guards)
_MAX_CHAINS = 100_000


class NotScanned(Exception):
    """The expression is left to ``ast``."""


@dataclass
class Node:
    """A span of the expression that is a chain (``key``: its text as a chain, as
    ``guards._scan`` names it) or holds chains (``key`` None); ``kids`` in source order."""

    start: int
    end: int
    key: str | None
    kids: list[Node] = field(default_factory=list)
    name: str | None = None  # a name alone: no key, but a call's function or argument
    # a chain token's reads past its name: (the end of each, its key), outermost last;
    # the node is the last of them (``kids`` empty)
    parts: tuple[tuple[int, str], ...] = ()


def _chain_parts(s: str) -> tuple[int, tuple[tuple[int, str], ...]]:
    """A chain token's name length and, for each read past it, its end and key."""
    name_end = _NAME_RE.match(s).end()  # type: ignore[union-attr]
    key, at, parts = s[:name_end], name_end, []
    for p in _PART.finditer(s, name_end):
        if p.start() != at:
            raise NotScanned
        attr, sub = p.group(1), p.group(2)
        key = f"{key}.{attr}" if attr is not None else f"{key}[{_literal(sub)}]"
        at = p.end()
        parts.append((at, key))
    if at != len(s):
        raise NotScanned
    if len(_CHAINS) > _MAX_CHAINS:
        _CHAINS.clear()
    return name_end, tuple(parts)


def _literal(text: str) -> str:
    """``repr`` of the literal ``text``'s value (as ``guards._scan`` writes a constant)."""
    if _PLAIN_LITERAL.fullmatch(text):
        return text  # 'weight', 12: their own repr
    r = _LITERALS.get(text)
    if r is None:
        r = _LITERALS[text] = repr(ast.literal_eval(text))
    return r


def _tokens(text: str) -> list[tuple[str, int, int, str]]:
    out = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "bad" or kind == "other":
            raise NotScanned
        if kind != "space":
            out.append((kind, m.start(), m.end(), m.group()))
    return out


def scan(text: str, keys: set[str]) -> list[Node] | None:
    """The chain nodes of ``text`` (offsets into it, outermost first, each holding its
    parts), every key added to ``keys``; None: left to ``ast`` (module docstring)."""
    if "\n" in text or "\r" in text or "\\" in text or not text.isascii():
        return None  # (ast counts offsets in UTF-8 bytes)
    try:
        toks = _tokens(text)
        walk = _Walk(toks, keys)
        nodes = walk.sequence(0, ())
        if walk.i != len(toks):
            return None
    except (NotScanned, ValueError, SyntaxError):
        return None
    return nodes


class _Walk:
    def __init__(self, toks: list, keys: set[str]) -> None:
        self.toks, self.keys, self.i = toks, keys, 0

    def peek(self) -> tuple | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def sequence(self, depth: int, stops: tuple[str, ...]) -> list[Node]:
        """Nodes up to a stop token at this level (not consumed) or the end."""
        nodes: list[Node] = []
        while (t := self.peek()) is not None:
            kind, _, _, s = t
            if kind == "op" and s in stops:
                break
            self.i += 1
            if kind == "chain":
                nodes.append(self.chain(t))
            elif kind == "op" and s in "([{":
                close = {"(": ")", "[": "]", "{": "}"}[s]
                nodes.extend(self.sequence(depth + 1, (close,)))
                if self.peek() is None or self.peek()[3] != close:
                    raise NotScanned
                self.i += 1
                after = self.peek()
                if (
                    after is not None
                    and after[0] == "trail"
                    and after[1] == self.toks[self.i - 1][2]
                ):
                    raise NotScanned  # (a.b).c, [x][0]: not worth knowing
            elif kind == "op" and s in ")]}":
                raise NotScanned  # unbalanced
            elif kind == "trail":
                raise NotScanned  # after a constant, a keyword or a space
        return nodes

    def chain(self, tok: tuple) -> Node:
        """A chain token and the calls and parts that follow it without a space."""
        _, start, _, s = tok
        known = _CHAINS.get(s)
        if known is None:
            known = _CHAINS[s] = _chain_parts(s)
        name_end, parts = known
        if not parts:
            node = Node(start, start + name_end, None, name=s)
        else:
            if start:
                parts = tuple((start + end, key) for end, key in parts)
            node = Node(start, parts[-1][0], parts[-1][1], parts=parts)
            self.keys.update(key for _, key in parts)
        return self.tail(node)

    def tail(self, node: Node) -> Node:
        while (t := self.peek()) is not None and t[1] == node.end:
            kind, _, end, s = t
            if kind == "op" and s == "(":
                self.i += 1
                node = self.call(node)
            elif kind == "trail":
                self.i += 1
                key = node.key
                for p in _PART.finditer(s):
                    attr, sub = p.group(1), p.group(2)
                    if key is not None:
                        key = f"{key}.{attr}" if attr is not None else f"{key}[{_literal(sub)}]"
                        self.keys.add(key)
                    node = Node(node.start, t[1] + p.end(), key, [node])
            else:
                break
        return node

    def call(self, func: Node) -> Node:
        """``func(`` was read: the arguments and ``)``."""
        func_key = func.key if func.key is not None else func.name
        kids = [func]
        args: list[str | None] = []
        while True:
            t = self.peek()
            if t is None:
                raise NotScanned
            if t[0] == "op" and t[3] == ")":
                self.i += 1
                break
            first = self.i
            arg_nodes = self.sequence(1, (",", ")"))
            kids.extend(arg_nodes)
            args.append(self.argument(first, arg_nodes))
            t = self.peek()
            if t is not None and t[0] == "op" and t[3] == ",":
                self.i += 1
        end = self.toks[self.i - 1][2]
        if func_key is None or None in args or func.name in _NOT_CHAINS:
            key = None
        else:
            key = f"{func_key}({', '.join(args)})"  # type: ignore[arg-type]
            self.keys.add(key)
        return Node(func.start, end, key, kids)

    def argument(self, first: int, nodes: list[Node]) -> str | None:
        """The text of an argument (tokens ``first`` to the current one) as a chain
        call's argument, a constant's repr or a chain's key; None: neither."""
        toks = self.toks[first : self.i]
        if len(toks) == 1 and toks[0][0] in ("str", "num"):
            return _literal(toks[0][3])
        if len(toks) == 1 and toks[0][0] == "word" and toks[0][3] in _CONSTANT_WORDS:
            return toks[0][3]
        if len(nodes) == 1 and nodes[0].start == toks[0][1] and nodes[0].end == toks[-1][2]:
            return nodes[0].key if nodes[0].key is not None else nodes[0].name
        return None
