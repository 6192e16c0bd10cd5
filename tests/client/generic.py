"""A small generic Avro schema (nested record, named reference, unions, enum, bytes, float32)
and pydantic models of it, shared by the tests of the compiled writers."""

from __future__ import annotations

import io
from typing import Any

import fastavro
from pydantic import BaseModel


class Inner(BaseModel):
    x: float
    raw: bytes


class Outer(BaseModel):
    n: int
    inner: Inner
    maybe: Inner | None = None
    tail: str | None = None
    color: str | None = None
    flag: bool | None = None
    d: float = 0.0


GENERIC = fastavro.parse_schema({
    "type": "record", "name": "Outer", "fields": [
        {"name": "n", "type": "long"},
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [
            {"name": "x", "type": "float"}, {"name": "raw", "type": "bytes"}]}},
        {"name": "maybe", "type": ["null", "Inner"], "default": None},
        {"name": "tail", "type": ["string", "null"]},
        {"name": "color", "type": ["null", {"type": "enum", "name": "Color", "symbols": ["red", "green"]}]},
        {"name": "flag", "type": ["boolean", "null"]},
        {"name": "d", "type": "double"},
    ]})


def fastavro_bytes(parsed: Any, datum: Any) -> bytes:
    """fastavro's schemaless Avro binary of ``datum``: the reference every writer must match."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, datum)
    return buf.getvalue()
