"""Small bytecode-level tools shared by trampolines and continuations: instruction
encoding with inline caches, the location table's "no location" entries, and the
exception table's varint format."""

from __future__ import annotations

import dis
import opcode

CACHE_ENTRIES = getattr(opcode, "_inline_cache_entries", {})


def cache_count(op: int) -> int:
    if isinstance(CACHE_ENTRIES, dict):
        return CACHE_ENTRIES.get(op, 0)
    return CACHE_ENTRIES[op]


def emit(op_name: str, arg: int = 0) -> bytes:
    """One instruction (with EXTENDED_ARG prefixes as needed) followed by its caches."""
    op = dis.opmap[op_name]
    out = bytearray()
    ext = []
    a = arg >> 8
    while a:
        ext.append(a & 0xFF)
        a >>= 8
    for e in reversed(ext):
        out += bytes([dis.opmap["EXTENDED_ARG"], e])
    out += bytes([op, arg & 0xFF])
    out += b"\x00\x00" * cache_count(op)
    return bytes(out)


def no_location_entries(code_units: int) -> bytes:
    """Location-table entries saying "no location" for ``code_units`` units (PEP 626 format)."""
    out = bytearray()
    while code_units > 0:
        n = min(8, code_units)
        out.append(0x80 | (15 << 3) | (n - 1))
        code_units -= n
    return bytes(out)


def line_entries(code_units: int, line_delta: int) -> bytes:
    """Location-table entries giving ``code_units`` units a line ``line_delta`` away from
    the previous entry's line (no columns). Each entry moves the line, so only the first
    carries the delta."""
    out = bytearray()
    delta = line_delta
    while code_units > 0:
        n = min(8, code_units)
        out.append(0x80 | (13 << 3) | (n - 1))
        value = (-delta << 1) | 1 if delta < 0 else delta << 1
        while value >= 64:
            out.append(0x40 | (value & 63))
            value >>= 6
        out.append(value)
        code_units -= n
        delta = 0
    return bytes(out)


def parse_exception_table(code) -> list[tuple[int, int, int, int, bool]]:
    """(start, end, target, depth, lasti) in bytes, as dis reads them."""
    return [(e.start, e.end, e.target, e.depth, e.lasti) for e in dis._parse_exception_table(code)]


def _varint(value: int, first: bool) -> bytes:
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    out = bytearray()
    for i, c in enumerate(chunks):
        b = c
        if i < len(chunks) - 1:
            b |= 64
        if i == 0 and first:
            b |= 128
        out.append(b)
    return bytes(out)


def encode_exception_table(entries: list[tuple[int, int, int, int, bool]]) -> bytes:
    out = bytearray()
    for start, end, target, depth, lasti in entries:
        out += _varint(start // 2, True)
        out += _varint((end - start) // 2, False)
        out += _varint(target // 2, False)
        out += _varint((depth << 1) | int(lasti), False)
    return bytes(out)


def covering_handlers(code, offset: int) -> list[str]:
    """For each exception-table range around ``offset``: "with" when its handler is a
    with-statement's (PUSH_EXC_INFO then WITH_EXCEPT_START), else "try"."""
    instrs = list(dis.get_instructions(code))
    by_offset = {ins.offset: i for i, ins in enumerate(instrs)}
    kinds = []
    for start, end, target, _depth, _lasti in parse_exception_table(code):
        if start <= offset < end:
            i = by_offset.get(target)
            names = [ins.opname for ins in instrs[i : i + 3]] if i is not None else []
            kinds.append("with" if "WITH_EXCEPT_START" in names else "try")
    return kinds


def in_exception_range(code, offset: int) -> bool:
    return any(start <= offset < end for start, end, *_ in parse_exception_table(code))


def make_trampoline(code):
    """Same locals layout as ``code``; returns the value the hook pushed (see module.cpp)."""
    body = emit("RESUME", 0) + emit("RETURN_VALUE")
    return code.replace(
        co_code=body,
        co_linetable=no_location_entries(len(body) // 2),
        co_exceptiontable=b"",
    )
