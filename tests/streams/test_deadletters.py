"""Every kind of unusable input is dead-lettered with its reason, original bytes and source."""

from __future__ import annotations

import base64
import struct
import time
from typing import Any

import orjson
import pytest

from rewardflow.kafka import topics as T
from rewardflow.core.records import stable_id
from rewardflow.events.wire import encode_avro, encode_json
from tests.factories import ev, turn
from tests.streams.kafka_io import json_record

pytestmark = pytest.mark.kafka
JSON_H = [("rf-format", b"json")]
AVRO_H = [("rf-format", b"avro")]


def test_malformed_inputs_are_dead_lettered_with_reason_bytes_and_source(deploy: Any) -> None:
    d = deploy(max_record_bytes=65_536, max_batch_events=20)
    raw_topic = d.settings.topic(T.RAW)
    avro_one = encode_avro([ev("InferenceServed", "r1", "s1")])
    bad_field = ev("AgentEdit", "rb", "s2", lines_added="many")
    unknown_type = {**ev("FollowUp", "r1", "s1"), "event_type": "Telepathy"}
    batch = [ev("InferenceServed", "rb", "s2"), bad_field, ev("ToolCall", "rb", "s2")]
    # (value, headers, [(index, reason_code, text in reason)]) -- whole-record failures have index -1
    cases: list[tuple[bytes | None, Any, list[tuple[int, str, str]]]] = [
        (b'{"events": [{"event_id": ', JSON_H, [(-1, "bad_json", "invalid JSON")]),
        (b"\x00" + struct.pack(">I", 9999) + avro_one[5:], AVRO_H, [(-1, "unknown_schema_id", "9999")]),
        (avro_one[:-7], AVRO_H, [(-1, "truncated_avro", "ends early")]),
        (b"\x01" + avro_one[1:], AVRO_H, [(-1, "bad_magic", "magic byte is 1")]),
        (encode_json(batch), JSON_H, [(1, "invalid_event", "lines_added")]),
        (encode_json([unknown_type]), JSON_H, [(0, "invalid_event", "Telepathy")]),
        (encode_json([ev("FollowUp", "r1", "s1", text_redacted="x" * 16_000)] * 5), JSON_H,
         [(-1, "too_large", "65536")]),
        (b"", JSON_H, [(-1, "not_an_event", "empty")]),
        (None, None, [(-1, "not_an_event", "empty")]),
        (b"[1, 2]", JSON_H, [(-1, "not_an_event", "JSON must be")]),
        (b"<event/>", [("rf-format", b"xml")], [(-1, "unknown_format", "xml")]),
        (encode_json([ev("ClarifyingQuestion", "r1", "s1")] * 21), JSON_H, [(-1, "batch_too_large", "21")]),
        (b'{"wm": "soon"}', [("rf-format", b"tick")], [(-1, "bad_tick", "tick")]),
        # what a hostile or broken producer may send (docs/trust.md)
        (b'{"wm": 4102444799999}', [("rf-format", b"tick")], [(-1, "forged_tick", "signed")]),
        (b'{"events": []}', JSON_H, [(-1, "empty_batch", "no event")]),
        (encode_json([ev("FollowUp", "r1", "s1"), ev("FollowUp", "r7", "s7")]), JSON_H,
         [(-1, "mixed_sessions", "one session")]),
        (encode_avro([ev("FollowUp", "r1", "s1"), ev("FollowUp", "r1", "s1")], batch_id="b").replace(b"\x04s1", b"\x04s9", 1),
         AVRO_H, [(-1, "batch_session_mismatch", "differs")]),
        (encode_json([ev("InferenceServed", "rf", "s3", int(time.time() * 1000) + 3_600_000)]), JSON_H,
         [(0, "future_ts", "broker timestamp")]),
    ]
    assert len(cases[6][0] or b"") > 65_536
    offsets = d.raw.send_many([(1, value, headers) for value, headers, _ in cases])
    expected = sum(len(c[2]) for c in cases)
    out = d.out.until(lambda o: len(o.rows[T.DEADLETTERS]) >= expected, 20, f"{expected} dead letters").settle(1.0)

    letters = {(r["source_offset"], r["index"]): r for r in out.rows[T.DEADLETTERS]}
    assert len(out.rows[T.DEADLETTERS]) == len(letters) == expected
    for (value, _, wants), offset in zip(cases, offsets, strict=True):
        for index, code, text in wants:
            row = letters[(offset, index)]
            assert (row["reason_code"], row["source_topic"], row["source_partition"]) == (code, raw_topic, 1)
            assert text in row["reason"], (code, row["reason"])
            assert row["dead_letter_id"] == stable_id(raw_topic, 1, offset, index)
            original = base64.b64decode(row["original_b64"])
            if index == -1:
                assert original == (value or b"")
            else:  # one event of a record: its own JSON
                event = orjson.loads(value or b"")
                event = event["events"][index] if "events" in event else event
                assert orjson.loads(original) == event
                assert (row["event_id"], row["event_type"]) == (event["event_id"], event["event_type"])
    # the rest of the batch with the invalid event went on; so did the worker
    batch_offset = offsets[4]
    assert sorted(r["event_id"] for r in out.rows[T.VALID] if r["source_offset"] == batch_offset) == sorted(
        [batch[0]["event_id"], batch[2]["event_id"]])
    d.raw.send(1, *json_record(*turn("r-after", "s9", horizons=(30, 120))))
    d.out.until(lambda o: len(o.finals("r-after")) == 2, 20, "a good turn after the bad records")
    assert d.worker.alive


def test_a_record_just_over_the_default_size_limit_is_dead_lettered(deploy: Any) -> None:
    d = deploy(max_record_bytes=1_000_000)  # the production default
    value = encode_json([ev("FollowUp", "r1", "s1", text_redacted="x" * 16_000)] * 62)
    assert 1_000_000 < len(value) < 1_048_588  # the broker takes it on the raw topic
    offset = d.raw.send(0, value, JSON_H)
    d.raw.send(0, *json_record(*turn("r-after", "s9", horizons=(30, 120))))
    out = d.out.until(lambda o: len(o.finals("r-after")) == 2, 20, "the turn after the big record").settle(1.0)
    assert [(r["source_offset"], r["reason_code"]) for r in out.rows[T.DEADLETTERS]] == [(offset, "too_large")]
