"""Unit tests of the Avro resolution rules in rewardflow.events.compat.

Each pair is also resolved by fastavro on a sample datum: a pair the checker
accepts must read; a pair it rejects must fail to read the given datum. So the
rules are checked against an independent implementation, not just restated.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from fastavro.read import SchemaResolutionError

from rewardflow.events.compat import check_backward, collect_names, is_backward_compatible


def rec(*fields: dict[str, Any], name: str = "R", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "t", "fields": list(fields), **extra}


def f(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def enum(*symbols: str, **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": "E", "symbols": list(symbols), **extra}


BASE = rec(f("a", "string"), f("n", "int"))

# (id, reader, writer, datum written with writer)
COMPATIBLE = [
    ("identical", BASE, BASE, {"a": "x", "n": 1}),
    ("field added with default", rec(f("a", "string"), f("n", "int"), f("z", ["null", "long"], default=None)), BASE, {"a": "x", "n": 1}),
    ("field removed", rec(f("a", "string")), BASE, {"a": "x", "n": 1}),
    ("fields reordered", rec(f("n", "int"), f("a", "string")), BASE, {"a": "x", "n": 1}),
    ("int promoted to long", rec(f("a", "string"), f("n", "long")), BASE, {"a": "x", "n": 1}),
    ("int promoted to double", rec(f("a", "string"), f("n", "double")), BASE, {"a": "x", "n": 1}),
    ("long promoted to float", rec(f("v", "float")), rec(f("v", "long")), {"v": 7}),
    ("float promoted to double", rec(f("v", "double")), rec(f("v", "float")), {"v": 1.5}),
    ("string read as bytes", rec(f("a", "bytes"), f("n", "int")), BASE, {"a": "x", "n": 1}),
    ("bytes read as string", rec(f("v", "string")), rec(f("v", "bytes")), {"v": b"ok"}),
    ("enum gains a symbol", rec(f("e", enum("A", "B", "C"))), rec(f("e", enum("A", "B"))), {"e": "B"}),
    ("enum loses a symbol but has a default", rec(f("e", enum("A", "C", default="C"))), rec(f("e", enum("A", "B"))), {"e": "B"}),
    ("plain value read as a union", rec(f("a", ["null", "string"]), f("n", "int")), BASE, {"a": "x", "n": 1}),
    ("union widened", rec(f("v", ["null", "string", "int"])), rec(f("v", ["null", "string"])), {"v": None}),
    ("union branch promoted", rec(f("v", ["null", "long"])), rec(f("v", ["null", "int"])), {"v": 3}),
    ("array items promoted", rec(f("v", {"type": "array", "items": "long"})), rec(f("v", {"type": "array", "items": "int"})), {"v": [1, 2]}),
    ("map values gain a default field", rec(f("v", {"type": "map", "values": rec(f("x", "int"), f("y", "int", default=0), name="In")})),
     rec(f("v", {"type": "map", "values": rec(f("x", "int"), name="In")})), {"v": {"k": {"x": 1}}}),
    ("field renamed with an alias", rec(f("title", "string", aliases=["a"]), f("n", "int")), BASE, {"a": "x", "n": 1}),
    ("record renamed with an alias", rec(f("a", "string"), f("n", "int"), name="S", aliases=["R"]), BASE, {"a": "x", "n": 1}),
    ("named type referenced again", rec(f("p", rec(f("x", "int"), name="P")), f("q", "t.P")), rec(f("p", rec(f("x", "int"), name="P")), f("q", "P")),
     {"p": {"x": 1}, "q": {"x": 2}}),
]

INCOMPATIBLE = [
    ("field added without default", rec(f("a", "string"), f("n", "int"), f("z", "int")), BASE, {"a": "x", "n": 1}, "z: reader field has no default"),
    ("long narrowed to int", rec(f("v", "int")), rec(f("v", "long")), {"v": 1}, "long cannot be read as int"),
    ("double narrowed to float", rec(f("v", "float")), rec(f("v", "double")), {"v": 1.0}, "double cannot be read as float"),
    ("string read as int", rec(f("a", "int"), f("n", "int")), BASE, {"a": "x", "n": 1}, "string cannot be read as int"),
    ("enum loses a symbol", rec(f("e", enum("A"))), rec(f("e", enum("A", "B"))), {"e": "B"}, "['B'] are not in the reader enum"),
    ("union branch removed", rec(f("v", ["null", "string"])), rec(f("v", ["null", "string", "int"])), {"v": 4}, "no branch of the reader union"),
    ("union read as a plain value", rec(f("v", "string")), rec(f("v", ["null", "string"])), {"v": None}, "null cannot be read as string"),
    ("record renamed", rec(f("a", "string"), f("n", "int"), name="S"), BASE, {"a": "x", "n": 1}, "cannot be read as record"),
    ("array items narrowed", rec(f("v", {"type": "array", "items": "int"})), rec(f("v", {"type": "array", "items": "long"})), {"v": [1]}, "v[]"),
    ("nested field without default", rec(f("p", rec(f("x", "int"), f("y", "int"), name="P"))), rec(f("p", rec(f("x", "int"), name="P"))),
     {"p": {"x": 1}}, "p.y: reader field has no default"),
    ("array read as map", rec(f("v", {"type": "map", "values": "int"})), rec(f("v", {"type": "array", "items": "int"})), {"v": [1]}, "cannot be read as map"),
]


def _read(reader: Any, writer: Any, datum: Any) -> Any:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer), datum)
    buf.seek(0)
    return fastavro.schemaless_reader(buf, fastavro.parse_schema(writer), fastavro.parse_schema(reader))


@pytest.mark.parametrize(("reader", "writer", "datum"), [c[1:] for c in COMPATIBLE], ids=[c[0] for c in COMPATIBLE])
def test_compatible_pairs(reader: Any, writer: Any, datum: Any) -> None:
    assert check_backward(reader, writer) == []
    _read(reader, writer, datum)  # fastavro agrees: no exception


@pytest.mark.parametrize(("reader", "writer", "datum", "reason"), [c[1:] for c in INCOMPATIBLE], ids=[c[0] for c in INCOMPATIBLE])
def test_incompatible_pairs(reader: Any, writer: Any, datum: Any, reason: str) -> None:
    problems = check_backward(reader, writer)
    assert len(problems) >= 1 and any(reason in p for p in problems), problems
    with pytest.raises((SchemaResolutionError, ValueError, TypeError)):
        _read(reader, writer, datum)


def test_default_must_fit_the_field_type() -> None:
    reader = rec(f("a", "string"), f("n", "int"), f("z", ["null", "int"], default=3), f("w", "int", default="x"))
    problems = check_backward(reader, BASE)
    assert [p.split(":")[0] for p in problems] == ["R.z", "R.w"]


def test_enum_default_and_record_default_fit() -> None:
    reader = rec(f("a", "string"), f("n", "int"), f("e", enum("A", "B"), default="B"),
                 f("p", rec(f("x", "int"), f("y", "string", default="d"), name="P"), default={"x": 1}))
    assert is_backward_compatible(reader, BASE)


def test_recursive_types_terminate() -> None:
    node = {"type": "record", "name": "Node", "fields": [f("v", "int"), f("next", ["null", "Node"], default=None)]}
    grown = {"type": "record", "name": "Node", "fields": [f("v", "long"), f("next", ["null", "Node"], default=None), f("w", "int", default=0)]}
    assert check_backward(grown, node) == []
    assert check_backward(node, grown) != []  # long cannot narrow to int


def test_undefined_name_is_reported_not_raised() -> None:
    assert "undefined named type" in check_backward(rec(f("p", "t.Missing")), rec(f("p", "int")))[0]


def test_collect_names_uses_enclosing_namespace() -> None:
    names = collect_names(rec(f("p", rec(f("x", enum("A")), name="P"))))
    assert sorted(names) == ["t.E", "t.P", "t.R"]
