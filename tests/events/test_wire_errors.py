"""Every way a record or an event can be wrong raises the documented typed error and code.

``InvalidEvent`` (code ``invalid_event``) names the offending field; ``DecodeError``
carries one of the codes documented on it: ``unknown_format``, ``bad_magic``,
``unknown_schema_id``, ``truncated_avro``, ``bad_avro``, ``bad_json``,
``not_an_event``, ``too_large``, ``batch_too_large``.
"""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from fastavro import schemaless_writer

from rewardflow.events.catalogue import default_catalogue
from rewardflow.events.errors import DecodeError, EventError, InvalidEvent
from rewardflow.events.samples import sample_events, session_events
from rewardflow.events.validate import split_valid, validate_event
from rewardflow.events.wire import FORMAT_HEADER, decode_record, encode_avro, encode_json

EVENTS = {e.event_type: e.model_dump() for e in sample_events(2_000, seed=3)}
AVRO_H = [(FORMAT_HEADER, b"avro")]
JSON_H = [(FORMAT_HEADER, b"json")]

# (event type, field, bad value, expected InvalidEvent.field); a value of ... means "remove the field"
INVALID: list[tuple[str, str, Any, str]] = [
    ("AgentEdit", "event_id", "", "event_id"),  # string: too short
    ("AgentEdit", "event_id", "x" * 65, "event_id"),  # string: too long
    ("AgentEdit", "language", 7, "language"),  # string: wrong type
    ("AgentEdit", "lines_added", -1, "lines_added"),  # int: below range
    ("AgentEdit", "lines_added", 2**31, "lines_added"),  # int: beyond Avro int
    ("AgentEdit", "lines_added", "5", "lines_added"),  # int: string
    ("AgentEdit", "lines_added", 5.0, "lines_added"),  # int: float
    ("AgentEdit", "lines_added", True, "lines_added"),  # int: bool
    ("AgentEdit", "ts", 1_000, "ts"),  # long: implausible epoch ms
    ("AgentEdit", "ts", 4_102_444_800_000, "ts"),  # long: year 2100
    ("AgentEdit", "content_fingerprint", 12, "content_fingerprint"),  # optional string: wrong type
    ("AgentEdit", "edit_id", ..., "edit_id"),  # required field missing
    ("AgentEdit", "surprise", 1, "surprise"),  # unknown field
    ("AgentEdit", "schema_version", 0, "schema_version"),  # int with default: out of range
    ("PersistenceCheck", "survival_score", 1.5, "survival_score"),  # double: above range
    ("PersistenceCheck", "survival_score", float("nan"), "survival_score"),  # double: NaN
    ("PersistenceCheck", "revert_score", float("inf"), "revert_score"),  # double: inf
    ("PersistenceCheck", "revert_score", "0.5", "revert_score"),  # double: string
    ("PersistenceCheck", "unchanged", "yes", "unchanged"),  # boolean: string
    ("PersistenceCheck", "unchanged", 1, "unchanged"),  # boolean: int
    ("PersistenceCheck", "branch_changed", "no", "branch_changed"),  # optional boolean
    ("PersistenceCheck", "horizon_s", 0, "horizon_s"),  # int: not positive
    ("PersistenceCheck", "surviving_chars", -3, "surviving_chars"),  # optional int: below range
    ("InferenceServed", "surface", "emacs", "surface"),  # enum: unknown symbol
    ("InferenceServed", "latency_ms", 0, "latency_ms"),  # cross-field: latency < ttft
    ("ToolCall", "status", "OK", "status"),  # enum: case matters
    ("UserAction", "action", None, "action"),  # enum: null
    ("FollowUp", "text_redacted", "x" * 16_385, "text_redacted"),  # optional string: too long
    ("FollowUp", "producer", {"name": "x"}, "producer.version"),  # nested record: missing field
    ("FollowUp", "producer", {"name": "x", "version": "1", "os": "linux"}, "producer.os"),  # nested: extra
    ("FollowUp", "producer", "vscode", "producer"),  # nested record: wrong type
    ("ClarifyingQuestion", "question_chars", 2**31, "question_chars"),  # optional int beyond Avro int
    ("ClarifyingQuestion", "event_type", "Clarification", "event_type"),  # unknown event type
    ("ClarifyingQuestion", "event_type", ["x"], "event_type"),  # unhashable tag
    ("ClarifyingQuestion", "event_type", ..., "event_type"),  # no tag
]


def _broken(etype: str, field: str, value: Any) -> dict[str, Any]:
    event = dict(EVENTS[etype])
    if value is ...:
        event.pop(field)
    else:
        event[field] = value
    return event


@pytest.mark.parametrize(("etype", "field", "value", "expected"), INVALID, ids=[f"{t}.{f}={v!r:.20}" for t, f, v, _ in INVALID])
def test_invalid_event_names_the_field(etype: str, field: str, value: Any, expected: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        validate_event(_broken(etype, field, value), index=4)
    assert info.value.code == "invalid_event"
    assert info.value.field == expected
    assert info.value.index == 4 and str(info.value).startswith(f"event[4].{expected}: ")
    assert isinstance(info.value, EventError) and info.value.reason.startswith("invalid_event: ")


@pytest.mark.parametrize("raw", [None, [], "AgentEdit", 3])
def test_non_object_event_is_invalid(raw: Any) -> None:
    with pytest.raises(InvalidEvent) as info:
        validate_event(raw)
    assert info.value.field == "<event>"


def test_split_valid_isolates_the_bad_event() -> None:
    good = [e.model_dump() for e in session_events(1, turns=1)]
    raws = [*good[:2], _broken("AgentEdit", "lines_added", -1), *good[2:]]
    ok, bad = split_valid(raws)
    assert [e.model_dump() for e in ok] == good
    assert [(r.index, r.error.field) for r in bad] == [(2, "lines_added")]


def _code(value: bytes | None, headers: Any = None, **kw: Any) -> str:
    with pytest.raises(DecodeError) as info:
        decode_record(value, headers, **kw)
    return info.value.code


AVRO_ONE = encode_avro([EVENTS["ToolCall"]])
AVRO_BATCH = encode_avro([e.model_dump() for e in session_events(2, turns=3)], batch_id="b")


def test_unknown_schema_id() -> None:
    forged = struct.pack(">bI", 0, 123_456_789) + AVRO_ONE[5:]
    assert _code(forged, AVRO_H) == "unknown_schema_id"
    assert _code(forged) == "unknown_schema_id"  # no header: the magic byte selects avro


@pytest.mark.parametrize("value", [AVRO_ONE, AVRO_BATCH], ids=["event", "batch"])
def test_truncated_avro_at_every_length(value: bytes) -> None:
    codes = {_code(value[:cut], AVRO_H) for cut in range(1, len(value))}
    assert codes == {"truncated_avro"}


def test_trailing_garbage_and_garbage_body() -> None:
    assert _code(AVRO_ONE + b"\x00\x01", AVRO_H) == "bad_avro"
    assert _code(AVRO_ONE[:5] + b"\x7f" * 40, AVRO_H) in {"bad_avro", "truncated_avro"}


def test_a_string_that_is_not_utf8_is_bad_avro_wherever_it_stands() -> None:
    event = {**EVENTS["FollowUp"], "text_redacted": "ZZZZ"}  # the last field of FollowUp
    value = encode_avro([event])
    assert value.endswith(b"ZZZZ")
    for bad in (b"\xff\xfeZZ", b"Z\xc3ZZ"):
        with pytest.raises(DecodeError, match="not UTF-8") as info:
            decode_record(value[:-4] + bad, AVRO_H)
        assert info.value.code == "bad_avro"
    assert _code(value[:-4] + b"ZZZ\xc3", AVRO_H) == "truncated_avro"  # a character cut by the body's end


def test_bad_magic() -> None:
    assert _code(b"\x01" + AVRO_ONE[1:], AVRO_H) == "bad_magic"
    assert _code(encode_json([EVENTS["ToolCall"]]), AVRO_H) == "bad_magic"  # JSON sent under an avro header


@pytest.mark.parametrize("value", [b"{not json", b'{"a": 1', b"\xff\xfe{}", b"[1, 2"])
def test_bad_json(value: bytes) -> None:
    assert _code(value, JSON_H) == "bad_json"


@pytest.mark.parametrize("value", [b"7", b'"x"', b"[1, 2]", b'{"events": 3}', b'{"events": [1]}', b"null"])
def test_json_that_is_not_an_event(value: bytes) -> None:
    assert _code(value, JSON_H) == "not_an_event"


def test_empty_and_unknown_format() -> None:
    assert _code(b"", AVRO_H) == "not_an_event"
    assert _code(None) == "not_an_event"
    assert _code(AVRO_ONE, [(FORMAT_HEADER, b"protobuf")]) == "unknown_format"
    assert _code(b"plain text") == "unknown_format"  # no header, neither 0 nor '{' / '['


def test_oversized_records() -> None:
    big = encode_json([{**EVENTS["FollowUp"], "text_redacted": "x" * 16_000}] * 70)
    assert len(big) > 1_000_000
    assert _code(big, JSON_H) == "too_large"
    assert _code(AVRO_BATCH, AVRO_H, max_bytes=len(AVRO_BATCH) - 1) == "too_large"
    assert len(decode_record(AVRO_BATCH, AVRO_H, max_bytes=len(AVRO_BATCH))) > 1


def test_too_large_batches() -> None:
    events = [EVENTS["UserAction"]] * 501
    assert _code(encode_json(events), JSON_H) == "batch_too_large"
    assert _code(encode_avro(events, batch_id="b"), AVRO_H) == "batch_too_large"
    assert _code(AVRO_BATCH, AVRO_H, max_batch_events=2) == "batch_too_large"


def test_record_name_disagreeing_with_event_type_is_invalid() -> None:
    cat = default_catalogue()
    buf = io.BytesIO()
    buf.write(struct.pack(">bI", 0, cat.writer("ToolCall").schema_id))
    schemaless_writer(buf, cat.writer("ToolCall").parsed, {**EVENTS["ToolCall"], "event_type": "AgentEdit"})
    [decoded] = decode_record(buf.getvalue(), AVRO_H)
    with pytest.raises(InvalidEvent) as info:
        validate_event(decoded)
    assert info.value.field == "event_type"


def test_every_documented_decode_code_is_exercised() -> None:
    documented = {"unknown_format", "bad_magic", "unknown_schema_id", "truncated_avro", "bad_avro",
                  "bad_json", "not_an_event", "too_large", "batch_too_large"}
    assert documented == set(re.findall(r"``(\w+)``", DecodeError.__doc__ or ""))
    tested = set(re.findall(r'== \{?"(\w+)"', Path(__file__).read_text()))
    assert documented <= tested
