"""Hostile and broken producers against a real worker and broker (docs/trust.md).

Each test sends what an attacker, a skewed clock or a buggy client could send next
to honest traffic and checks that the honest sessions' rewards are untouched, the
bad input is dead-lettered with its reason, and the worker keeps running. Horizons
of 1 and 2 s let honest turns run in real time: their signals are sent when their
event time comes, so the broker's clock (LogAppendTime) never sees them early.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from rewardflow.kafka import topics as T
from rewardflow.kafka.provision import changelog_topic
from tests.factories import ev
from tests.streams.kafka_io import avro_record, json_record, read_raw
from tests.streams.replay import on_wire, replay, rows_by_id

pytestmark = pytest.mark.kafka
REAL_TIME = {"horizons_s": [1, 2], "grace_ms": 1_000, "allowed_lateness_ms": 500, "max_clock_skew_ms": 500,
             "window_sizes_s": [60]}


def now_ms() -> int:
    return int(time.time() * 1000)


def opening(rid: str, sid: str, t: int) -> list[dict[str, Any]]:
    """A turn's first events: served, one edit, one tool call."""
    return [ev("InferenceServed", rid, sid, t), ev("AgentEdit", rid, sid, t + 100, edit_id=f"{rid}-ed"),
            ev("ToolCall", rid, sid, t + 200, call_id=f"{rid}-c")]


def closing(rid: str, sid: str, t: int) -> list[dict[str, Any]]:
    """The same turn's checks at 1 and 2 s after its edit (send them once that time has come)."""
    return [ev("PersistenceCheck", rid, sid, t + 100 + h * 1000, edit_id=f"{rid}-ed", horizon_s=h, survival_score=0.8)
            for h in (1, 2)]


def wait_until(t_ms: int) -> None:
    time.sleep(max(0.0, (t_ms - now_ms()) / 1000 + 0.05))


def test_future_events_and_forged_ticks_leave_other_sessions_untouched_across_a_kill(deploy: Any) -> None:
    # idle ticks after 3 s (capped at the broker's clock) finalise the turns once their signals are in
    d = deploy(**REAL_TIME, idle_timeout_s=3.0, idle_clock_rate=50.0)
    t0 = now_ms()
    sessions = [(f"r{i}", f"s{i}", i % 2) for i in range(10)]
    d.raw.send_many([(p, *json_record(*opening(rid, sid, t0))) for rid, sid, p in sessions])
    attacks = [  # (partition, value, headers, reason code) on both partitions, beside the open turns
        (0, *json_record(ev("InferenceServed", "evil-1", "evil", 4_070_908_800_000)), "future_ts"),  # 2099
        (1, *json_record(ev("UserAction", "evil-2", "evil2", now_ms() + 262_000, action="undo")), "future_ts"),
        (0, orjson.dumps({"wm": 4_102_444_799_999}), [("rf-format", b"tick")], "forged_tick"),
        (1, orjson.dumps({"wm": 18_446_744_073_709_551_615}), [("rf-format", b"tick")], "forged_tick"),
    ]
    offsets = d.raw.send_many([(p, v, h) for p, v, h, _ in attacks])
    out = d.out.until(lambda o: len(o.rows[T.DEADLETTERS]) >= len(attacks), 20, "the attacks' dead letters")
    got = {(r["source_partition"], r["source_offset"]): r["reason_code"] for r in out.rows[T.DEADLETTERS]}
    assert got == {(p, off): code for (p, _, _, code), off in zip(attacks, offsets, strict=True)}

    # the users' rejects, a second after the turns: they count (nothing was finalised by the attacks)
    wait_until(t0 + 1_000)
    d.raw.send_many([(p, *json_record(ev("UserAction", rid, sid, now_ms(), action="reject"))) for rid, sid, p in sessions])
    wait_until(t0 + 2_200)
    d.raw.send_many([(p, *json_record(*closing(rid, sid, t0))) for rid, sid, p in sessions])
    d.worker.kill()  # a restart in the middle of all this
    d.worker.restart(60)
    t1 = now_ms()  # fresh traffic after the attacks is on time
    fresh = [(f"n{i}", f"s{i}", i % 2) for i in range(10)]
    d.raw.send_many([(p, *json_record(*opening(rid, sid, t1))) for rid, sid, p in fresh])
    wait_until(t1 + 2_200)
    d.raw.send_many([(p, *json_record(*closing(rid, sid, t1))) for rid, sid, p in fresh])

    n_specs = 2
    out = d.out.until(lambda o: len({(r["spec_version"], r["sample_id"]) for r in o.finals()}) >= 20 * n_specs,
                      60, "every honest turn final")
    assert out.rows[T.LATE] == [], out.rows[T.LATE][:3]
    finals = {(r["spec_version"], r["sample_id"]): r for r in out.finals()}
    assert {rid for _, rid in finals} == {rid for rid, _, _ in sessions + fresh}
    assert all(r["n_reject"] == 1 and r["checked"] for k, r in finals.items() if k[1].startswith("r"))
    # and the worker gave what one uninterrupted run of the same raw topic gives
    truth = rows_by_id(T.REWARDS, on_wire(replay(d.settings, read_raw(d.settings)).rewards))
    got_rows = rows_by_id(T.REWARDS, out.rows[T.REWARDS])
    assert got_rows.keys() == truth.keys()
    for rid, rows in got_rows.items():
        assert all(r == truth[rid][0] for r in rows), rid
    assert d.worker.alive


def test_a_session_of_six_thousand_turns_is_capped_and_the_worker_runs_on(deploy: Any) -> None:
    """12 records of 500 turns each, every record within the limits: the state stays bounded."""
    d = deploy(**REAL_TIME, max_record_bytes=1_000_000, max_session_turns=1_000)
    t0 = now_ms() - 60_000
    records = [(0, *json_record(*[ev("InferenceServed", f"big-{k}-{i}", "big", t0 + k * 500 + i) for i in range(500)]))
               for k in range(12)]
    d.raw.send_many(records)
    honest = opening("h1", "honest", now_ms())
    d.raw.send_many([(0, *json_record(*honest))])
    out = d.out.until(lambda o: sum(r["reason_code"] == "session_turn_limit" for r in o.rows[T.DEADLETTERS]) >= 5_000
                      and sum(r["session_id"] == "big" for r in o.rows[T.VALID]) >= 1_000, 60, "the big session's records")
    assert sum(r["session_id"] == "big" for r in out.rows[T.VALID]) == 1_000
    assert {r["reason_code"] for r in out.rows[T.DEADLETTERS]} == {"session_turn_limit"}
    wait_until(honest[0]["ts"] + 2_200)
    d.raw.send_many([(0, *json_record(*closing("h1", "honest", honest[0]["ts"])))])
    d.out.until(lambda o: len(o.finals("h1")) == 2, 30, "the honest turn beside the big session")
    assert d.worker.alive


def test_a_record_that_makes_the_core_raise_is_dead_lettered_and_the_worker_goes_on(
        deploy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RF_FAULT_RAISE_ON_REQUEST", "poison")  # applying an event of this turn raises
    d = deploy(**REAL_TIME)
    t0 = now_ms()
    before = opening("a1", "sa", t0)
    poison = [ev("InferenceServed", "ok-part", "sp", t0), ev("ToolCall", "poison", "sp", t0)]
    after = opening("b1", "sb", t0)
    offsets = d.raw.send_many([(0, *json_record(*before)), (0, *json_record(*poison)), (0, *json_record(*after))])
    wait_until(t0 + 2_200)
    d.raw.send_many([(0, *json_record(*closing("a1", "sa", t0))), (0, *json_record(*closing("b1", "sb", t0)))])
    out = d.out.until(lambda o: len(o.finals("a1")) == 2 and len(o.finals("b1")) == 2, 30, "the turns around it")
    (letter,) = out.rows[T.DEADLETTERS]
    assert (letter["source_offset"], letter["index"], letter["reason_code"]) == (offsets[1], -1, "processing_error")
    assert "RuntimeError" in letter["reason"]
    assert not [r for r in out.rows[T.VALID] if r["session_id"] == "sp"]  # nothing of the failed record stays
    assert d.worker.alive


def test_an_event_whose_dead_letter_would_be_six_times_its_record_is_refused_and_the_worker_goes_on(
        deploy: Any) -> None:
    """An Avro record of 900 KB whose one event is random control characters: as JSON, for its dead letter,
    it is six times as large, and no compression brings it under what the dead-letter topic takes. The
    dead letter carries as much of it as the raw topic takes instead, and the turns after it are scored."""
    d = deploy(**REAL_TIME, max_record_bytes=1_000_000)
    t0 = now_ms()
    rng = random.Random(5)
    bomb = ev("FollowUp", "r-bomb", "s-bomb", t0, text_redacted="".join(chr(rng.randrange(1, 32)) for _ in range(900_000)))
    after = opening("b1", "sb", t0)
    offsets = d.raw.send_many([(0, *avro_record(bomb)), (0, *json_record(*after))])
    wait_until(t0 + 2_200)
    d.raw.send_many([(0, *json_record(*closing("b1", "sb", t0)))])
    out = d.out.until(lambda o: len(o.finals("b1")) == 2, 30, "the turn after it")
    (letter,) = out.rows[T.DEADLETTERS]
    assert (letter["source_offset"], letter["reason_code"]) == (offsets[0], "invalid_event")
    assert "[original cut to its first 1,065,536 of " in letter["reason"]  # what the raw topic takes
    assert d.worker.alive


@pytest.mark.parametrize("commits", ["taken", "refused"])
def test_a_backlog_of_a_session_at_its_limits_is_committed_in_parts_and_its_state_stays_bounded(
        deploy: Any, monkeypatch: pytest.MonkeyPatch, commits: str) -> None:
    """Five minutes of a session's turns, one a second among other traffic, waiting for a worker that was
    down: every turn it expires while catching up is kept until the commit passes it, so the worker stops
    and commits whenever the session holds its limits' worth of them. No stored state of the session holds
    more, and the rewards are those of one uninterrupted replay of the raw topic. When the broker refuses
    the commits, the worker waits for one such commit, then goes on without stopping (its state grows
    instead), and its rewards are the same."""
    if commits == "refused":
        monkeypatch.setenv("RF_FAULT_FAIL_COMMITS_FROM", "0:1")  # offset 0 is the probe: its commit (to 1) goes through
    d = deploy(horizons_s=[1, 2], grace_ms=1_000, allowed_lateness_ms=500, max_clock_skew_ms=500, window_sizes_s=[5],
               tombstone_ms=5_000, dedup_horizon_ms=5_000, max_turn_span_ms=5_000, correction_window_ms=0,
               max_session_turns=3, max_session_events=30, idle_timeout_s=2.0)
    settings, raw = d.settings, d.settings.topic(T.RAW)
    d.worker.kill()
    # the backlog, as it would have been appended over those minutes (the raw topic stamps LogAppendTime)
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    stamp = ConfigResource(ConfigResource.Type.TOPIC, raw, incremental_configs=[
        ConfigEntry("message.timestamp.type", "CreateTime", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([stamp])[stamp].result(timeout=30)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    t0 = now_ms() - 300_000
    for k in range(300):  # and the other sessions of its partition, whose events move its watermark
        for sid in ("big", f"other{k}"):
            value, headers = json_record(ev("InferenceServed", f"{sid}-{k}", sid, t0 + k * 1_000))
            producer.produce(raw, value, partition=0, headers=headers, timestamp=t0 + k * 1_000)
    assert producer.flush(30) == 0
    d.worker.restart(60)

    out = d.out.until(lambda o: len({r["sample_id"] for r in o.finals()}) >= 300, 60, "the backlog's rewards")
    out = d.out.settle(quiet=3.0, timeout=60)
    truth = rows_by_id(T.REWARDS, on_wire(replay(settings, read_raw(settings)).rewards))
    got = rows_by_id(T.REWARDS, out.rows[T.REWARDS])
    assert got.keys() == truth.keys()
    assert all(r == truth[rid][0] for rid, rows in got.items() for r in rows)
    assert {r["reason_code"] for r in out.rows[T.DEADLETTERS]} == {"session_turn_limit"}

    states = [orjson.loads(v) for v in _changelog_values(settings)]
    held = [len(s[6]) for s in states if isinstance(s, list) and len(s) > 6 and s[0] == "big"]
    if commits == "taken":
        assert held and max(held) <= settings.max_session_turns, held
    else:
        assert d.worker.log_tail().count("going on uncommitted") == 1
        assert max(held) > settings.max_session_turns  # (what the stops bound while commits pass)
    assert d.worker.alive


def _changelog_values(settings: Any) -> list[bytes]:
    """Every value in the worker's state changelog (deletes left out)."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    topic = changelog_topic(settings)
    try:
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(settings.partitions)]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in parts}
        consumer.assign(parts)
        values, deadline = [], time.monotonic() + 30
        while any(ends.values()) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            if msg.value() is not None:
                values.append(msg.value())
            if msg.offset() + 1 >= ends[msg.partition()]:
                ends[msg.partition()] = 0
        assert not any(ends.values()), "the changelog was not read to its end"
        return values
    finally:
        consumer.close()
