"""Compile an Avro record schema into one straight-line Python function that encodes a model.

fastavro's writer interprets the schema for every field of every event (about
15 µs of CPU per event on our 2-core machines: the SDK's largest cost). The
function compiled here writes the same bytes without interpretation: it reads
field values from the model's ``__dict__`` (pydantic's attribute access is
several times slower), takes varints from tables, packs runs of fixed-size
values (double, float, boolean) with one ``struct`` call, can fold known
constants and memoise a run of repeating fields, and joins the parts once.
``tests/client/test_avro_compiler.py`` proves the bytes equal fastavro's.

Supported: null, boolean, int, long, float, double, string, bytes, enum,
nested records (models) and two-branch unions with null. Anything else raises
:class:`Unsupported` at compile time (the caller falls back to fastavro).

Contract: the compiled function assumes a *validated* model (right types,
known enum symbols); on data that does not fit it raises ``KeyError``,
``TypeError``, ``struct.error`` or ``UnicodeEncodeError`` and returns nothing.
"""

from __future__ import annotations

import ast
import io
import operator
from collections.abc import Callable, Mapping
from typing import Any

import fastavro

from rewardflow.client.avro_codegen import Codegen, Unsupported, varint

__all__ = ["MEMO_LIMIT", "Unsupported", "compile_writer", "varint"]

MEMO_LIMIT = 4096
"""Entries of a memo before it is emptied (a bound on memory, not a tuning knob)."""


def compile_writer(schema: dict[str, Any], prefix: bytes = b"", memo: tuple[str, ...] = (),
                   constants: Mapping[str, Any] | None = None) -> Callable[[Any], bytes]:
    """A function ``(fields) -> bytes``: ``prefix`` + the Avro binary of a model whose ``__dict__`` is ``fields``.

    Nested records are read from the nested models' ``__dict__``.

    ``schema`` is a fastavro-parsed (or plain, fully expanded) record schema.
    ``constants`` maps top-level fields to the value they always hold (encoded
    once, never read). ``memo`` names a run of consecutive top-level fields
    whose encoding is cached, keyed by their values (nested records by their
    leaf values) — the event envelope repeats for every event of a turn.
    Raises :class:`Unsupported` for constructs outside the supported list, or
    a ``memo`` run that is not consecutive or not keyable.

    Two functions are generated: a general one, and a *fast* one (one
    ``itemgetter`` call fetches the fields; table lookups without range tests,
    see :mod:`~rewardflow.client.avro_codegen`) that hands any event with a
    value outside its tables to the general one. Both write the same bytes.
    """
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise Unsupported("only record schemas are compiled")
    named = dict(schema.get("__named_schemas", {}))
    fields = list(schema["fields"])
    names = [f["name"] for f in fields]
    start = names.index(memo[0]) if memo and memo[0] in names else -1
    if memo and names[start:start + len(memo)] != list(memo):
        raise Unsupported(f"memo fields {memo} are not a consecutive run of {names}")
    constants = constants or {}
    title = f"<avro writer {schema.get('name')}>"
    general = Codegen(named)
    _body(general, fields, start, len(memo), constants, named, prefix, {})
    slow = _define(general, "    ", [], title)
    read = [n for n in names if n not in constants]
    local = {n: f"v{i}" for i, n in enumerate(read)}
    fast = Codegen(named, fast=True)
    fast.consts.update({"SLOW": slow, "GET": operator.itemgetter(*read)})
    _body(fast, fields, start, len(memo), constants, named, prefix, local)
    fetch = f"({', '.join(local.values())},) = GET(r0)" if len(read) > 1 else f"{local[read[0]]} = GET(r0)"
    fn = _define(fast, "        ", ["try:", f"    {fetch}"], title, "    except (KeyError, IndexError):\n        return SLOW(r0)\n")
    fn.__doc__ = slow.__doc__ = f"Avro binary of a {schema.get('name')} model (compiled)."
    return fn


def _body(gen: Codegen, fields: list[dict[str, Any]], start: int, memo_len: int, constants: Mapping[str, Any],
          named: dict[str, Any], prefix: bytes, exprs: dict[str, str]) -> None:
    """Fill ``gen`` with the statements and parts of the whole record."""
    if prefix:
        gen.parts.append(repr(prefix))
    i = 0
    while i < len(fields):
        if i == start:
            _memo_run(gen, fields[i:i + memo_len], exprs)
            i += memo_len
        elif fields[i]["name"] in constants:
            gen.parts.append(repr(encode_constant(fields[i]["type"], constants[fields[i]["name"]], named)))
            i += 1
        else:  # a run of ordinary fields, up to the next memo run or constant
            j = i + 1
            while j < len(fields) and j != start and fields[j]["name"] not in constants:
                j += 1
            gen.fields(fields[i:j], "r0", exprs)
            i = j


def _define(gen: Codegen, indent: str, head: list[str], title: str, tail: str = "") -> Callable[[Any], bytes]:
    """Compile ``def encode(r0)`` from ``gen`` (adjacent constant parts merged into one)."""
    parts: list[str] = []
    for part in gen.parts:
        if parts and part.startswith("b'") and parts[-1].startswith("b'"):
            parts[-1] = repr(ast.literal_eval(parts[-1]) + ast.literal_eval(part))
        else:
            parts.append(part)
    body = [*head, *(indent[4:] + line for line in gen.lines), f"{indent[4:]}return b''.join(({', '.join(parts)},))"]
    code = "def encode(r0):\n" + "".join(f"    {line}\n" for line in body) + tail
    namespace = dict(gen.consts)
    exec(compile(code, title, "exec"), namespace)
    fn: Callable[[Any], bytes] = namespace["encode"]
    return fn


def encode_constant(schema: Any, value: Any, named: dict[str, Any]) -> bytes:
    """The Avro binary of ``value`` as ``schema`` (fastavro; done once per constant)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema, named_schemas=dict(named)), value)
    return buf.getvalue()


def _memo_run(gen: Codegen, fields: list[dict[str, Any]], exprs: dict[str, str]) -> None:
    """Emit: key = the run's leaf values; on a miss encode the run and remember it."""
    keys: list[str] = []
    for field in fields:
        keys += gen.key_exprs(field["type"], exprs.get(field["name"]) or f"r0[{field['name']!r}]")
    sub = gen.child()
    sub.fields(fields, "r0", exprs)
    table, key, out = gen.name("MEMO"), gen.name("k"), gen.name("m")
    gen.consts[table] = {}
    gen.lines += [f"{key} = ({', '.join(keys)},)", f"{out} = {table}.get({key})", f"if {out} is None:"]
    gen.lines += [f"    {line}" for line in sub.lines]
    gen.lines += [f"    {out} = b''.join(({', '.join(sub.parts)},))",
                  f"    if len({table}) >= {MEMO_LIMIT}:", f"        {table}.clear()", f"    {table}[{key}] = {out}"]
    gen.parts.append(out)

