"""Records built from per-event pieces equal the wire module's encoders and decode back."""

from __future__ import annotations

import orjson
import pytest

from rewardflow.client.encoding import AvroBatchEncoder, JsonBatchEncoder, encoder_for, fields_of
from rewardflow.events.samples import session_events
from rewardflow.events.validate import validate_event
from rewardflow.events.wire import FORMAT_HEADER, decode_record, encode_avro

SESSIONS = [session_events(seed, turns=3) for seed in range(6)]


def _pieces(encoder: AvroBatchEncoder | JsonBatchEncoder, events: list) -> list[bytes]:  # type: ignore[type-arg]
    return [encoder.piece(e) for e in events]


def test_avro_record_is_byte_identical_to_encode_avro() -> None:
    encoder = AvroBatchEncoder()
    for events in SESSIONS:
        value = encoder.record(encoder.head("batch-7", events[0].session_id), _pieces(encoder, events))
        assert value == encode_avro([e.model_dump() for e in events], batch_id="batch-7")


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_records_decode_to_the_same_events(fmt: str) -> None:
    encoder = encoder_for(fmt)
    for events in SESSIONS:
        value = encoder.record(encoder.head("b1", events[0].session_id), _pieces(encoder, events))  # type: ignore[arg-type]
        raws = decode_record(value, encoder.headers)  # type: ignore[arg-type]
        assert [validate_event(r) for r in raws] == events
        assert dict(encoder.headers)[FORMAT_HEADER] == fmt.encode()


def test_json_record_carries_batch_and_session_ids() -> None:
    encoder = JsonBatchEncoder()
    events = SESSIONS[0][:2]
    doc = orjson.loads(encoder.record(encoder.head("b\"1", events[0].session_id), _pieces(encoder, events)))
    assert doc["batch_id"] == "b\"1" and doc["session_id"] == events[0].session_id
    assert doc["events"] == [e.model_dump() for e in events]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_head_tail_pieces_and_separators_bound_the_record(fmt: str) -> None:
    encoder = encoder_for(fmt)
    head = encoder.head("id-123", "sess-é")
    for count in (1, 63, 64, 500, 100_000):
        pieces = [b"xy"] * count
        size = len(encoder.record(head, pieces))
        assert size <= len(head) + encoder.tail + count * (2 + len(encoder.separator))


def test_fields_of_equals_model_dump() -> None:
    for events in SESSIONS:
        for event in events:
            assert fields_of(event) == event.model_dump()


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="avro"):
        encoder_for("protobuf")
