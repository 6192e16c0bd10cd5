"""The compiled Avro decoder (C extension ``_avrofast``) when built: a fast path in front of fastavro.

``pip install -e .`` compiles ``_avrofast.c`` (``setup.py``: an *optional*
extension, like ``rewardflow.client._speedups``). This module compiles a
fastavro-parsed schema into the extension's program (:func:`program`) and
hands :func:`rewardflow.events.wire.decode_record` a decoder per writer
schema (:func:`decoder`).

Contract of a decoder ``decode(data, offset, max_items)``:

* pure: it reads ``data[offset:]`` and returns exactly the objects
  ``fastavro.schemaless_reader(buf, schema, None, return_record_name=True)``
  returns for it (records as dicts in schema field order, Avro int and long
  as ``int``, float and double as ``float``, enum symbols as ``str``, a union
  branch that is a named type as ``(fullname, value)``, any other branch -
  e.g. both branches of ``["null", "string"]`` - as the plain value);
* it never raises for bad input: for anything but one well-formed value
  that ends exactly at the end of ``data`` (truncated, overlong varint,
  boolean byte not 0/1, union or enum index out of range, invalid UTF-8,
  negative length or block count, block count above the bytes left or above
  ``max_items`` array/map items in all, trailing bytes) it returns ``None``,
  and the caller decodes with fastavro, so errors and their messages stay
  fastavro's. Only ``MemoryError`` propagates. Every read is bounds-checked,
  and the work is bounded by the input length and ``max_items``;
* thread-safe: a decoder is immutable once built and holds the GIL while it
  runs; the cache here is a plain dict (a race at worst compiles twice).

What falls back to fastavro: schemas with types the program does not
express (fixed, logical types, recursive or unknown names, deeper than
:data:`MAX_DEPTH`), decoding with a reader schema different from the writer
schema (schema resolution; ``decode_record`` asks only for ids whose writer
schema *is* the current one), and every record the decoder returns ``None``
for. Without the extension (not built, or ``REWARDFLOW_PURE_PYTHON=1``)
:func:`decoder` always returns ``None``: fastavro decodes everything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rewardflow.extensions import load_extension

OP_NULL, OP_BOOLEAN, OP_LONG, OP_FLOAT, OP_DOUBLE, OP_STRING, OP_BYTES, OP_ENUM, OP_RECORD, OP_UNION, OP_ARRAY, OP_MAP = range(12)
"""Op codes of the extension's program (``_avrofast.c``)."""

MAX_DEPTH = 32
"""The deepest program compiled (``_avrofast.c``)."""

Program = tuple[int, tuple[Any, ...], tuple[Any, ...]]
"""``(code, names, subs)``: names = record field names, enum symbols or per union branch its tag
(the named type's full name, or None: the plain value); subs = the child ops (record fields, union
branches, array items, map values)."""

Decode = Callable[[bytes, int, int], Any]
"""``decode(data, offset, max_items) -> object | None``."""

_PRIMITIVE = {"null": OP_NULL, "boolean": OP_BOOLEAN, "int": OP_LONG, "long": OP_LONG, "float": OP_FLOAT,
              "double": OP_DOUBLE, "string": OP_STRING, "bytes": OP_BYTES}
# fastavro's AVRO_TYPES: a union branch whose type is not one of these is a reference to a named type
_AVRO_TYPES = frozenset({*_PRIMITIVE, "fixed", "enum", "record", "error", "array", "map", "union", "request",
                         "error_union"})


class Unsupported(ValueError):
    """The schema has a type the program does not express: fastavro decodes it."""


_ext, _why = load_extension("rewardflow.events._avrofast")
AVAILABLE: bool = _ext is not None
"""True when the compiled decoder is in use."""


def status() -> str:
    """One line: which Avro decoder the consumer uses, and why."""
    return "compiled (C extension) with fastavro fallback" if AVAILABLE else f"fastavro only: {_why}"


def program(schema: Any) -> Program:
    """The program of a fastavro-parsed schema; raises :class:`Unsupported` for what it cannot express."""
    named = schema.get("__named_schemas", {}) if isinstance(schema, dict) else {}
    return _op(schema, named, 1, ())


def _op(schema: Any, named: Mapping[str, Any], depth: int, seen: tuple[str, ...]) -> Program:
    if depth > MAX_DEPTH:
        raise Unsupported(f"schema nested deeper than {MAX_DEPTH}")
    if isinstance(schema, str):
        if schema in _PRIMITIVE:
            return (_PRIMITIVE[schema], (), ())
        if schema in seen or schema not in named:
            raise Unsupported(f"recursive or unknown named type {schema!r}")
        return _op(named[schema], named, depth, seen)
    if isinstance(schema, list):
        if not schema:
            raise Unsupported("empty union")
        tags: list[str | None] = []
        subs: list[Program] = []
        for branch in schema:
            if isinstance(branch, list):
                raise Unsupported("union inside a union")
            subs.append(_op(branch, named, depth + 1, seen))
            tags.append(_tag(branch, named))
        return (OP_UNION, tuple(tags), tuple(subs))
    if not isinstance(schema, dict):
        raise Unsupported(f"not a schema: {schema!r}")
    if "logicalType" in schema:
        raise Unsupported("logical types are not compiled")
    kind = schema.get("type")
    if isinstance(kind, str) and kind in _PRIMITIVE:
        return (_PRIMITIVE[kind], (), ())
    if kind == "enum":
        symbols = schema.get("symbols")
        if not isinstance(symbols, list) or not symbols or not all(type(s) is str for s in symbols):
            raise Unsupported("enum without symbols")
        return (OP_ENUM, tuple(symbols), ())
    if kind == "record":
        fields = schema.get("fields")
        if not isinstance(fields, list) or not fields:
            raise Unsupported("record without fields")  # (an empty dict is not worth a special case)
        names = tuple(f["name"] for f in fields)
        if not all(type(n) is str for n in names) or len(set(names)) != len(names):
            raise Unsupported("record with odd field names")
        inner = (*seen, str(schema.get("name")))
        return (OP_RECORD, names, tuple(_op(f["type"], named, depth + 1, inner) for f in fields))
    if kind == "array":
        return (OP_ARRAY, (), (_op(schema.get("items"), named, depth + 1, seen),))
    if kind == "map":
        return (OP_MAP, (), (_op(schema.get("values"), named, depth + 1, seen),))
    raise Unsupported(f"Avro type {kind!r} is not compiled")


def _tag(branch: Any, named: Mapping[str, Any]) -> str | None:
    """What fastavro's read_union (return_record_name=True, no reader schema) pairs a branch's value with."""
    if isinstance(branch, dict):
        if branch.get("type") == "record":
            return str(branch["name"])
        return None
    if isinstance(branch, str) and branch not in _AVRO_TYPES:
        return str(named[branch]["name"])  # a reference to a named type: (its full name, value)
    return None


_cache: dict[int, tuple[Any, Decode | None]] = {}
_CACHE_MAX = 256


def decoder(parsed: Any) -> Decode | None:
    """The compiled decoder of writer schema ``parsed`` (read without a reader schema), or None.

    None without the extension or for a schema :func:`program` does not
    compile. Cached per schema object.
    """
    if _ext is None:
        return None
    hit = _cache.get(id(parsed))
    if hit is not None and hit[0] is parsed:
        return hit[1]
    try:
        decode: Decode | None = _ext.Decoder(program(parsed)).decode
    except (Unsupported, KeyError, TypeError, ValueError):
        decode = None
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[id(parsed)] = (parsed, decode)  # (holds parsed: its id cannot be reused while cached)
    return decode
