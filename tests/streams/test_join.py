"""The worker's event-time join on a real broker: disorder, lateness and the grace deadline."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from rewardflow.kafka import topics as T
from rewardflow.events.wire import decode_record
from tests.factories import T0, ev, turn
from tests.streams.kafka_io import avro_record, json_record, tick_record
from tests.streams.scenario import expected_finals, strip_timing, varied_turn

pytestmark = pytest.mark.kafka


def _by_spec(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["spec_version"]: r for r in rows}


def test_turns_arriving_out_of_order_within_lateness_get_the_in_order_outcome(deploy: Any) -> None:
    d = deploy()
    hz, rng = list(d.settings.horizons_s), random.Random(7)
    turns: dict[str, list[dict[str, Any]]] = {}
    for i in range(10):  # two turns per session; served 100 ms apart, so no turn settles before the last arrives
        sid = f"s{i // 2}"
        turns[f"r{i}"] = varied_turn(rng, f"r{i}", sid, T0 + 100 * i, hz, checkpoint=f"ck-{i % 3}")
    records = []
    for partition in (0, 1):
        sessions = {}
        for rid, events in turns.items():
            if int(events[0]["session_id"][1:]) % 2 == partition:
                sessions.setdefault(events[0]["session_id"], []).extend(events)
        pending = []
        for events in sessions.values():
            rng.shuffle(events)
            while events:  # a session's events in batches of 1-4, JSON or Avro
                n = rng.randint(1, 4)
                pending.append(events[:n])
                del events[:n]
        rng.shuffle(pending)
        for k, batch in enumerate(pending):
            value, headers = (json_record if k % 2 else avro_record)(*batch)
            records.append((partition, value, headers))
    arrival = [e["ts"] for _, value, headers in records for e in decode_record(value, headers)]
    assert sum(a > b for a, b in zip(arrival, arrival[1:])) > len(arrival) // 4  # really out of order
    d.raw.send_many(records)

    n_events, n_specs = sum(len(e) for e in turns.values()), 2
    out = d.out.until(lambda o: len(o.finals()) == len(turns) * n_specs, 30, "every turn's final rewards")
    assert len(out.rows[T.VALID]) == n_events
    assert out.rows[T.LATE] == [] and out.rows[T.DEADLETTERS] == [] and out.rows[T.EXCLUSIONS] == []
    settle = d.settings.horizons_s[-1] * 1000 + d.settings.grace_ms
    for rid, events in turns.items():
        got = _by_spec(out.finals(rid))
        assert {v: strip_timing(r) for v, r in got.items()} == expected_finals(events, d.settings), rid
        anchor = max(e["ts"] for e in events if e["event_type"] in ("InferenceServed", "AgentEdit"))
        assert all(r["finalised_wm"] >= anchor + settle for r in got.values())


def test_late_events_are_routed_to_the_late_topic_and_counted(deploy: Any) -> None:
    d = deploy(correction_window_ms=0)  # (corrections: tests/streams/test_corrections.py)
    hz = tuple(d.settings.horizons_s)
    first = {"r1": turn("r1", "s1", horizons=hz), "r2": turn("r2", "s1", ts=T0 + 200, horizons=hz)}
    d.raw.send_many([(0, *json_record(*first["r1"])), (0, *avro_record(*first["r2"]))])
    d.out.until(lambda o: len(o.finals()) == 4, 20, "r1 and r2 final")  # the idle clock settles them
    before = {r["reward_id"]: r for r in d.out.finals()}

    late = [
        ev("FollowUp", "r1", "s1", T0 + 5_000, dissatisfied=True),  # its turn is final: routed, not counted in
        ev("UserAction", "r2", "s1", T0 + 3_000, action="undo"),
        ev("InferenceServed", "r-old", "s1", T0),  # a turn too old to open
    ]
    fresh = ev("InferenceServed", "r-new", "s1", T0 + 3_600_000)  # same batch, on time
    offsets = d.raw.send_many([(0, *json_record(late[0])), (0, *avro_record(late[1])),
                               (0, *json_record(late[2], fresh))])
    out = d.out.until(lambda o: len(o.rows[T.LATE]) >= 3, 20, "three late rows").settle(1.0)

    rows = {r["event_id"]: r for r in out.rows[T.LATE]}
    assert len(out.rows[T.LATE]) == len(rows) == 3  # each late event routed once
    assert set(rows) == {e["event_id"] for e in late}
    for e in late:
        row = rows[e["event_id"]]
        assert row["reason"] == "late" and row["request_id"] == e["request_id"]
        assert row["event_type"] == e["event_type"] and row["ts"] == e["ts"] and row["source_partition"] == 0
        payload = orjson.loads(row["payload"])  # Avro decoding adds the optional fields as null
        assert {k: v for k, v in payload.items() if v is not None} == e
        assert row["watermark"] > e["ts"] + d.settings.horizons_s[-1] * 1000
    assert rows[late[0]["event_id"]]["checkpoint_id"] == "ck-a"  # known from the finalised turn
    assert rows[late[2]["event_id"]]["checkpoint_id"] == "ck-a"  # never opened, but a served event names its own
    valid = [r for r in out.rows[T.VALID] if r["source_offset"] in offsets]
    assert [r["event_id"] for r in valid] == [fresh["event_id"]]
    assert {r["reward_id"]: r for r in out.finals() if r["sample_id"] in first} == before  # unchanged


def test_no_turn_is_concluded_before_its_last_horizon_plus_grace(deploy: Any) -> None:
    # No idle clock during this test: the watermark moves only with the ticks the test sends.
    d = deploy(idle_timeout_s=120.0, grace_ms=5_000, correction_window_ms=0)
    hz = list(d.settings.horizons_s)
    events = turn("r1", "s1", horizons=tuple(hz))
    anchor = T0 + 1000  # the edit is the turn's latest served/edit event
    deadline = anchor + hz[-1] * 1000 + d.settings.grace_ms
    d.raw.send(0, *json_record(*events))
    d.out.until(lambda o: len(o.rows[T.REWARDS]) == 2, 20, "provisional rewards at the first horizon")
    assert {(r["provisional"], r["horizon_s"]) for r in d.out.rows[T.REWARDS]} == {(1, hz[0])}

    def probe(wm: int, event: dict[str, Any]) -> None:
        """Move the watermark to ``wm``, then send ``event``; return once the worker has processed both."""
        d.raw.send_many([(0, *tick_record(wm, d.settings)), (0, *json_record(event))])
        d.out.until(lambda o: any(r["event_id"] == event["event_id"] for r in o.rows[T.VALID]), 20,
                    f"{event['event_type']} after watermark {wm}").settle(1.0)
        assert d.out.finals() == [], f"concluded early at watermark {wm} (deadline {deadline})"

    probe(anchor + hz[-1] * 1000, ev("ToolCall", "r1", "s1", anchor + hz[-1] * 1000, call_id="c2"))
    probe(deadline - 1, ev("FollowUp", "r1", "s1", deadline - 1, dissatisfied=True))  # just before: included

    d.raw.send(0, *tick_record(deadline, d.settings))
    out = d.out.until(lambda o: len(o.finals()) == 2, 20, "final rewards at the deadline")
    final = _by_spec(out.finals())
    for row in final.values():
        assert row["finalised_wm"] == deadline and row["finalised_by"] == "idle"
        assert row["n_dissatisfied"] == 1 and row["n_followups"] == 1 and row["n_tool_calls"] == 2
    assert final["v1"]["components"]["dissatisfied"] == -1.0
    assert strip_timing(final["v1"]) == expected_finals(events + [
        ev("ToolCall", "r1", "s1", anchor + hz[-1] * 1000, call_id="c2"),
        ev("FollowUp", "r1", "s1", deadline - 1, dissatisfied=True)], d.settings)["v1"]

    too_late = ev("FollowUp", "r1", "s1", deadline, dissatisfied=True)  # after the conclusion: late
    d.raw.send(0, *json_record(too_late))
    d.out.until(lambda o: [r["event_id"] for r in o.rows[T.LATE]] == [too_late["event_id"]], 20, "the late follow-up")
