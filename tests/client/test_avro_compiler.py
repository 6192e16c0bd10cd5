"""The compiled Avro writer writes exactly fastavro's bytes, for every event type and edge value."""

from __future__ import annotations

from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardflow.client.avro_compiler import Unsupported, compile_writer, varint
from rewardflow.events.catalogue import default_catalogue
from rewardflow.events.models import EVENT_MODELS, Envelope
from rewardflow.events.samples import sample_events
from tests.client.generic import GENERIC, Inner, Outer, fastavro_bytes


EVENTS = sample_events(5_000, seed=21)


@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_every_sample_event_matches_fastavro(name: str) -> None:
    parsed = default_catalogue().writer(name).parsed
    write = compile_writer(parsed)
    events = [e for e in EVENTS if e.event_type == name]
    assert events
    for event in events:
        assert write(event.__dict__) == fastavro_bytes(parsed, event.model_dump())


def test_prefix_goes_first() -> None:
    parsed = default_catalogue().writer("ToolCall").parsed
    event = next(e for e in EVENTS if e.event_type == "ToolCall")
    assert compile_writer(parsed, prefix=b"\x04")(event.__dict__) == b"\x04" + fastavro_bytes(parsed, event.model_dump())


def _with(event: Envelope, **changes: Any) -> Envelope:
    return type(event).model_validate({**event.model_dump(), **changes})


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=0, max_size=16_384), n=st.integers(0, 2**31 - 1), flag=st.none() | st.booleans())
def test_long_texts_big_ints_and_optionals(text: str, n: int, flag: bool | None) -> None:
    follow = _with(next(e for e in EVENTS if e.event_type == "FollowUp"), text_redacted=text or None, dissatisfied=flag)
    check = _with(next(e for e in EVENTS if e.event_type == "PersistenceCheck"), surviving_chars=n, branch_changed=flag)
    for event in (follow, check):
        parsed = default_catalogue().writer(event.event_type).parsed
        assert compile_writer(parsed)(event.__dict__) == fastavro_bytes(parsed, event.model_dump())


def test_text_longer_than_the_length_table() -> None:
    follow = _with(next(e for e in EVENTS if e.event_type == "FollowUp"), text_redacted="é" * 16_384)  # 32 KiB of UTF-8
    parsed = default_catalogue().writer("FollowUp").parsed
    assert compile_writer(parsed)(follow.__dict__) == fastavro_bytes(parsed, follow.model_dump())


@settings(max_examples=300, deadline=None)
@given(n=st.integers(-(2**63), 2**63 - 1), x=st.floats(width=32), raw=st.binary(max_size=300), tail=st.none() | st.text(max_size=20),
       color=st.sampled_from([None, "red", "green"]), flag=st.sampled_from([None, True, False]))
def test_negative_and_huge_longs_floats_bytes_named_refs_and_null_second(
        n: int, x: float, raw: bytes, tail: str | None, color: str | None, flag: bool | None) -> None:
    value = Outer(n=n, inner=Inner(x=x, raw=raw), maybe=Inner(x=1.5, raw=b"") if n % 2 else None, tail=tail, color=color, flag=flag)
    assert compile_writer(GENERIC)(value.__dict__) == fastavro_bytes(GENERIC, value.model_dump())


def test_varint_matches_the_spec_examples() -> None:
    # from the Avro specification's zigzag table
    assert [varint(v) for v in (0, -1, 1, -2, 2, -64, 64)] == [b"\x00", b"\x01", b"\x02", b"\x03", b"\x04", b"\x7f", b"\x80\x01"]
    for n in (2**31 - 1, -(2**31), 1_764_000_000_000, 2**62, -(2**63), 2**63 - 1):
        assert varint(n) == fastavro_bytes(fastavro.parse_schema("long"), n)  # type: ignore[arg-type]


@pytest.mark.parametrize("schema", [
    {"type": "record", "name": "M", "fields": [{"name": "m", "type": {"type": "map", "values": "int"}}]},
    {"type": "record", "name": "A", "fields": [{"name": "a", "type": {"type": "array", "items": "int"}}]},
    {"type": "record", "name": "U", "fields": [{"name": "u", "type": ["null", "int", "string"]}]},
    {"type": "record", "name": "F", "fields": [{"name": "f", "type": {"type": "fixed", "name": "F16", "size": 16}}]},
    "string",
])
def test_unsupported_constructs_are_refused_at_compile_time(schema: Any) -> None:
    with pytest.raises(Unsupported):
        compile_writer(schema)


ENVELOPE = ("org_id", "session_id", "request_id", "producer")


@pytest.mark.parametrize("limit", [3, 4096])
def test_memo_and_constants_match_fastavro(limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from rewardflow.client import avro_compiler

    monkeypatch.setattr(avro_compiler, "MEMO_LIMIT", limit)  # 3: the memo is emptied again and again
    for name in EVENT_MODELS:
        parsed = default_catalogue().writer(name).parsed
        write = compile_writer(parsed, prefix=b"\x02", memo=ENVELOPE, constants={"event_type": name})
        for event in [e for e in EVENTS if e.event_type == name]:
            assert write(event.__dict__) == b"\x02" + fastavro_bytes(parsed, event.model_dump())


def test_memo_key_covers_every_envelope_value() -> None:
    parsed = default_catalogue().writer("UserAction").parsed
    write = compile_writer(parsed, memo=ENVELOPE)
    base = next(e for e in EVENTS if e.event_type == "UserAction")
    variants = [base, _with(base, producer={"name": "other", "version": "1"}), _with(base, org_id="org-2"),
                _with(base, request_id="r-2"), _with(base, session_id="s-2"), base]
    for event in variants:
        assert write(event.__dict__) == fastavro_bytes(parsed, event.model_dump())


def test_memo_run_must_be_consecutive() -> None:
    with pytest.raises(Unsupported, match="consecutive"):
        compile_writer(default_catalogue().writer("ToolCall").parsed, memo=("org_id", "request_id"))


@pytest.mark.parametrize(("name", "changes"), [
    ("InferenceServed", {"ttft_ms": 8_191, "latency_ms": 8_192, "prompt_tokens": 2**31 - 1, "completion_tokens": 0}),
    ("InferenceServed", {"ts": 946_684_800_000}),  # the earliest valid ts
    ("InferenceServed", {"ts": 4_102_444_799_999}),  # the latest: above the fast long table
    ("PersistenceCheck", {"surviving_chars": 8_192, "horizon_s": 7 * 86_400}),
    ("PersistenceCheck", {"surviving_chars": 2**31 - 1, "branch_changed": None}),
    ("FollowUp", {"text_redacted": "y" * 8_191}),
    ("FollowUp", {"text_redacted": "y" * 8_192}),  # length beyond the fast length table
    ("FollowUp", {"text_redacted": "é" * 5_000}),  # 10,000 bytes of UTF-8
])
def test_values_at_the_edges_of_the_fast_tables_match_fastavro(name: str, changes: dict[str, Any]) -> None:
    """The fast path hands values outside its tables to the general function; the bytes never change."""
    parsed = default_catalogue().writer(name).parsed
    event = _with(next(e for e in EVENTS if e.event_type == name), **changes)
    expected = fastavro_bytes(parsed, event.model_dump())
    assert compile_writer(parsed)(event.__dict__) == expected
    piece = compile_writer(parsed, prefix=b"\x02", memo=ENVELOPE, constants={"event_type": name})
    assert piece(event.__dict__) == piece(event.__dict__) == b"\x02" + expected  # the second call hits the memo


def test_values_that_do_not_fit_the_schema_raise_instead_of_writing_bytes() -> None:
    """Unvalidated models (``model_construct``): a bad enum symbol, a text in an int field, a float in a long."""
    base = next(e for e in EVENTS if e.event_type == "ToolCall")
    write = compile_writer(default_catalogue().writer("ToolCall").parsed, memo=ENVELOPE)
    for changes in ({"status": "weird"}, {"duration_ms": "12"}, {"ts": 1.5e12}):
        broken = type(base).model_construct(**{**base.__dict__, **changes})
        with pytest.raises((KeyError, TypeError)):
            write(broken.__dict__)
