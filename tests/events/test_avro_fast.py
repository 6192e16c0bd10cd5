"""The compiled Avro decoder (``rewardflow.events.avro_fast`` / ``_avrofast.c``) is fastavro, only faster.

Pure (no Kafka). Properties:

* for every event type, sample sessions, session batches and
  hypothesis-generated values (real schemas and a synthetic schema with every
  compiled type), the decoder returns exactly fastavro's objects: equal, the
  same types (float vs int vs bool), the same dict key order, the same float
  bits; and ``decode_record`` returns the same events with the fast path on
  and forced off, the fast path having actually answered (counted);
* for mutated records (truncations, byte flips, insertions, deletions,
  garbage after the 5-byte frame) ``decode_record`` returns the same events
  or raises the same ``DecodeError`` (code and message) with the fast path on
  and off, and the decoder itself never raises: it returns None or exactly
  fastavro's object;
* hostile counts and lengths (huge, negative, overlong varints, deep garbage)
  give None quickly, and the item budget holds;
* schemas the program does not express get no decoder (fastavro decodes).
"""

from __future__ import annotations

import io
import math
import os
import random
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewardflow.events import avro_fast
from rewardflow.events.catalogue import BATCH, EVENT_TYPES, NAMESPACE, default_catalogue
from rewardflow.events.errors import DecodeError
from rewardflow.events.samples import sample_events, session_events
from rewardflow.events.wire import decode_record, encode_avro

pytestmark = pytest.mark.skipif(not avro_fast.AVAILABLE, reason=f"no compiled decoder: {avro_fast.status()}")

CAT = default_catalogue()
EVENTS = [e.model_dump() for e in sample_events(600, seed=21, turns=3)]
BY_TYPE = {name: [e for e in EVENTS if e["event_type"] == name] for name in EVENT_TYPES}
FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])


# ---------------------------------------------------------------------------- helpers
def same(a: Any, b: Any, path: str = "$") -> None:
    """Assert a and b are the same objects: types, dict key order, float bits (NaN and -0.0 included)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b)), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def fastavro_read(schema: Any, data: bytes, offset: int = 0) -> tuple[bool, Any]:
    """(True, fastavro's object) if it reads data[offset:] exactly, else (False, None)."""
    buf = io.BytesIO(data)
    buf.seek(offset)
    try:
        obj = schemaless_reader(buf, schema, None, return_record_name=True)
    except Exception:
        return False, None
    return buf.tell() == len(data), obj


def fast_decoder(schema: Any) -> avro_fast.Decode:
    decode = avro_fast.decoder(schema)
    assert decode is not None
    return decode


class Counting:
    """avro_fast.decoder wrapped: counts the records the fast path answered (not None)."""

    def __init__(self, real: Callable[[Any], avro_fast.Decode | None]) -> None:
        self.real, self.calls, self.answered = real, 0, 0

    def __call__(self, parsed: Any) -> avro_fast.Decode | None:
        decode = self.real(parsed)
        if decode is None:
            return None

        def counted(data: bytes, offset: int, max_items: int) -> Any:
            self.calls += 1
            obj = decode(data, offset, max_items)
            self.answered += obj is not None
            return obj

        return counted


def outcome(value: bytes, **kw: Any) -> tuple[str, Any]:
    try:
        return "ok", decode_record(value, **kw)
    except DecodeError as exc:
        return "error", (exc.code, str(exc))


def both_ways(values: list[bytes]) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]], Counting]:
    """decode_record of every value with the fast path on (counted), then forced off."""
    counting = Counting(avro_fast.decoder)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(avro_fast, "decoder", counting)
        fast = [outcome(v) for v in values]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(avro_fast, "decoder", lambda parsed: None)
        slow = [outcome(v) for v in values]
    return fast, slow, counting


def frame(name: str, obj: Any) -> bytes:
    entry = CAT.current[name]
    buf = io.BytesIO()
    buf.write(struct.pack(">bI", 0, entry.schema_id))
    schemaless_writer(buf, entry.parsed, obj)
    return buf.getvalue()


def batch(events: list[dict[str, Any]], batch_id: str = "b") -> bytes:
    """A session batch of ``events``, all moved to the first one's session (a record holds one session)."""
    sid = str(events[0]["session_id"])
    items = [(f"{NAMESPACE}.{e['event_type']}", {**e, "session_id": sid}) for e in events]
    return frame(BATCH, {"batch_id": batch_id, "session_id": sid, "events": items})


def valid_values() -> Iterator[bytes]:
    for name in EVENT_TYPES:
        for e in BY_TYPE[name][:20]:
            yield encode_avro([e])
    for seed in range(6):
        events = [e.model_dump() for e in session_events(seed, turns=4)]
        yield encode_avro(events, batch_id=f"b{seed}")
    for i in range(0, len(EVENTS) - 40, 37):
        sid = EVENTS[i]["session_id"]  # a record holds one session's events
        yield encode_avro([{**e, "session_id": sid} for e in EVENTS[i:i + 1 + i % 40]], batch_id=None if i % 40 == 0 else "b")


VALID = list(valid_values())


# ---------------------------------------------------------------------------- the real schemas
def test_every_catalogue_schema_compiles() -> None:
    for name in (*EVENT_TYPES, BATCH):
        parsed = CAT.current[name].parsed
        assert avro_fast.decoder(parsed) is not None, name
        assert avro_fast.decoder(parsed) is avro_fast.decoder(parsed)  # cached


def test_valid_records_decode_exactly_like_fastavro() -> None:
    answered = 0
    for value in VALID:
        sid = struct.unpack_from(">I", value, 1)[0]
        parsed = CAT.by_id[sid].parsed
        ok, expected = fastavro_read(parsed, value, 5)
        assert ok
        got = fast_decoder(parsed)(value, 5, len(value))
        assert got is not None
        same(got, expected)
        answered += 1
    assert answered == len(VALID) > 100


def test_null_string_union_and_named_branches_are_fastavros() -> None:
    """["null", X] unions give the plain value (None or X); the batch's record branches give (fullname, dict)."""
    edit = dict(BY_TYPE["AgentEdit"][0])
    for fp in (None, "", "fp-1", "é\u2028\U0001f600"):
        value = encode_avro([{**edit, "content_fingerprint": fp}])
        got = fast_decoder(CAT.current["AgentEdit"].parsed)(value, 5, len(value))
        assert got is not None and got["content_fingerprint"] == fp and type(got["content_fingerprint"]) is type(fp)
        same(got, fastavro_read(CAT.current["AgentEdit"].parsed, value, 5)[1])
    value = batch([edit, BY_TYPE["FollowUp"][0]])
    got = fast_decoder(CAT.current[BATCH].parsed)(value, 5, len(value))
    assert [x[0] for x in got["events"]] == [f"{NAMESPACE}.AgentEdit", f"{NAMESPACE}.FollowUp"]
    same(got, fastavro_read(CAT.current[BATCH].parsed, value, 5)[1])


def test_decode_record_is_identical_with_the_fast_path_on_and_off() -> None:
    values = [*VALID, batch(BY_TYPE["ToolCall"][:3], "x"), _mismatched(BY_TYPE["AgentEdit"][:2], "ToolCall")]
    fast, slow, counting = both_ways(values)
    assert counting.answered == len(values)  # the fast path answered every one of them
    for f, s in zip(fast, slow):
        assert f[0] == s[0] == "ok"
        same(f[1], s[1])


def _mismatched(events: list[dict[str, Any]], claimed: str) -> bytes:
    """A batch whose events claim another type than their union branch."""
    sid = str(events[0]["session_id"])
    items = [(f"{NAMESPACE}.{e['event_type']}", {**e, "event_type": claimed, "session_id": sid}) for e in events]
    return frame(BATCH, {"batch_id": "b", "session_id": sid, "events": items})


def test_the_comparison_would_catch_a_wrong_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sanity of the harness: a fast path that answers differently is detected."""
    def wrong(parsed: Any) -> avro_fast.Decode:
        def decode(data: bytes, offset: int, max_items: int) -> Any:
            ok, obj = fastavro_read(parsed, data, offset)
            if obj is not None and "batch_id" in obj:
                obj["batch_id"] += "!"
                obj["events"][0][1]["ts"] = float(obj["events"][0][1]["ts"])
            return obj
        return decode

    value = VALID[-1]
    monkeypatch.setattr(avro_fast, "decoder", wrong)
    bad = outcome(value)
    monkeypatch.undo()
    with pytest.raises(AssertionError):
        same(bad, outcome(value))


# ---------------------------------------------------------------------------- generated values
def values_of(schema: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Hypothesis values fastavro can write for a parsed schema (union branches as fastavro writes them)."""
    if isinstance(schema, str):
        prim = {"null": st.none(), "boolean": st.booleans(), "int": st.integers(-2**31, 2**31 - 1),
                "long": st.integers(-2**63, 2**63 - 1), "float": st.floats(width=32),
                "double": st.floats(), "string": st.text(max_size=30), "bytes": st.binary(max_size=30)}
        return prim[schema] if schema in prim else values_of(named[schema], named)
    if isinstance(schema, list):
        return st.one_of([_branch(b, named) for b in schema])
    kind = schema["type"]
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(values_of(schema["items"], named), max_size=4)
    if kind == "map":
        return st.dictionaries(st.text(max_size=8), values_of(schema["values"], named), max_size=4)
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: values_of(f["type"], named) for f in schema["fields"]})
    return values_of(kind, named)


def _branch(branch: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    inner = values_of(branch, named)
    if isinstance(branch, dict) and branch["type"] == "record":
        return inner.map(lambda v: (branch["name"], v))
    if isinstance(branch, str) and branch in named and named[branch]["type"] == "record":
        return inner.map(lambda v: (named[branch]["name"], v))
    return inner


SYNTHETIC = parse_schema({
    "type": "record", "name": "All", "namespace": "t",
    "fields": [
        {"name": "n", "type": "null"}, {"name": "b", "type": "boolean"}, {"name": "i", "type": "int"},
        {"name": "l", "type": "long"}, {"name": "f", "type": "float"}, {"name": "d", "type": "double"},
        {"name": "s", "type": "string"}, {"name": "y", "type": "bytes"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": ["null", "double"]}]}},
        {"name": "u", "type": ["null", "string", "t.E", "t.Inner", "long", {"type": "array", "items": "int"}]},
        {"name": "a", "type": {"type": "array", "items": ["t.Inner", "boolean"]}},
        {"name": "m", "type": {"type": "map", "values": {"type": "map", "values": "float"}}},
        {"name": "o", "type": ["string", "null"]},
    ],
})


@settings(FUZZ, max_examples=300)
@given(st.data())
def test_generated_synthetic_values_decode_like_fastavro(data: st.DataObject) -> None:
    value = data.draw(values_of(SYNTHETIC, SYNTHETIC["__named_schemas"]))
    buf = io.BytesIO()
    schemaless_writer(buf, SYNTHETIC, value)
    raw = b"\x00" * 3 + buf.getvalue()  # (an offset other than 5)
    ok, expected = fastavro_read(SYNTHETIC, raw, 3)
    assert ok
    got = fast_decoder(SYNTHETIC)(raw, 3, len(raw))
    assert got is not None
    same(got, expected)


@settings(FUZZ, max_examples=200)
@given(st.data())
def test_generated_events_and_batches_decode_like_fastavro(data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(EVENT_TYPES), min_size=1, max_size=6))
    events = [data.draw(values_of(CAT.current[n].parsed, CAT.current[n].parsed["__named_schemas"])) for n in names]
    values = [frame(n, e) for n, e in zip(names, events)]
    values.append(frame(BATCH, {"batch_id": "b", "session_id": "s",
                                "events": [(f"{NAMESPACE}.{n}", e) for n, e in zip(names, events)]}))
    for value in values:
        parsed = CAT.by_id[struct.unpack_from(">I", value, 1)[0]].parsed
        got = fast_decoder(parsed)(value, 5, len(value))
        assert got is not None
        same(got, fastavro_read(parsed, value, 5)[1])
    fast, slow, counting = both_ways(values)
    assert counting.answered == len(values)
    same(fast, slow)


def test_int_fields_beyond_int32_and_special_doubles_are_fastavros() -> None:
    """fastavro reads int like long (64 bits) and doubles bit for bit: so does the decoder."""
    check = dict(BY_TYPE["PersistenceCheck"][0])
    parsed = CAT.current["PersistenceCheck"].parsed
    doubles = [k for k, v in check.items() if isinstance(v, float)]
    assert doubles
    ints = [f["name"] for f in parsed["fields"] if f["type"] == "int"]
    for x in (0.0, -0.0, 1e308, 5e-324, float("inf"), float("-inf"), float("nan")):
        body = io.BytesIO()
        schemaless_writer(body, parsed, {**check, doubles[0]: x})
        value = encode_avro([check])[:5] + body.getvalue()
        same(fast_decoder(parsed)(value, 5, len(value)), fastavro_read(parsed, value, 5)[1])
    # a varint beyond int32 where the schema says int: write it as a long
    long_schema = parse_schema({**{k: v for k, v in parsed.items() if k != "__named_schemas"},
                                "fields": [{**f, "type": "long"} if f["type"] == "int" else f for f in parsed["fields"]]})
    for big in (2**31, -2**31 - 1, 2**63 - 1, -2**63):
        body = io.BytesIO()
        schemaless_writer(body, long_schema, {**check, ints[0]: big})
        value = encode_avro([check])[:5] + body.getvalue()
        got = fast_decoder(parsed)(value, 5, len(value))
        assert got is not None and got[ints[0]] == big
        same(got, fastavro_read(parsed, value, 5)[1])


# ---------------------------------------------------------------------------- mutated input
def mutations(rng: random.Random, value: bytes) -> Iterator[bytes]:
    body = len(value) - 5
    yield value[: rng.randrange(len(value))]  # truncated (frame included)
    yield value[: 5 + rng.randrange(body)]
    flipped = bytearray(value)
    for _ in range(rng.choice((1, 1, 2, 5))):
        flipped[5 + rng.randrange(body)] = rng.randrange(256)
    yield bytes(flipped)
    at = 5 + rng.randrange(body + 1)
    yield value[:at] + bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 9)))) + value[at:]  # inserted
    at = 5 + rng.randrange(body)
    yield value[:at] + value[at + rng.choice((1, 2, 7)):]  # deleted
    yield value + bytes(rng.randrange(256) for _ in range(rng.choice((1, 3))))  # trailing
    yield value[:5] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80)))  # garbage after the frame
    yield value[:5] + bytes(rng.choice((0x80, 0xFF, 0x01, 0x7F, 0xFE)) for _ in range(rng.randrange(1, 40)))


def check_same(values: list[bytes]) -> Counting:
    fast, slow, counting = both_ways(values)
    for v, f, s in zip(values, fast, slow):
        assert f[0] == s[0], (v, f, s)
        same(f[1], s[1])
    for v in values:  # the decoder itself: None or exactly fastavro's object, never an exception
        sid = struct.unpack_from(">I", v, 1)[0] if len(v) >= 5 else None
        entry = CAT.by_id.get(sid) if sid is not None else None
        if entry is None:
            continue
        got = fast_decoder(entry.parsed)(v, 5, len(v))
        if got is not None:
            ok, expected = fastavro_read(entry.parsed, v, 5)
            assert ok, v
            same(got, expected)
    return counting


@pytest.mark.parametrize("seed", range(4))
def test_mutated_records_decode_or_fail_identically(seed: int) -> None:
    rng = random.Random(seed)
    values = [m for v in VALID for m in mutations(rng, v)]
    counting = check_same(values)
    assert counting.calls == sum(1 for v in values if len(v) >= 5 and v[0] == 0)  # every avro frame went through it
    assert counting.answered > len(values) // 50  # (flipped text bytes, some insertions, ... still decode)


@settings(FUZZ, max_examples=400)
@given(st.sampled_from(VALID), st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "cut"]),
                                                 st.integers(0, 2**16), st.binary(min_size=1, max_size=4)),
                                       min_size=1, max_size=4))
def test_hypothesis_mutations_decode_or_fail_identically(value: bytes,
                                                        ops: list[tuple[str, int, bytes]]) -> None:
    v = bytearray(value)
    for op, at, data in ops:
        at = 5 + at % max(1, len(v) - 5)
        if op == "flip" and at < len(v):
            v[at] = data[0]
        elif op == "insert":
            v[at:at] = data
        elif op == "delete":
            del v[at:at + len(data)]
        elif op == "cut":
            del v[at:]
    check_same([bytes(v)])


@settings(FUZZ, max_examples=300)
@given(st.sampled_from(sorted(CAT.by_id)), st.binary(max_size=200))
def test_garbage_after_the_frame_decodes_or_fails_identically(sid: int, body: bytes) -> None:
    check_same([struct.pack(">bI", 0, sid) + body])


# ---------------------------------------------------------------------------- hostile counts and lengths
def zz(n: int) -> bytes:
    """Avro zigzag varint of n (any size; beyond 64 bits too, for overlong input)."""
    u = (n << 1) ^ (n >> 70) if n < 0 else n << 1
    out = bytearray()
    while True:
        b = u & 0x7F
        u >>= 7
        if u:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def s(text: str) -> bytes:
    raw = text.encode()
    return zz(len(raw)) + raw


BATCH_HEAD = struct.pack(">bI", 0, CAT.current[BATCH].schema_id) + s("b") + s("sess")
EDIT = CAT.current["AgentEdit"]


@pytest.mark.parametrize("count", [2**62, 2**63 - 1, 10**6, 10**9, -1, -(2**63), -5])
def test_huge_and_negative_array_counts_give_none_quickly(count: int) -> None:
    value = BATCH_HEAD + zz(count) + b"\x02" * 50
    t = time.perf_counter()
    assert fast_decoder(CAT.current[BATCH].parsed)(value, 5, 10**9) is None
    assert time.perf_counter() - t < 0.5
    check_same([value])


def test_overlong_varints_and_lengths_give_none() -> None:
    decode = fast_decoder(CAT.current[BATCH].parsed)
    for bad in (b"\xff" * 10 + b"\x01", b"\xff" * 9 + b"\x02", b"\x80" * 11, b"\xff" * 200, zz(-1), zz(-(2**62)),
                zz(2**62), zz(10**6)):
        value = BATCH_HEAD[:5] + bad + b"abc" * 10
        assert decode(value, 5, 1000) is None
    # a varint in 10 bytes (non-canonical, within 64 bits) reads as fastavro reads it
    edit = frame("AgentEdit", BY_TYPE["AgentEdit"][0])
    first = edit[5]  # the event_id's length: one byte
    assert first < 0x80
    ten = bytes([first | 0x80]) + b"\x80" * 8 + b"\x00"
    value = edit[:5] + ten + edit[6:]
    got = fast_decoder(EDIT.parsed)(value, 5, 1000)
    assert got is not None
    same(got, fastavro_read(EDIT.parsed, value, 5)[1])
    assert fast_decoder(EDIT.parsed)(edit[:5] + ten[:-1] + b"\x80\x00" + edit[6:], 5, 1000) is None  # 11 bytes


def test_booleans_other_than_0_and_1_fall_back() -> None:
    """fastavro reads any non-zero byte as True; the decoder leaves such bytes to it (same result either way)."""
    fu = dict(BY_TYPE["FollowUp"][0], dissatisfied=True)
    value = frame("FollowUp", fu)
    parsed = CAT.current["FollowUp"].parsed
    # the boolean's byte: where the records with True and with False differ
    t, f = frame("FollowUp", {**fu, "dissatisfied": True}), frame("FollowUp", {**fu, "dissatisfied": False})
    at = next(i for i, (a, b) in enumerate(zip(t, f)) if a != b)
    odd = t[:at] + b"\x07" + t[at + 1:]
    assert fast_decoder(parsed)(odd, 5, 100) is None
    assert fast_decoder(parsed)(value, 5, 100) is not None
    check_same([odd, t, f])


def test_invalid_utf8_falls_back_to_fastavros_error() -> None:
    edit = BY_TYPE["AgentEdit"][0]
    value = frame("AgentEdit", edit)
    for bad in (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"):
        raw = edit["event_id"].encode()
        broken = value.replace(zz(len(raw)) + raw, zz(len(raw)) + raw[:-len(bad)] + bad, 1)
        assert broken != value
        assert fast_decoder(EDIT.parsed)(broken, 5, 100) is None
        f, s_ = both_ways([broken])[:2]
        assert f == s_ and f[0][0] == "error" and f[0][1][0] == "bad_avro"


def test_bad_union_and_enum_indexes_give_none() -> None:
    served = BY_TYPE["InferenceServed"][0]
    value = frame("InferenceServed", served)
    parsed = CAT.current["InferenceServed"].parsed
    symbols = next(f["type"]["symbols"] for f in parsed["fields"] if f["name"] == "surface")
    head = frame("InferenceServed", {**served, "surface": symbols[0]})
    at = next(i for i, (a, b) in enumerate(zip(head, frame("InferenceServed", {**served, "surface": symbols[1]}))) if a != b)
    for idx in (len(symbols), -1, 2**40):
        bad = head[:at] + zz(idx) + head[at + 1:]
        assert fast_decoder(parsed)(bad, 5, 100) is None
    assert fast_decoder(parsed)(value, 5, 100) is not None
    items = BATCH_HEAD + zz(1)
    for idx in (7, -1, 99):
        assert fast_decoder(CAT.current[BATCH].parsed)(items + zz(idx) + b"\x00" * 40, 5, 100) is None


def test_the_item_budget_holds() -> None:
    events = EVENTS[:12]
    value = encode_avro(events, batch_id="b")
    decode = fast_decoder(CAT.current[BATCH].parsed)
    assert decode(value, 5, 11) is None
    assert decode(value, 5, 12) is not None
    assert decode(value, 5, -3) is None
    empty = BATCH_HEAD + zz(0)  # an empty array needs no budget
    assert decode(empty, 5, 0) == {"batch_id": "b", "session_id": "sess", "events": []}


def test_deep_and_long_garbage_is_bounded() -> None:
    rng = random.Random(7)
    decode = fast_decoder(CAT.current[BATCH].parsed)
    t = time.perf_counter()
    for n in (10, 1_000, 100_000, 1_000_000):
        for pattern in (b"\x02", b"\xff", b"\x00", b"\x01\x02"):
            assert decode(BATCH_HEAD + (pattern * n)[:n], 5, n) is None
        junk = bytes(rng.randrange(256) for _ in range(min(n, 20_000)))
        decode(BATCH_HEAD + junk, 5, len(junk))
    assert time.perf_counter() - t < 5


def test_arguments_and_buffers() -> None:
    value = VALID[0]
    decode = fast_decoder(CAT.by_id[struct.unpack_from(">I", value, 1)[0]].parsed)
    expected = decode(value, 5, 100)
    assert expected is not None
    same(decode(bytearray(value), 5, 100), expected)
    same(decode(memoryview(value), 5, 100), expected)
    assert decode(value, len(value), 100) is None  # nothing to read
    for bad_offset in (-1, len(value) + 1):
        with pytest.raises(ValueError):
            decode(value, bad_offset, 100)
    with pytest.raises(TypeError):
        decode("text", 0, 100)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- what is not compiled
@pytest.mark.parametrize("schema", [
    {"type": "record", "name": "F", "fields": [{"name": "x", "type": {"type": "fixed", "name": "Fx", "size": 4}}]},
    {"type": "record", "name": "T", "fields": [{"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}]},
    {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},
])
def test_unsupported_schemas_get_no_decoder(schema: dict[str, Any]) -> None:
    parsed = parse_schema(schema)
    with pytest.raises(avro_fast.Unsupported):
        avro_fast.program(parsed)
    assert avro_fast.decoder(parsed) is None


def test_programs_deeper_than_the_limit_are_refused() -> None:
    schema: Any = "long"
    for _ in range(avro_fast.MAX_DEPTH + 1):
        schema = {"type": "array", "items": schema}
    with pytest.raises(avro_fast.Unsupported):
        avro_fast.program(parse_schema({"type": "record", "name": "D", "fields": [{"name": "d", "type": schema}]}))
    deep: Any = (avro_fast.OP_LONG, (), ())
    for _ in range(40):
        deep = (avro_fast.OP_ARRAY, (), (deep,))
    with pytest.raises(ValueError):
        avro_fast._ext.Decoder(deep)
    for bad in [(99, (), ()), (avro_fast.OP_RECORD, ("a",), ()), (avro_fast.OP_ENUM, (), ()), ("x",), None]:
        with pytest.raises((TypeError, ValueError)):
            avro_fast._ext.Decoder(bad)


def test_pure_python_mode_has_no_fast_path() -> None:
    code = ("from rewardflow.events import avro_fast; from rewardflow.events.catalogue import default_catalogue;"
            "from rewardflow.events.wire import decode_record, encode_avro;"
            "from rewardflow.events.samples import sample_events;"
            "cat = default_catalogue(); assert not avro_fast.AVAILABLE;"
            "assert all(avro_fast.decoder(e.parsed) is None for e in cat.by_id.values());"
            "ev = [e.model_dump() for e in sample_events(5)]; assert decode_record(encode_avro(ev, batch_id='b')) == ev;"
            "print(avro_fast.status())")
    env = {**os.environ, "REWARDFLOW_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "REWARDFLOW_PURE_PYTHON" in out.stdout


def test_one_decoder_from_several_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    decode = fast_decoder(CAT.current[BATCH].parsed)
    batches = [v for v in VALID if struct.unpack_from(">I", v, 1)[0] == CAT.current[BATCH].schema_id]
    expected = [decode(v, 5, len(v)) for v in batches]

    def work(k: int) -> bool:
        return all(decode(v, 5, len(v)) == e for _ in range(20) for v, e in zip(batches[k % 3:], expected[k % 3:]))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(8)))


def test_a_batch_event_that_claims_another_type_is_marked_on_both_paths() -> None:
    value = _mismatched(BY_TYPE["AgentEdit"][:2] + BY_TYPE["FollowUp"][:1], "ToolCall")
    fast, slow, counting = both_ways([value])
    assert counting.answered == 1 and fast == slow
    assert [e["event_type"] for e in fast[0][1]] == ["AgentEdit!ToolCall", "AgentEdit!ToolCall", "FollowUp!ToolCall"]
