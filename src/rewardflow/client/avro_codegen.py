"""Code generation for :mod:`rewardflow.client.avro_compiler`: Avro types to Python statements.

A :class:`Codegen` accumulates the statements of one function and the
*parts* (expressions yielding ``bytes``) joined into its result. Tables make
varints cheap: ``SMALL[n]`` for ``0 <= n < 8192`` (small ints, string
lengths); ``MID``/``LAST`` encode 14 bits at a time, so an epoch-ms
timestamp (42 bits after zigzag) costs three lookups.

*Fast* mode (``Codegen(fast=True)``) drops the range tests: lengths index
``SMALL``, ints look up ``INTS`` (a dict, so a negative value is never
mistaken for an index; others go to ``varint``), a long is the three lookups
with the top one in ``HIGH`` (a dict holding only 29..42-bit values). A value outside
the tables raises ``KeyError``/``IndexError``, and the caller falls back to
the general function.
"""

from __future__ import annotations

import struct
from typing import Any

TABLE_SIZE = 8192
PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
FIXED = {"double": "d", "float": "f", "boolean": "?"}  # struct codes; '?' packs True/False as 1/0 like Avro
KEYABLE = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string", "enum"})


class Unsupported(ValueError):
    """The schema uses a construct the compiler does not handle."""


def _slow_varint(z: int) -> bytes:
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# 14 bits = two varint groups. LAST[c]: c as the final groups (1 or 2 bytes);
# MID[c]: c as two groups that more groups follow (continuation bit on both).
LAST = tuple(_slow_varint(c) for c in range(1 << 14))
MID = tuple(bytes(((c & 0x7F) | 0x80, (c >> 7) | 0x80)) for c in range(1 << 14))
SMALL = tuple(LAST[2 * i] for i in range(TABLE_SIZE))
INTS = {i: LAST[(i << 1) ^ (i >> 63)] for i in range(-TABLE_SIZE, TABLE_SIZE)}
HIGH = {c: LAST[c] for c in range(1, 1 << 14)}
TABLES = {"SMALL": SMALL, "MID": MID, "LAST": LAST, "INTS": INTS, "HIGH": HIGH}


def varint(n: int) -> bytes:
    """Zigzag varint of an Avro long; raises ``ValueError`` outside 64 bits (never wraps)."""
    if not -(1 << 63) <= n < 1 << 63:
        raise ValueError(f"{n} does not fit an Avro long (64 bits)")
    z = (n << 1) ^ (n >> 63)
    if z < 1 << 14:
        return LAST[z]
    if z < 1 << 28:
        return MID[z & 0x3FFF] + LAST[z >> 14]
    if z < 1 << 42:
        return MID[z & 0x3FFF] + MID[(z >> 14) & 0x3FFF] + LAST[z >> 28]
    return _slow_varint(z)


def varint32(n: int) -> bytes:
    """Zigzag varint of an Avro int; raises ``ValueError`` outside 32 bits (never wraps)."""
    if not -(1 << 31) <= n < 1 << 31:
        raise ValueError(f"{n} does not fit an Avro int (32 bits)")
    return varint(n)


def _kind(schema: Any) -> str:
    return "union" if isinstance(schema, list) else schema if isinstance(schema, str) else str(schema["type"])


class Codegen:
    """Statements (``lines``) and result parts of one generated function."""

    def __init__(self, named: dict[str, Any], consts: dict[str, Any] | None = None, counter: list[int] | None = None,
                 fast: bool = False) -> None:
        self.named = named
        self.fast = fast
        self.lines: list[str] = []
        self.parts: list[str] = []
        self.consts = consts if consts is not None else {**TABLES, "varint": varint, "varint32": varint32}
        self._counter = counter if counter is not None else [0]

    def child(self) -> Codegen:
        """A generator for a nested block: shares names, constants and mode, has its own lines and parts."""
        return Codegen(self.named, self.consts, self._counter, self.fast)

    def name(self, prefix: str) -> str:
        self._counter[0] += 1
        return f"{prefix}{self._counter[0]}"

    def resolve(self, schema: Any) -> Any:
        """Dereference named types and ``{"type": X}`` wrappers of primitives and names."""
        while True:
            if isinstance(schema, str) and schema not in PRIMITIVES:
                if schema not in self.named:
                    raise Unsupported(f"unknown named type {schema!r}")
                schema = self.named[schema]
            elif isinstance(schema, dict) and not isinstance(schema["type"], str):
                schema = schema["type"]
            elif isinstance(schema, dict) and (schema["type"] in PRIMITIVES or schema["type"] in self.named):
                schema = schema["type"]
            else:
                return schema

    def fields(self, fields: list[dict[str, Any]], record: str, exprs: dict[str, str] | None = None) -> None:
        """Encode record fields in order; runs of fixed-size fields become one ``struct`` call.

        A field's value is ``record[name]``, or ``exprs[name]`` when given (a local already fetched).
        """
        run: list[tuple[str, str]] = []  # (struct code, value expression)
        for field in fields:
            schema = self.resolve(field["type"])
            expr = (exprs or {}).get(field["name"]) or f"{record}[{field['name']!r}]"
            if _kind(schema) in FIXED:
                run.append((FIXED[_kind(schema)], expr))
                continue
            self._pack(run)
            run = []
            self.value(schema, expr)
        self._pack(run)

    def _pack(self, run: list[tuple[str, str]]) -> None:
        if run:
            packer = self.name("PACK")
            self.consts[packer] = struct.Struct("<" + "".join(code for code, _ in run)).pack
            self.parts.append(f"{packer}({', '.join(expr for _, expr in run)})")

    def value(self, schema: Any, expr: str) -> None:
        """Append the statements and parts that encode ``expr`` as ``schema``."""
        schema = self.resolve(schema)
        kind = _kind(schema)
        if kind == "union":
            self.union(schema, expr)
        elif kind in ("string", "bytes"):
            var = self.name("s")
            self.lines.append(f"{var} = {expr}.encode()" if kind == "string" else f"{var} = {expr}")
            length = f"SMALL[len({var})]" if self.fast else f"(SMALL[n] if (n := len({var})) < {TABLE_SIZE} else varint(n))"
            self.parts += [length, var]
        elif kind == "int" and self.fast:
            self.parts.append(f"(INTS.get({expr}) or varint32({expr}))")
        elif kind == "int":
            var = self.name("i")
            self.lines.append(f"{var} = {expr}")
            self.parts.append(f"(SMALL[{var}] if 0 <= {var} < {TABLE_SIZE} else varint32({var}))")
        elif kind == "long" and self.fast:  # epoch-ms only; anything else is a KeyError (fall back)
            var = self.name("z")
            self.lines.append(f"{var} = {expr} << 1")
            self.parts += [f"MID[{var} & 16383]", f"MID[{var} >> 14 & 16383]", f"HIGH[{var} >> 28]"]
        elif kind == "long":  # inline path for 29..42 significant bits: epoch-ms timestamps
            var = self.name("i")
            self.lines.append(f"{var} = {expr}")
            self.parts.append(f"(MID[z & 16383] + MID[z >> 14 & 16383] + LAST[z >> 28] "
                              f"if {1 << 28} <= (z := {var} << 1) < {1 << 42} else varint({var}))")
        elif kind in FIXED:
            self._pack([(FIXED[kind], expr)])
        elif kind == "enum":
            table = self.name("E")
            self.consts[table] = {sym: varint(i) for i, sym in enumerate(schema["symbols"])}
            self.parts.append(f"{table}[{expr}]")
        elif kind == "record":
            var = self.name("r")
            self.lines.append(f"{var} = {expr}.__dict__")
            self.fields(schema["fields"], var)
        elif kind != "null":
            raise Unsupported(f"Avro type {kind!r} is not compiled")

    def union(self, branches: list[Any], expr: str) -> None:
        """``[null, X]`` or ``[X, null]``: the branch index, then X's encoding when the value is not None."""
        kinds = [_kind(self.resolve(b)) for b in branches]
        if len(branches) != 2 or "null" not in kinds:
            raise Unsupported("only two-branch unions with null are compiled")
        null_at = kinds.index("null")
        other = self.resolve(branches[1 - null_at])
        absent, present = varint(null_at), varint(1 - null_at)
        if _kind(other) in ("boolean", "enum"):  # few values: one table lookup
            values = [True, False] if _kind(other) == "boolean" else list(other["symbols"])
            table = self.name("OPT")
            self.consts[table] = {None: absent, **{v: present + self._constant(other, v) for v in values}}
            self.parts.append(f"{table}[{expr}]")
            return
        if self.fast and _kind(other) == "int":  # fast mode: small ints and None from one dict
            table = self.name("OPT")
            options: dict[int | None, bytes] = {i: present + v for i, v in INTS.items()}
            self.consts[table] = {**options, None: absent}
            self.parts.append(f"{table}[{expr}]")
            return
        var, out = self.name("u"), self.name("p")
        sub = self.child()
        sub.value(other, var)
        self.lines += [f"{var} = {expr}", f"if {var} is None:", f"    {out} = {absent!r}", "else:"]
        self.lines += [f"    {line}" for line in sub.lines]
        self.lines.append(f"    {out} = {' + '.join([repr(present), *sub.parts])}")
        self.parts.append(out)

    @staticmethod
    def _constant(schema: Any, value: Any) -> bytes:
        """The encoding of a boolean or enum value."""
        if _kind(schema) == "boolean":
            return b"\x01" if value else b"\x00"
        return varint(list(schema["symbols"]).index(value))

    def key_exprs(self, schema: Any, expr: str) -> list[str]:
        """Hashable leaf-value expressions identifying ``expr``'s encoding (for a memo key)."""
        schema = self.resolve(schema)
        if _kind(schema) == "record":
            var = self.name("kd")
            self.lines.append(f"{var} = {expr}.__dict__")
            return [e for f in schema["fields"] for e in self.key_exprs(f["type"], f"{var}[{f['name']!r}]")]
        branches = schema if isinstance(schema, list) else [schema]
        if all(_kind(self.resolve(b)) in KEYABLE for b in branches):
            return [expr]
        raise Unsupported(f"memo key of type {schema!r} is not supported")
