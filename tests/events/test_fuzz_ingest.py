"""Fuzzing the ingest path: random and mutated records through ``PartitionProcessor.process``.

Pure (no Kafka). Each hypothesis example feeds a few records to a fresh
processor; across the strategies below more than 10,000 payloads go through
(``MIN_PAYLOADS``). For every record the properties are:

* ``process`` never raises, and every row it returns can be serialised the way
  the worker sends it (orjson, non-str keys);
* a record that :func:`decode_record` refuses yields exactly one dead letter
  (index -1, the decoder's reason code, the original bytes) and nothing else;
* otherwise each of its ``n`` events is accounted for exactly once: a valid
  row, a late or duplicate exclusion, or a dead letter with its index and the
  ``invalid_event`` code;
* the input limits hold: nothing from a record over ``max_record_bytes`` or a
  batch over ``max_batch_events`` is accepted, and every accepted event keeps
  the field length limits (ids, ``text_redacted``);
* no record moves the partition's watermark past its broker timestamp plus the
  allowed clock skew: an event dated later is dead-lettered (``future_ts``), a
  tick is capped there, and a tick without the workers' MAC is ``forged_tick``.

The processor runs as the worker's does: with a tick key, a broker timestamp per
record, session limits, and a store of encoded values.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math
import random
import re
import struct
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewardflow.core.config import DictStore, EncodedStore, JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.limits import raw_record_limit
from rewardflow.core.processor import PartitionProcessor
from rewardflow.core.ticks import signed_tick
from rewardflow.events.catalogue import default_catalogue
from rewardflow.events.errors import DecodeError
from rewardflow.events.samples import sample_events
from rewardflow.events.wire import FORMAT_HEADER, decode_record, encode_avro, encode_json
from rewardflow.sim.replay import default_specs

MAX_BYTES, MAX_BATCH = 64 * 1024, 40  # small limits, so the fuzz reaches them cheaply
KEY, TOPIC, SKEW = b"fuzz-tick-key-0123456789", "fuzz.events.raw", 500
CFG = JoinConfig(horizons_s=(30, 120), grace_ms=1_000, lateness_ms=500, window_sizes_s=(60,),
                 max_record_bytes=MAX_BYTES, max_batch_events=MAX_BATCH, max_clock_skew_ms=SKEW,
                 max_session_turns=2, max_session_events=12, tick_key=KEY)  # limits the samples reach
SPECS = default_specs()
EVENTS = [e.model_dump() for e in sample_events(400, seed=11, turns=3)]
SESSIONS = [[e for e in EVENTS if e["session_id"] == sid] for sid in dict.fromkeys(e["session_id"] for e in EVENTS)]
NOW = max(e["ts"] for e in EVENTS) + 86_400_000  # the broker's clock: a day after the samples
DECODE_CODES = {"unknown_format", "bad_magic", "unknown_schema_id", "truncated_avro", "bad_avro", "bad_json",
                "not_an_event", "too_large", "batch_too_large", "empty_batch", "mixed_sessions",
                "batch_session_mismatch"}
PER_EVENT_CODES = {"invalid_event", "future_ts", "session_turn_limit", "session_event_limit", "turn_span_limit", "too_old"}
TICK_CODES = {"bad_tick", "forged_tick"}
EVENT_CODES = PER_EVENT_CODES | TICK_CODES
JSON_H, AVRO_H, TICK_H = [(FORMAT_HEADER, b"json")], [(FORMAT_HEADER, b"avro")], [(FORMAT_HEADER, b"tick")]
ID_LIMITS = {"event_id": 64, "org_id": 128, "session_id": 128, "request_id": 128}
Record = tuple[bytes | None, Any]

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                       HealthCheck.filter_too_much])
PAYLOADS = {"n": 0}
CODES_SEEN: set[str] = set()
MIN_PAYLOADS = 10_000


# ---------------------------------------------------------------------------- values
# Strategies are built once: building them inside draws costs more than the processing itself.
IDX = st.integers(0, 2**16)
I64 = st.integers(-2**63, 2**63 - 1)
BIG = st.integers(2**64, 2**200)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=40)
BYTES = st.binary(max_size=300)


def pick(draw: st.DrawFn, seq: Sequence[Any]) -> Any:
    """One element of ``seq`` (shrinks towards the first)."""
    return seq[draw(IDX) % len(seq)]


@st.composite
def nasty_values(draw: st.DrawFn) -> Any:
    """A value that breaks some field: wrong type, out of range, huge, deep, NaN-like."""
    kind = pick(draw, ["int", "bigint", "float", "str", "hugestr", "deep", "dict", "none", "bool", "list"])
    if kind == "int":
        return draw(I64)
    if kind == "bigint":
        return f"<<int:{draw(BIG) * pick(draw, [1, -1])}>>"  # written by _dumps (orjson refuses it)
    if kind == "float":
        return draw(FLOATS)
    if kind == "str":
        return draw(TEXT)
    if kind == "hugestr":
        return pick(draw, ["x", "é", "\u2028", "🦀", "\x00"]) * pick(draw, [65, 129, 16_385, 40_000])
    if kind == "deep":  # written by _dumps: nesting beyond orjson's encoder limit (255) and decoder limit (1024)
        return f"<<{pick(draw, ['list', 'dict'])}:{pick(draw, [2, 60, 254, 255, 300, 600, 1_000, 1_023, 1_024, 1_100])}>>"
    if kind == "dict":
        return {draw(TEXT): draw(I64)}
    if kind == "list":
        return [draw(I64) for _ in range(pick(draw, [0, 1, 3]))]
    return None if kind == "none" else pick(draw, [True, False])


NASTY = nasty_values()
_MARK = re.compile(rb'"<<(list|dict|int):(-?\d+)>>"')


def _dumps(obj: Any) -> bytes:
    """orjson, with the markers replaced by JSON text orjson itself refuses to write."""

    def text(m: re.Match[bytes]) -> bytes:
        kind, n = m.group(1), int(m.group(2))
        if kind == b"int":
            return str(n).encode()
        return b"[" * n + b"]" * n if kind == b"list" else b'{"k":' * n + b"{}" + b"}" * n

    return _MARK.sub(text, orjson.dumps(obj))


@st.composite
def mutated_event(draw: st.DrawFn) -> dict[str, Any]:
    """A valid event with 0-3 fields replaced, removed or added, or dated ahead of the broker's clock."""
    event = dict(pick(draw, EVENTS))
    if pick(draw, range(8)) == 0:
        event["ts"] = NOW + pick(draw, [SKEW, SKEW + 1, 262_000, 2_000_000_000_000])
    for _ in range(pick(draw, [0, 1, 1, 2, 3])):
        op = pick(draw, ["replace", "remove", "add", "producer"])
        key = pick(draw, sorted(event))
        if op == "replace":
            event[key] = draw(NASTY)
        elif op == "remove":
            event.pop(key, None)
        elif op == "add":
            event[pick(draw, ["extra", "", "ts ", "event_type"])] = draw(NASTY)
        else:
            event["producer"] = draw(NASTY)
    return event


MUTATED = mutated_event()


# ---------------------------------------------------------------------------- records
@st.composite
def json_records(draw: st.DrawFn) -> Record:
    events = [draw(MUTATED) for _ in range(pick(draw, [1, 1, 2, 3, 6]))]
    if pick(draw, range(4)):  # mostly one session's events, as clients send them
        events = [{**e, "session_id": events[0].get("session_id")} if isinstance(e, dict) else e for e in events]
    if pick(draw, range(20)) == 0:
        return pick(draw, [b"[]", b'{"events": []}']), JSON_H
    if pick(draw, range(10)) == 0:  # a batch around the limit
        events = events * (MAX_BATCH // len(events) + pick(draw, [0, 1]))
    shape = pick(draw, ["one", "batch", "list"])
    obj: Any = events[0] if shape == "one" else {"events": events} if shape == "batch" else events
    value = _dumps(obj)
    cut = pick(draw, [None, None, None, "truncate", "utf8", "nan", "pad"])
    if cut == "truncate":
        value = value[: draw(IDX) % (len(value) + 1)]
    elif cut == "utf8":  # invalid UTF-8 spliced in
        at = draw(IDX) % (len(value) + 1)
        value = value[:at] + pick(draw, [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80"]) + value[at:]
    elif cut == "nan":
        value = value.replace(b'"ts":', b'"ts":NaN,"x":', 1) if pick(draw, [0, 1]) else value.replace(b"1", b"Infinity", 1)
    elif cut == "pad":  # past the record limit
        value = value[:-1] + b',"pad":"' + b"p" * MAX_BYTES + b'"}' if value.endswith(b"}") else value + b" " * MAX_BYTES
    return value, pick(draw, [JSON_H, JSON_H, None, AVRO_H])


@st.composite
def avro_records(draw: st.DrawFn) -> Record:
    session = pick(draw, SESSIONS) if pick(draw, range(4)) else EVENTS
    events = [pick(draw, session) for _ in range(pick(draw, [1, 1, 2, 5]))]
    value = bytearray(encode_avro(events, batch_id="b" if len(events) > 1 else None))
    op = pick(draw, ["none", "truncate", "flip", "schema_id", "magic", "append", "batch_type", "overlong",
                     "other_session"])
    if op == "other_session":  # an EventBatch naming another session than its events'
        value = bytearray(_avro_batch(events, "claimed-session", events[0]["event_type"]))
    if op == "truncate":
        value = value[: draw(IDX) % len(value)]
    elif op == "flip":
        for _ in range(pick(draw, [1, 2, 6])):
            value[draw(IDX) % len(value)] = draw(IDX) % 256
    elif op == "schema_id":
        sid = pick(draw, [*default_catalogue().by_id, draw(st.integers(0, 2**32 - 1))])
        value[1:5] = struct.pack(">I", sid)
    elif op == "magic":
        value[0] = 1 + draw(IDX) % 255
    elif op == "append":
        value += draw(BYTES)[:20] or b"\x00"
    elif op == "batch_type":  # a batch whose inner event claims another type
        value = bytearray(_avro_mismatched_batch(events, pick(draw, ["ToolCall", "", "x" * 300])))
    elif op == "overlong":  # a string length prefix far beyond the body
        value = value[:5] + b"\xfe\xff\xff\xff\x0f" + value[5:]
    return bytes(value), pick(draw, [AVRO_H, AVRO_H, None, JSON_H])


def _avro_mismatched_batch(events: list[dict[str, Any]], claimed: str) -> bytes:
    return _avro_batch(events, events[0]["session_id"], claimed)


def _avro_batch(events: list[dict[str, Any]], session_id: str, claimed: str | None) -> bytes:
    cat = default_catalogue()
    entry = cat.writer("EventBatch")
    buf = io.BytesIO()
    buf.write(struct.pack(">bI", 0, entry.schema_id))
    items = [(f"rewardflow.events.{e['event_type']}", {**e, "event_type": claimed or e["event_type"]}) for e in events]
    schemaless_writer(buf, entry.parsed, {"batch_id": "b", "session_id": session_id, "events": items})
    return buf.getvalue()


TICKS = [b'{"wm": 5}', b'{"wm": 1e400}', b'{"wm": "x"}', b"[]", b"", b'{"wm": true}',
         b'{"wm": 99999999999999999999999}', b'{"wm": -9223372036854775808}', b"\xff",
         b'{"wm": 4102444799999}', b'{"wm": 18446744073709551615, "mac": "00"}',
         signed_tick(b"another-deployment-key", TOPIC, NOW), signed_tick(KEY, "another.topic", NOW),
         signed_tick(KEY, TOPIC, NOW - 3_600_000), signed_tick(KEY, TOPIC, NOW + 10**12),
         signed_tick(KEY, TOPIC, 2**63 - 1)]
NUMBERS = [b"1e999", b"-0", b"123456789012345678901234567890", b'{"events": 1e400}', b"NaN"]
HEADERS = [None, JSON_H, AVRO_H, [(FORMAT_HEADER, b"\xff\xfe")], [(FORMAT_HEADER, None)], [("other", b"x")],
           {FORMAT_HEADER: b"json"}]


@st.composite
def garbage_records(draw: st.DrawFn) -> Record:
    kind = pick(draw, ["bytes", "text", "bomb", "tick", "empty", "numbers", "huge"])
    value: bytes | None
    if kind == "bytes":
        value = draw(BYTES)
    elif kind == "text":
        value = draw(TEXT).encode("utf-8", "surrogatepass")
    elif kind == "bomb":
        depth = pick(draw, [10, 254, 255, 500, 1_024, 1_025, 5_000, 100_000])
        inner = b"[" * depth + b"]" * depth
        value = pick(draw, [inner, b'{"events":' + inner + b"}", b'{"a":' * depth + b"1" + b"}" * depth])
    elif kind == "tick":
        return pick(draw, TICKS), TICK_H
    elif kind == "numbers":
        value = pick(draw, NUMBERS)
    elif kind == "huge":
        value = b'{"events": [' + b",".join([b"{}"] * pick(draw, [MAX_BATCH, MAX_BATCH + 1, 5_000])) + b"]}"
    else:
        value = pick(draw, [None, b""])
    return value, pick(draw, HEADERS)


@st.composite
def valid_records(draw: st.DrawFn) -> Record:
    """Valid records of one session, some repeated (redelivery or client resend), so dedup paths are
    fuzzed too; some sessions reach their limits."""
    session = pick(draw, SESSIONS)
    start = draw(IDX) % len(session)
    events = session[start:start + pick(draw, [1, 2, 5, 8, 40])]
    if pick(draw, [0, 1]):
        return encode_avro(events, batch_id="b" if len(events) > 1 else None), AVRO_H
    return encode_json(events), JSON_H


# ---------------------------------------------------------------------------- the properties
def check_record(proc: PartitionProcessor, value: bytes | None, headers: Any, offset: int) -> None:
    """Feed one record and check the properties of the module docstring."""
    PAYLOADS["n"] += 1
    out = proc.process(value, headers, offset, 1_800_000_000_000, record_ts=NOW)
    assert proc.wm <= NOW + SKEW and proc.maxts <= NOW + SKEW, "a record moved the watermark past the skew bound"
    for rows in (out.valid, out.rewards, out.windows, out.dead, out.late, out.excluded):
        orjson.dumps(rows, option=orjson.OPT_NON_STR_KEYS)  # what the worker sends; must not raise
    for d in out.dead:
        assert d["reason_code"] in DECODE_CODES | EVENT_CODES, d["reason_code"]
        CODES_SEEN.add(d["reason_code"])
        assert d["reason"] and len(d["reason"]) <= 1000 and len(d["event_id"]) <= 128 and len(d["session_id"]) <= 128
    fmt = dict(headers).get(FORMAT_HEADER) if isinstance(headers, dict) else next((v for k, v in headers or () if k == FORMAT_HEADER), None)
    if fmt == b"tick":
        assert not out.valid and len(out.dead) <= 1 and all(d["reason_code"] in TICK_CODES for d in out.dead)
        return
    mine = [d for d in out.dead if d["source_offset"] == offset]
    try:
        events = decode_record(value, headers, max_bytes=MAX_BYTES, max_batch_events=MAX_BATCH)
    except DecodeError as exc:
        assert [(d["index"], d["reason_code"]) for d in mine] == [(-1, exc.code)]
        assert base64.b64decode(mine[0]["original_b64"]) == (value or b"")[:raw_record_limit(MAX_BYTES)]  # (more is cut)
        assert not out.valid and not out.late and not any(x["reason"] == "duplicate" for x in out.excluded)
        return
    assert value is not None and len(value) <= MAX_BYTES and len(events) <= MAX_BATCH
    bad = sorted(d["index"] for d in mine)
    assert all(d["reason_code"] in PER_EVENT_CODES for d in mine) and bad == sorted(set(bad))
    kept = [r for r in out.valid if r["source_offset"] == offset]
    dup_or_late = out.late + [x for x in out.excluded if x["reason"] == "duplicate"]
    assert len(kept) + len(dup_or_late) + len(bad) == len(events), (len(kept), len(dup_or_late), bad, len(events))
    for row in kept:
        assert all(len(row[k]) <= n for k, n in ID_LIMITS.items())
        payload = orjson.loads(row["payload"])
        assert len(payload.get("text_redacted") or "") <= 16_384
        assert isinstance(row["ts"], int) and not isinstance(row["ts"], bool)


def derived(rng: random.Random, value: bytes | None) -> list[bytes]:
    """Two cheap mutations of a record (a truncation and a few flipped bytes), from a drawn seed."""
    if not value:
        return []
    cut = value[: rng.randrange(len(value))]
    flipped = bytearray(value)
    for _ in range(rng.randint(1, 3)):
        flipped[rng.randrange(len(flipped))] = rng.randrange(256)
    return [cut, bytes(flipped)]


def run(records: list[Record], seed: int) -> None:
    """Feed ``records``, each followed by its :func:`derived` mutations, then a final tick."""
    rng = random.Random(seed)
    proc = PartitionProcessor(CFG, SPECS, EncodedStore(check=False), TOPIC, 0)
    offset = 0
    for value, headers in records:
        for variant in (value, *derived(rng, value)):
            check_record(proc, variant, headers, offset)
            offset += 1
    check_record(proc, signed_tick(KEY, TOPIC, 2**61), TICK_H, offset)  # settle everything that was opened
    assert not proc.pending() or proc.wm == NOW + SKEW


mixed = st.one_of(json_records(), avro_records(), garbage_records(), valid_records())
SEED = st.integers(0, 2**32)


@settings(FUZZ, max_examples=500)
@given(st.lists(json_records(), min_size=1, max_size=4), SEED)
def test_mutated_json_records_are_accepted_or_dead_lettered(records: list[Record], seed: int) -> None:
    run(records, seed)


@settings(FUZZ, max_examples=500)
@given(st.lists(avro_records(), min_size=1, max_size=4), SEED)
def test_mutated_avro_records_are_accepted_or_dead_lettered(records: list[Record], seed: int) -> None:
    run(records, seed)


@settings(FUZZ, max_examples=400)
@given(st.lists(garbage_records(), min_size=1, max_size=4), SEED)
def test_garbage_bombs_and_bad_ticks_never_crash(records: list[Record], seed: int) -> None:
    run(records, seed)


@settings(FUZZ, max_examples=300)
@given(st.lists(mixed, min_size=2, max_size=8), SEED)
def test_mixed_streams_with_resends_keep_the_accounting(records: list[Record], seed: int) -> None:
    run(records + records[: len(records) // 2], seed)  # half resent at new offsets: duplicates, never errors


def test_the_fuzz_fed_at_least_ten_thousand_payloads() -> None:
    if PAYLOADS["n"] == 0:
        pytest.skip("run together with the fuzz tests of this module")
    print(f"fuzzed {PAYLOADS['n']} payloads; dead-letter codes seen: {sorted(CODES_SEEN)}")
    assert PAYLOADS["n"] >= MIN_PAYLOADS, PAYLOADS["n"]
    hostile = {"future_ts", "forged_tick", "mixed_sessions", "empty_batch", "batch_session_mismatch",
               "session_turn_limit", "session_event_limit"}
    assert hostile <= CODES_SEEN, f"the fuzz never reached {sorted(hostile - CODES_SEEN)}"


# ---------------------------------------------------------------------------- the limits, exactly
def _one(value: bytes, headers: Any = JSON_H) -> Outputs:
    cfg = dataclasses.replace(CFG, max_session_turns=1_000, max_session_events=10_000)
    return PartitionProcessor(cfg, SPECS, DictStore(), TOPIC, 0).process(value, headers, 0, 0)


def _event(**fields: Any) -> dict[str, Any]:
    return {**next(e for e in EVENTS if e["event_type"] == "FollowUp"), **fields}


def test_record_size_limit_is_exact() -> None:
    value = encode_json([_event(text_redacted="x" * 16_384)])
    at = value + b" " * (MAX_BYTES - len(value))  # JSON allows trailing whitespace
    assert len(_one(at).valid) == 1
    over = _one(at + b" ")
    assert [(d["index"], d["reason_code"]) for d in over.dead] == [(-1, "too_large")] and not over.valid


@pytest.mark.parametrize("n, ok", [(MAX_BATCH, True), (MAX_BATCH + 1, False)])
def test_batch_event_limit_is_exact(n: int, ok: bool) -> None:
    session = max(SESSIONS, key=len)
    events = [{**session[i % len(session)], "event_id": f"limit-{i}"} for i in range(n)]
    for fmt, value, headers in (("json", encode_json(events), JSON_H), ("avro", encode_avro(events, batch_id="b"), AVRO_H)):
        out = _one(value, headers)
        if ok:
            assert not out.dead and len(out.valid) + len(out.late) == n, fmt
        else:
            assert [d["reason_code"] for d in out.dead] == ["batch_too_large"] and not out.valid, fmt


@pytest.mark.parametrize("field, limit", [("event_id", 64), ("org_id", 128), ("session_id", 128),
                                          ("request_id", 128), ("text_redacted", 16_384)])
def test_field_length_limits_are_exact(field: str, limit: int) -> None:
    at = _one(encode_json([_event(**{field: "a" * limit})]))
    over = _one(encode_json([_event(**{field: "a" * (limit + 1)})]))
    assert len(at.valid) == 1 and not at.dead
    assert not over.valid and [(d["index"], d["reason_code"]) for d in over.dead] == [(0, "invalid_event")]
    assert field in over.dead[0]["reason"]


def test_non_finite_and_giant_numbers_are_dead_lettered_not_coerced() -> None:
    check = next(e for e in EVENTS if e["event_type"] == "PersistenceCheck")
    cases = [orjson.dumps(check).replace(b'"survival_score":', b'"survival_score":NaN,"x":'),
             orjson.dumps({**check, "survival_score": 1e308}),
             orjson.dumps(check).replace(b'"horizon_s":30', b'"horizon_s":' + str(2**70).encode()),
             orjson.dumps({**check, "ts": float(check["ts"])})]
    for value in cases:
        out = _one(value)
        assert not out.valid and len(out.dead) == 1, value[:80]
        assert out.dead[0]["reason_code"] in {"bad_json", "invalid_event"}
    assert math.isfinite(orjson.loads(orjson.dumps(random.random())))
