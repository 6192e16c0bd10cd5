"""The C extension's writers produce exactly the pure writers' bytes, and records of them decode back.

Pure writers: the Avro writer compiled to Python (itself proved equal to
fastavro in test_avro_compiler.py) and ``orjson.dumps``. Compiled: the
``_speedups`` extension (skipped, and reported, when it is not built). Also:
the fallback without the extension, and the extension's ``Lock``.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import threading
from typing import Any

import fastavro
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from rewardflow.client import speedups
from rewardflow.client.encoding import AvroBatchEncoder, JsonBatchEncoder, _json_piece
from rewardflow.events.catalogue import default_catalogue
from rewardflow.events.models import EVENT_MODELS, Envelope, Producer
from rewardflow.events.samples import sample_events
from rewardflow.events.validate import validate_event
from rewardflow.events.wire import decode_record, encode_avro, encode_json
from tests.client.generic import GENERIC, Inner, Outer, fastavro_bytes

compiled = pytest.mark.skipif(not speedups.AVAILABLE, reason=f"C extension not built: {speedups.status()}")
EVENTS = sample_events(6_000, seed=17)
AVRO = AvroBatchEncoder()
JSON = JsonBatchEncoder()


def _pure_encoders() -> tuple[AvroBatchEncoder, JsonBatchEncoder]:
    """The encoders the producer builds without the extension."""
    saved, noticed = speedups._ext, speedups._noticed
    speedups._ext = None
    try:
        return AvroBatchEncoder(), JsonBatchEncoder()
    finally:
        speedups._ext, speedups._noticed = saved, noticed


PURE_AVRO_ENCODER, PURE_JSON_ENCODER = _pure_encoders()
PURE_AVRO = PURE_AVRO_ENCODER.writers
EVENTS_BY_TYPE: dict[str, list[Envelope]] = {name: [e for e in EVENTS if e.event_type == name] for name in EVENT_MODELS}


def same_bytes(event: Envelope) -> None:
    """Compiled and pure writers agree for Avro and JSON (the bytes, or the exception type)."""
    fields = event.__dict__
    pairs = ((AVRO.writers[event.event_type], PURE_AVRO[event.event_type]), (JSON.writers[event.event_type], _json_piece))
    for compiled_writer, pure in pairs:
        try:
            expected: bytes | type[BaseException] = pure(fields)
        except Exception as exc:  # noqa: BLE001 - the compiled writer must raise the same
            expected = type(exc)
        if isinstance(expected, bytes):
            assert compiled_writer(fields) == expected
        else:
            with pytest.raises(expected):
                compiled_writer(fields)


def _with(event: Envelope, **changes: Any) -> Envelope:
    return type(event).model_validate({**event.model_dump(), **changes})


@compiled
def test_the_producer_uses_the_compiled_writers() -> None:
    assert PURE_AVRO["ToolCall"] is not AVRO.writers["ToolCall"] and PURE_JSON_ENCODER.writers["ToolCall"] is _json_piece
    for name in EVENT_MODELS:
        assert type(AVRO.writers[name].__self__).__name__ == "AvroWriter"  # type: ignore[attr-defined]
        assert type(JSON.writers[name].__self__).__name__ == "JsonWriter"  # type: ignore[attr-defined]


@compiled
@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_every_sample_event_is_byte_identical(name: str) -> None:
    assert EVENTS_BY_TYPE[name]
    for event in EVENTS_BY_TYPE[name]:
        same_bytes(event)
        assert JSON.writers[name](event.__dict__) == orjson.dumps(event.model_dump())


@compiled
@pytest.mark.parametrize(("name", "changes"), [
    ("InferenceServed", {"ttft_ms": 0, "latency_ms": 2**31 - 1, "prompt_tokens": 2**31 - 1, "completion_tokens": 8_192}),
    ("InferenceServed", {"ts": 946_684_800_000, "schema_version": 1000}),  # the earliest valid ts, the highest version
    ("InferenceServed", {"ts": 4_102_444_799_999, "checkpoint_id": "ckpt-ü-日本-😀"}),
    ("AgentEdit", {"content_fingerprint": None, "language": "x" * 64}),
    ("AgentEdit", {"content_fingerprint": "a\"b\\c\nd\te\x01f\x7f/é"}),  # JSON escapes
    ("ToolCall", {"error_kind": None, "status": "ok"}),
    ("ToolCall", {"error_kind": "broken_3", "status": "broken", "duration_ms": 0}),
    ("PersistenceCheck", {"surviving_chars": None, "branch_changed": None, "survival_score": 0.0, "revert_score": 1.0}),
    ("PersistenceCheck", {"surviving_chars": 2**31 - 1, "branch_changed": True, "survival_score": 1e-7, "revert_score": 5e-324}),
    ("PersistenceCheck", {"survival_score": 0.1 + 0.2, "revert_score": 1 / 3, "unchanged": False, "horizon_s": 7 * 86_400}),
    ("PersistenceCheck", {"survival_score": 0.0001, "revert_score": 0.00001}),  # repr 1e-05: orjson writes 0.00001
    ("UserAction", {"edit_id": None, "action": "revert"}),
    ("FollowUp", {"dissatisfied": None, "text_redacted": None}),
    ("FollowUp", {"dissatisfied": False, "text_redacted": ""}),
    ("FollowUp", {"text_redacted": "é" * 16_384}),  # 32 KiB of UTF-8: beyond the stack buffer
    ("FollowUp", {"text_redacted": "\u2028\u2029\ufeff\U0010ffff" * 100}),
    ("ClarifyingQuestion", {"question_chars": None}),
    ("ClarifyingQuestion", {"question_chars": 0, "org_id": "o" * 128, "producer": {"name": "é" * 64, "version": "\"1\""}}),
])
def test_edge_values_are_byte_identical(name: str, changes: dict[str, Any]) -> None:
    same_bytes(_with(EVENTS_BY_TYPE[name][0], **changes))


@compiled
@settings(max_examples=300, deadline=None)
@given(text=st.none() | st.text(max_size=2_000), flag=st.none() | st.booleans(), n=st.none() | st.integers(0, 2**31 - 1),
       score=st.floats(0.0, 1.0), score2=st.floats(0.0, 1.0).map(lambda x: round(x, 4)), ident=st.text(min_size=1, max_size=64))
def test_random_values_are_byte_identical(text: str | None, flag: bool | None, n: int | None, score: float, score2: float,
                                          ident: str) -> None:
    follow = _with(EVENTS_BY_TYPE["FollowUp"][0], text_redacted=text, dissatisfied=flag, event_id=ident)
    check = _with(EVENTS_BY_TYPE["PersistenceCheck"][0], surviving_chars=n, branch_changed=flag, survival_score=score,
                  revert_score=score2, edit_id=ident)
    for event in (follow, check):
        same_bytes(event)


@compiled
@pytest.mark.parametrize("changes", [
    {"status": "weird"}, {"duration_ms": "12"}, {"duration_ms": True}, {"duration_ms": 2**64}, {"duration_ms": -(2**63) - 1},
    {"duration_ms": 3.0}, {"ts": 1.5e12}, {"producer": None}, {"producer": {"name": "n", "version": "v"}},
    {"error_kind": b"bytes"}, {"tool": "lone \ud800 surrogate"}, {"call_id": None}, {"event_id": 7},
])
def test_unvalidated_models_give_the_pure_writers_result_or_exception(changes: dict[str, Any]) -> None:
    """model_construct skips validation: the compiled writer falls back to the pure one, never writes other bytes."""
    base = EVENTS_BY_TYPE["ToolCall"][0]
    same_bytes(type(base).model_construct(**{**base.__dict__, **changes}))


class Unregistered(BaseModel):
    name: str
    version: str


@compiled
def test_nested_values_of_unregistered_types_go_to_the_pure_writer() -> None:
    base = EVENTS_BY_TYPE["ToolCall"][0]
    fields = {**base.__dict__, "producer": Unregistered(name="n", version="v")}
    assert AVRO.writers["ToolCall"](fields) == PURE_AVRO["ToolCall"](fields)
    assert JSON.writers["ToolCall"](fields) == _json_piece(fields)


@compiled
def test_a_field_missing_from_the_dict_falls_back() -> None:
    base = EVENTS_BY_TYPE["UserAction"][0]
    fields = {k: v for k, v in base.__dict__.items() if k != "action"}
    with pytest.raises(KeyError):
        AVRO.writers["UserAction"](fields)
    reordered = dict(reversed(list(base.__dict__.items())))  # another key order: learned again, same bytes
    assert AVRO.writers["UserAction"](reordered) == PURE_AVRO["UserAction"](base.__dict__)
    assert AVRO.writers["UserAction"](base.__dict__) == PURE_AVRO["UserAction"](base.__dict__)


@compiled
def test_floats_with_json_text_of_their_own_are_orjsons() -> None:
    values = [0.0, -0.0, 1.0, 0.5, 1e-4, 9.99999e-5, 1e-5, 2.5e-5, 1e-7, 1e7, 9_999_999.999999, 1e15, 1e16, 1.7976931348623157e308,
              5e-324, math.nan, math.inf, -math.inf, 123456.789, 0.1 + 0.2]
    writer = JSON.writers["FollowUp"]
    for value in values:
        assert writer({"x": value, "y": -value}) == orjson.dumps({"x": value, "y": -value})


@compiled
@settings(max_examples=500, deadline=None)
@given(value=st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1e7, 1e7).map(lambda x: round(x, 6)),
       n=st.integers(-(2**70), 2**70), text=st.text())
def test_json_of_any_float_int_and_text_is_orjsons(value: float, n: int, text: str) -> None:
    writer = JSON.writers["FollowUp"]
    fields = {"f": value, "n": n, text: text, "nested": {"t": [text] if n % 2 else text}}
    try:
        expected = orjson.dumps(fields)
    except orjson.JSONEncodeError:
        with pytest.raises(orjson.JSONEncodeError):
            writer(fields)
        return
    assert writer(fields) == expected


@compiled
@settings(max_examples=300, deadline=None)
@given(n=st.integers(-(2**63), 2**63 - 1), x=st.floats(), raw=st.binary(max_size=3_000), tail=st.none() | st.text(max_size=20),
       color=st.sampled_from([None, "red", "green"]), flag=st.sampled_from([None, True, False]), d=st.floats())
def test_generic_schema_matches_fastavro(n: int, x: float, raw: bytes, tail: str | None, color: str | None,
                                         flag: bool | None, d: float) -> None:
    """Negative and huge longs, float32 (overflow falls back and raises like the pure writer), bytes, null second."""
    from rewardflow.client.avro_compiler import compile_writer

    speedups._ext.add_models((Inner,))  # nested values of unregistered types go to the pure writer
    pure = compile_writer(GENERIC)
    writer = speedups.avro_writer(GENERIC, pure)
    assert writer is not None
    value = Outer(n=n, inner=Inner(x=x, raw=raw), maybe=Inner(x=1.5, raw=b"") if n % 2 else None, tail=tail, color=color,
                  flag=flag, d=d)
    try:
        expected = pure(value.__dict__)
    except OverflowError:  # a double beyond float32's range (fastavro rounds some of those to float32's max)
        with pytest.raises(OverflowError):
            writer(value.__dict__)
        return
    assert writer(value.__dict__) == expected == fastavro_bytes(GENERIC, value.model_dump())


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_records_of_compiled_pieces_decode_back(fmt: str) -> None:
    encoder = AVRO if fmt == "avro" else JSON
    sessions: dict[str, list[Envelope]] = {}
    for event in EVENTS:
        sessions.setdefault(event.session_id, []).append(event)
    for events in list(sessions.values())[:40]:
        value = encoder.record(encoder.head("b-1", events[0].session_id), [encoder.piece(e) for e in events])
        assert [validate_event(raw) for raw in decode_record(value, encoder.headers)] == events  # type: ignore[arg-type]
        if fmt == "avro":
            assert value == encode_avro([e.model_dump() for e in events], batch_id="b-1")
        else:
            assert orjson.loads(value)["events"] == orjson.loads(encode_json([e.model_dump() for e in events]))["events"]


def test_without_the_extension_the_pure_writers_are_used_with_a_notice() -> None:
    """A subprocess with REWARDFLOW_PURE_PYTHON=1 (as if the extension were not built): same records, a logged notice."""
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        "from rewardflow.client import speedups\n"
        "from rewardflow.client.encoding import AvroBatchEncoder, JsonBatchEncoder\n"
        "from rewardflow.events.samples import sample_events\n"
        "assert not speedups.AVAILABLE, speedups.status()\n"
        "events = sample_events(300, seed=17)\n"
        "out = []\n"
        "for enc in (AvroBatchEncoder(), JsonBatchEncoder()):\n"
        "    assert all(not hasattr(w, '__self__') or type(w.__self__).__name__ not in ('AvroWriter', 'JsonWriter')"
        " for w in enc.writers.values())\n"
        "    out.append(b''.join(enc.piece(e) for e in events).hex())\n"
        "print(' '.join(out))\n"
    )
    env = {**os.environ, "REWARDFLOW_PURE_PYTHON": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "using the pure-Python event writers" in proc.stderr and "REWARDFLOW_PURE_PYTHON is set" in proc.stderr
    events = sample_events(300, seed=17)
    avro_hex, json_hex = proc.stdout.split()
    assert bytes.fromhex(avro_hex) == b"".join(AVRO.piece(e) for e in events)
    assert bytes.fromhex(json_hex) == b"".join(JSON.piece(e) for e in events)


def test_notice_is_logged_once_when_the_extension_is_missing(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(speedups, "_ext", None)
    monkeypatch.setattr(speedups, "_noticed", False)
    with caplog.at_level(logging.WARNING, logger="rewardflow.client.speedups"):
        assert speedups.json_writer(_json_piece, (Producer,)) is None
        assert speedups.avro_writer(default_catalogue().writer("ToolCall").parsed, lambda f: b"") is None
        lock, batch_type = speedups.lock_and_batch_type()
    assert len([r for r in caplog.records if "pure-Python event writers" in r.getMessage()]) == 1
    assert type(lock) is type(threading.Lock()) and batch_type.__name__ == "SessionBatch"


@compiled
def test_the_extension_lock_behaves_like_threading_lock() -> None:
    lock, _ = speedups.lock_and_batch_type()
    assert lock.acquire() is True and lock.locked()
    assert lock.acquire(blocking=False) is False
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    with lock:
        assert lock.locked()
        got: list[bool] = []
        worker = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False)))
        worker.start()
        worker.join()
        assert got == [False]
    assert not lock.locked()
    counter = [0]

    def bump() -> None:
        for _ in range(20_000):
            with lock:
                counter[0] += 1

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter[0] == 80_000


@compiled
def test_the_extension_batch_has_the_session_batch_fields() -> None:
    _, batch_type = speedups.lock_and_batch_type()
    batch = batch_type("s-1", b"s-1", b"head", 12.5, 1_000, 3)
    assert (batch.session_id, batch.key, batch.head, batch.opened, batch.room, batch.left, batch.pieces, batch.count) == (
        "s-1", b"s-1", b"head", 12.5, 1_000, 3, [], 0)
    batch.pieces.append(b"x")
    batch.room -= 10
    batch.left -= 1
    assert (batch.count, batch.room, batch.left) == (1, 990, 2)


# --- memory-safety regressions (audit 2026-11-29) -------------------------------------------------------------


class _Plain:
    """A registered model type whose instance dict does not exist until first read (3.11: attributes inline)."""

    def __init__(self, **values: Any) -> None:
        for k, v in values.items():
            setattr(self, k, v)


def _collect_inside(call: Any, victim: dict[str, Any], key: str) -> list[bool]:
    """Call ``call()`` when a garbage collection is due at its first GC allocation; a finaliser then replaces
    ``victim[key]`` (freeing the value the C code may hold borrowed). Returns whether it ran inside the call."""
    import gc

    ran_inside: list[bool] = []
    inside = [False]

    class Bomb:
        def __del__(self) -> None:
            ran_inside.append(inside[0])
            victim[key] = "".join(["replaced", "!" * 40])

    threshold = gc.get_threshold()
    gc.disable()
    try:
        keep: list[dict[str, Any]] = [{} for _ in range(200)]  # empty the dict free list: the next dict is a GC allocation
        bomb = Bomb()
        bomb.me = bomb  # type: ignore[attr-defined]
        del bomb
        gc.set_threshold(1)
        gc.enable()
        inside[0] = True
        call()
        inside[0] = False
    finally:
        inside[0] = False
        gc.set_threshold(*threshold)
        gc.enable()
        del keep
    gc.collect()
    return ran_inside


_NO_COLLECTION_IN_AVRO = """
import gc
from rewardflow.client import speedups
from tests.client.test_speedups import _Plain, _collect_inside
speedups._ext.add_models((_Plain,))
program = (speedups.OP_RECORD, None, None, (
    (speedups.OP_RECORD, "inner", None, ((speedups.OP_LONG, "x", None, (), 0),), 0),
    (speedups.OP_STRING, "s", None, (), 0)), 0)
writer = speedups._ext.AvroWriter(program, lambda f: b"fallback")
for i in range(20):
    text = "".join(["v", "a" * 300, str(i)])
    fields = {"inner": _Plain(x=5), "s": text}
    out = []
    assert _collect_inside(lambda: out.append(writer.encode(fields)), fields, "s") == [False], "collected inside"
    assert out == [b"\\x0a" + bytes([len(text) << 1 & 0x7F | 0x80, len(text) >> 6]) + text.encode()], out
print("ok")
"""


@compiled
def test_no_collection_runs_while_the_writers_hold_borrowed_values() -> None:
    """Materialising a nested model's __dict__ could start a collection whose finaliser freed a later field's
    value while the Avro writer held it borrowed (heap-use-after-free under ASAN; so: in a subprocess)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", _NO_COLLECTION_IN_AVRO], capture_output=True, text=True, timeout=300,
                          check=False, cwd=root, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [p for p in (os.environ.get("PYTHONPATH"), root) if p])})
    assert proc.returncode == 0 and proc.stdout.split() == ["ok"], proc.stderr[-2000:]


@compiled
def test_no_collection_runs_between_the_emit_cores_capture_and_its_use() -> None:
    """The JSON writer captures session_id borrowed; a later nested model's __dict__ must not run a finaliser."""
    speedups._ext.add_models((_Plain,))
    writer = speedups._ext.JsonWriter((_Plain,), _json_piece)
    lock = speedups._ext.Lock()
    for i in range(20):
        sid = "".join(["s", str(i), "x" * 40])
        event = _Plain(event_type="T", session_id=sid, nested=_Plain(y=1))
        batch = speedups._ext.Batch(sid, b"k", b"h", 0.0, 10_000, 10)
        core = speedups._ext.EmitCore({_Plain: writer}, {"T": writer}, {sid: batch}, lock, 1, 100)
        del sid
        got: list[Any] = []
        event.__dict__["nested"] = _Plain(y=1)  # (the event's own dict exists; the nested one does not)
        assert _collect_inside(lambda: got.append(core.try_emit(event)), event.__dict__, "session_id") == [False]
        assert got == [None] and batch.count == 1


@compiled
def test_the_emit_core_holds_the_lock_while_it_appends() -> None:
    """A str-subclass session id in the open batches makes the core's lookup run Python (its __eq__): no other
    taker may get the lock meanwhile (the core used to read the lock's flag instead of taking it)."""
    lock = speedups._ext.Lock()
    could_take: list[bool] = []

    class Sid(str):
        def __eq__(self, other: object) -> bool:
            got = lock.acquire(blocking=False)
            could_take.append(got)
            if got:
                lock.release()
            return False

        __hash__ = str.__hash__

    speedups._ext.add_models((_Plain,))
    write = lambda fields: b"piece"  # noqa: E731
    batch = speedups._ext.Batch("s1", b"k", b"h", 0.0, 1_000, 10)
    open_batches = {Sid("s1"): speedups._ext.Batch("s1", b"k", b"h", 0.0, 1_000, 10), "s1": batch}
    could_take.clear()
    core = speedups._ext.EmitCore({_Plain: write}, {"T": write}, open_batches, lock, 1, 100)
    assert core.try_emit(_Plain(event_type="T", session_id="s1")) is None and batch.count == 1
    assert could_take and not any(could_take) and not lock.locked()  # (how often __eq__ runs is CPython's business)


@compiled
def test_a_failed_reinitialisation_leaves_the_writer_working() -> None:
    """It used to leave the op tree half cleared: a segfault on the next encode (so: in a subprocess)."""
    code = (
        "from rewardflow.client import speedups as s\n"
        "program = (s.OP_RECORD, None, None, ((s.OP_STRING, 's', None, (), 0),), 0)\n"
        "writer = s._ext.AvroWriter(program, lambda f: b'fallback')\n"
        "try:\n"
        "    writer.__init__((s.OP_RECORD, None, None, ((99, 's', None, (), 0),), 0), lambda f: b'')\n"
        "except ValueError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('no ValueError')\n"
        "print(writer.encode({'s': 'x'}).hex(), writer.encode({}).hex())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [b"\x02x".hex(), b"fallback".hex()]


@compiled
def test_malformed_programs_and_separators_are_refused() -> None:
    fallback = lambda f: b""  # noqa: E731
    optional = (speedups.OP_OPTIONAL, "o", None, ((speedups.OP_STRING, None, None, (), 0),), 2)
    with pytest.raises(ValueError):
        speedups._ext.AvroWriter((speedups.OP_RECORD, None, None, (optional,), 0), fallback)

    class Sym(str):
        pass

    enum = (speedups.OP_ENUM, "e", {Sym("A"): b"\x00"}, (), 0)
    with pytest.raises(TypeError):
        speedups._ext.AvroWriter((speedups.OP_RECORD, None, None, (enum,), 0), fallback)
    with pytest.raises(ValueError):
        speedups._ext.EmitCore({}, {}, {}, speedups._ext.Lock(), -1, 100)


_REINIT_FROM_A_KEYS_EQ = """
from rewardflow.client import _speedups as S
class Ev:
    def __init__(self, sid): self.event_type = "T"; self.session_id = sid
S.add_models((Ev,))
lock = S.Lock(); write = lambda f: b"piece"
armed = [False]
class Sid(str):
    def __eq__(self, other):
        if armed[0]:
            armed[0] = False
            core.__init__({Ev: write}, {"T": write}, {}, lock, 1, 100)  # frees the open dict being searched
        return False
    __hash__ = str.__hash__
core = S.EmitCore({Ev: write}, {"T": write}, {Sid("s1"): 1, "s1": S.Batch("s1", b"k", b"h", 0.0, 1000, 10)}, lock, 1, 100)
armed[0] = True
print(core.try_emit(Ev("s1")))
"""


@compiled
def test_the_emit_core_keeps_the_open_batches_alive_while_it_searches_them() -> None:
    """A key's __eq__ re-initialising the core freed the dict under the lookup (use after free; so: a subprocess)."""
    proc = subprocess.run([sys.executable, "-c", _REINIT_FROM_A_KEYS_EQ], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.split() == ["b'piece'"], proc.stderr[-2000:]
