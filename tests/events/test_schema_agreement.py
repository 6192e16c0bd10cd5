"""The generated pydantic models and the Avro schemas agree field by field, and every event round-trips.

Agreement: same field names; str ↔ string, int ↔ int/long (an Avro int field's
model bounds fit 32 bits), float ↔ double, bool ↔ boolean, ``X | None = None``
↔ ``["null", X]`` with default null, ``Literal[...]`` ↔ enum with the same
symbols, Producer ↔ the Producer record; defaults agree; "Max N chars" and
">= 0" in a field's doc match the model's constraints. The one exception is
the discriminator ``event_type``: a one-value Literal (the record's own name)
↔ string.
"""

from __future__ import annotations

import io
import json
import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rewardflow.events.catalogue import NAMESPACE, default_catalogue, schema_dir
from rewardflow.events.models import EVENT_MODELS, Envelope, Producer
from rewardflow.events.samples import sample_events, session_events
from rewardflow.events.validate import validate_event
from rewardflow.events.wire import AVRO, FORMAT_HEADER, JSON, decode_record, encode_avro, encode_json

INT32 = (-(2**31), 2**31 - 1)


def _json_schema(name: str) -> dict[str, Any]:
    return json.loads((schema_dir() / f"{NAMESPACE}.{name}.avsc").read_text())


def _avro_kind(t: Any) -> Any:
    """Normalised Avro type: 'string' | 'int' | 'long' | ('enum', symbols) | ('record', name) | ('optional', X)."""
    if isinstance(t, list):
        assert len(t) == 2 and t[0] == "null", f"only ['null', X] unions are used in events, got {t}"
        return ("optional", _avro_kind(t[1]))
    if isinstance(t, dict):
        if t["type"] == "enum":
            return ("enum", tuple(t["symbols"]))
        if t["type"] == "record":
            return ("record", t["name"].rsplit(".", 1)[-1])
        return _avro_kind(t["type"])
    if isinstance(t, str) and t.startswith(f"{NAMESPACE}."):
        return ("record", t.rsplit(".", 1)[-1])
    return t


def _strip(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _model_kind(tp: Any) -> Any:
    tp = _strip(tp)
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        rest = [a for a in get_args(tp) if a is not type(None)]
        assert len(rest) == 1, f"only X | None unions are used in events, got {tp}"
        return ("optional", _model_kind(rest[0]))
    if origin is Literal:
        return ("enum", tuple(get_args(tp)))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return ("record", tp.__name__)
    return {str: "string", int: "int", float: "double", bool: "boolean"}[tp]


def _constraints(info: FieldInfo) -> dict[str, Any]:
    """ge/gt/le/lt/min_length/max_length from a field and the Annotated types inside it."""
    found: dict[str, Any] = {}

    def take(meta: Any) -> None:
        for key in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            if getattr(meta, key, None) is not None:
                found[key] = getattr(meta, key)
        for inner in getattr(meta, "metadata", []) if isinstance(meta, FieldInfo) else []:
            take(inner)

    def walk(tp: Any) -> None:
        if get_origin(tp) is Annotated:
            for meta in get_args(tp)[1:]:
                take(meta)
            walk(get_args(tp)[0])
        for arg in get_args(tp) if get_origin(tp) in (Union, types.UnionType) else ():
            walk(arg)

    for meta in info.metadata:
        take(meta)
    walk(info.annotation)
    return found


def _agree(model: type[BaseModel], record: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    avro_fields = {f["name"]: f for f in record["fields"]}
    if set(avro_fields) != set(model.model_fields):
        return [f"{model.__name__}: fields differ: model only {set(model.model_fields) - set(avro_fields)}, "
                f"avro only {set(avro_fields) - set(model.model_fields)}"]
    for name, info in model.model_fields.items():
        field, where = avro_fields[name], f"{model.__name__}.{name}"
        avro, mine = _avro_kind(field["type"]), _model_kind(info.annotation)
        if name == "event_type":
            if (avro, mine, info.default) != ("string", ("enum", (model.__name__,)), model.__name__):
                problems.append(f"{where}: discriminator must be Literal[{model.__name__!r}] = name ↔ string")
            continue
        plain = avro[1] if isinstance(avro, tuple) and avro[0] == "optional" else avro
        if _swap_long(avro) != mine:  # a model int is an Avro int or long
            problems.append(f"{where}: avro {avro} vs model {mine}")
        has_default = "default" in field
        if has_default != (not info.is_required()):
            problems.append(f"{where}: default present in avro={has_default}, in model={not info.is_required()}")
        elif has_default and field["default"] != info.default:
            problems.append(f"{where}: avro default {field['default']!r} vs model default {info.default!r}")
        if isinstance(avro, tuple) and avro[0] == "optional" and info.default is not None:
            problems.append(f"{where}: optional field must default to None")
        problems += _doc_agrees(where, field, plain, _constraints(info))
    return problems


def _swap_long(avro: Any) -> Any:
    """Avro long (or optional long) compared as the model's int."""
    return ("optional", "int") if avro == ("optional", "long") else "int" if avro == "long" else avro


def _doc_agrees(where: str, field: dict[str, Any], plain: Any, c: dict[str, Any]) -> list[str]:
    out = []
    if plain == "int":
        low, high = c.get("ge", c.get("gt", -(2**63))), c.get("le", c.get("lt", 2**63))
        if low < INT32[0] or high > INT32[1]:
            out.append(f"{where}: avro int but the model allows [{low}, {high}], beyond 32 bits")
    doc = field.get("doc", "")
    if m := re.search(r"Max (\d+) chars", doc):
        if c.get("max_length") != int(m.group(1)):
            out.append(f"{where}: doc says max {m.group(1)} chars, model max_length={c.get('max_length')}")
    if "(>= 0)" in doc and c.get("ge") != 0:
        out.append(f"{where}: doc says >= 0, model ge={c.get('ge')}")
    return out


@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_event_model_agrees_with_its_schema(name: str) -> None:
    assert _agree(EVENT_MODELS[name], _json_schema(name)) == []


def test_producer_model_agrees_with_the_producer_record() -> None:
    assert _agree(Producer, _json_schema("Producer")) == []


def test_batch_union_lists_every_event_type() -> None:
    items = _json_schema("EventBatch")["fields"][2]["type"]["items"]
    assert sorted(i.rsplit(".", 1)[-1] for i in items) == sorted(EVENT_MODELS)


def test_agreement_check_detects_drift() -> None:
    record = _json_schema("ToolCall")
    record["fields"][-1] = {**record["fields"][-1], "type": ["null", "int"]}
    record["fields"][-2] = {**record["fields"][-2], "default": 0}
    problems = _agree(EVENT_MODELS["ToolCall"], record)
    assert any("error_kind" in p for p in problems) and any("duration_ms" in p for p in problems)


# --- round trips -----------------------------------------------------------------------------

EVENTS = sample_events(3_000, seed=7)
BY_TYPE = {name: [e for e in EVENTS if e.event_type == name][:25] for name in EVENT_MODELS}


def test_samples_cover_every_type_and_optional_states() -> None:
    assert all(len(v) >= 5 for v in BY_TYPE.values()), {k: len(v) for k, v in BY_TYPE.items()}


@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_schemaless_round_trip(name: str) -> None:
    parsed = default_catalogue().writer(name).parsed
    for event in BY_TYPE[name]:
        buf = io.BytesIO()
        schemaless_writer(buf, parsed, event.model_dump())
        buf.seek(0)
        back = schemaless_reader(buf, parsed)
        assert back == event.model_dump()
        assert EVENT_MODELS[name].model_validate(back) == event


@pytest.mark.parametrize("fmt", [AVRO, JSON])
@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_single_event_wire_round_trip(fmt: str, name: str) -> None:
    for event in BY_TYPE[name]:
        value = encode_avro([event.model_dump()]) if fmt == AVRO else encode_json([event.model_dump()])
        for headers in ([(FORMAT_HEADER, fmt.encode())], None):
            [raw] = decode_record(value, headers)
            assert validate_event(raw) == event


@pytest.mark.parametrize("fmt", [AVRO, JSON])
@pytest.mark.parametrize("seed", range(8))
def test_session_batch_wire_round_trip(fmt: str, seed: int) -> None:
    events = session_events(seed, turns=4)
    dicts = [e.model_dump() for e in events]
    value = encode_avro(dicts, batch_id=f"b{seed}") if fmt == AVRO else encode_json(dicts)
    raws = decode_record(value, [(FORMAT_HEADER, fmt.encode())])
    assert [validate_event(r) for r in raws] == events


def _edge(event: Envelope, **changes: Any) -> Envelope:
    return type(event).model_validate({**event.model_dump(), **changes})


ID_CHARS = st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\')  # (ids are `printable`)
text = st.text(ID_CHARS, min_size=1, max_size=64)


@settings(max_examples=150, deadline=None)
@given(
    event_id=text, org=st.text(ID_CHARS, min_size=1, max_size=128), score=st.floats(0.0, 1.0),
    n=st.integers(0, 2**31 - 1), ts=st.integers(946_684_800_000, 4_102_444_799_999),
    maybe=st.none() | st.integers(0, 2**31 - 1), flag=st.none() | st.booleans(),
)
def test_extreme_values_round_trip(event_id: str, org: str, score: float, n: int, ts: int, maybe: int | None, flag: bool | None) -> None:
    base = BY_TYPE["PersistenceCheck"][0]
    event = _edge(base, event_id=event_id, org_id=org, survival_score=score, revert_score=1.0 - score,
                  ts=ts, surviving_chars=maybe, branch_changed=flag, horizon_s=1 + n % (7 * 86_400))
    for value in (encode_avro([event.model_dump()]), encode_json([event.model_dump()]),
                  encode_avro([event.model_dump(), _edge(BY_TYPE["AgentEdit"][0], lines_added=n).model_dump()], batch_id="x")):
        assert validate_event(decode_record(value)[0]) == event
