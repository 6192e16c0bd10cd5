"""PartitionProcessor: event-time join, lateness, dedup, orphans, dead letters, state expiry."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardflow.core.config import DictStore, EncodedStore, JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import PartitionProcessor
from rewardflow.core.turn import TurnState
from rewardflow.events.validate import validate_event
from rewardflow.core.score import score
from tests.core.feed import CFG, JSON_H, SPECS, TICK_H, Feed, avro_record, json_record
from tests.factories import T0, ev, turn

HZ = (30, 120)
SETTLE = CFG.settle_ms  # 121_000
ANCHOR = T0 + 1000  # factories.turn: served at T0, edit at T0 + 1 s
DEADLINE = ANCHOR + SETTLE

TIMING_FIELDS = ("finalised_wm", "finalised_by")  # when and how a turn was finalised, not what


def expected_reward(raws: list[dict[str, Any]], spec_index: int = 0) -> dict[str, Any]:
    """The final reward computed directly from a turn's events, ignoring when it was finalised."""
    events = [validate_event(r) for r in raws]
    state = TurnState.start(events[0])
    for e in events:
        state.apply(e)
    rec = dict(score(state.outcome(list(HZ), HZ[-1], provisional=False, wm=0, by=""), SPECS[spec_index]))
    for k in TIMING_FIELDS:
        rec.pop(k)
    return rec


def strip_timing(rec: Any) -> dict[str, Any]:
    d = dict(rec)
    for k in TIMING_FIELDS:
        d.pop(k)
    return d


# ---------------------------------------------------------------- join and event time

def test_complete_turn_in_order_gives_one_final_reward_per_spec() -> None:
    f = Feed()
    for e in turn("r1", horizons=HZ):
        f.send(e)
    assert f.final() == []
    out = f.tick(DEADLINE)
    finals = [r for r in out.rewards if not r["provisional"]]
    assert sorted(r["spec_version"] for r in finals) == ["v1", "v2"]
    v1 = next(r for r in finals if r["spec_version"] == "v1")
    assert v1["finalised_wm"] == DEADLINE and v1["finalised_by"] == "idle"
    assert strip_timing(v1) == expected_reward(turn("r1", horizons=HZ))
    assert v1["n_edits"] == 1 and v1["persisted"] == {30: 1, 120: 1} and v1["n_accept"] == 1
    assert len(f.total.valid) == 6


def test_watermark_is_max_event_time_minus_lateness_and_never_goes_back() -> None:
    f = Feed()
    f.send(ev("FollowUp", "a", ts=T0 + 10_000))
    assert f.proc.wm == T0 + 10_000 - CFG.lateness_ms
    f.send(ev("FollowUp", "a", ts=T0))
    f.tick(T0)  # a tick behind the watermark does not move it back
    assert f.proc.wm == T0 + 10_000 - CFG.lateness_ms


@settings(max_examples=40, deadline=None)
@given(data=st.data(), spec_index=st.sampled_from([0, 1]))
def test_any_arrival_order_before_the_deadline_gives_the_correct_outcome(data: st.DataObject, spec_index: int) -> None:
    target = turn("r1", horizons=HZ, survival=data.draw(st.sampled_from([0.1, 0.9]))) + [
        ev("ToolCall", "r1", ts=T0 + 700, status="broken", call_id="c9"),
        ev("FollowUp", "r1", ts=T0 + 60_000, dissatisfied=True),
        ev("ClarifyingQuestion", "r1", ts=T0 + 300),
    ]
    # another session drives the watermark up to 50 s past some of r1's events, never past its deadline
    other = turn("q1", session_id="s2", ts=T0 + data.draw(st.integers(0, 20_000)), horizons=(30,))
    arrival = data.draw(st.permutations(target + other))
    f = Feed()
    batch = data.draw(st.integers(1, 4))
    for i in range(0, len(arrival), batch):
        f.send(*arrival[i:i + batch])
    assert f.total.late == [] and f.total.excluded == []
    f.tick(T0 + 10**6)
    (got,) = [r for r in f.final(SPECS[spec_index].version) if r["sample_id"] == "r1"]
    assert strip_timing(got) == expected_reward(target, spec_index)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_disorder_within_lateness_loses_nothing(seed: int) -> None:
    """Events delayed by less than the allowed lateness are never late, and every turn is exact."""
    rng = random.Random(seed)
    turns = {f"r{i}": turn(f"r{i}", session_id=f"s{i % 3}", ts=T0 + rng.randrange(0, 200_000), horizons=HZ,
                           survival=rng.random()) for i in range(8)}
    events = [e for evs in turns.values() for e in evs]
    arrival = sorted(events, key=lambda e: e["ts"] + rng.randrange(CFG.lateness_ms))
    f = Feed()
    i = 0
    while i < len(arrival):
        n = rng.randint(1, 3)
        f.send(*arrival[i:i + n])
        i += n
    f.tick(T0 + 10**6)
    assert f.total.late == [] and f.total.excluded == []
    got = {r["sample_id"]: strip_timing(r) for r in f.final()}
    assert got == {rid: expected_reward(evs) for rid, evs in turns.items()}


def test_event_older_than_watermark_still_counts_while_its_turn_is_open() -> None:
    f = Feed()
    f.send(*turn("r1", horizons=HZ)[:2])
    f.send(ev("FollowUp", "other", session_id="s2", ts=T0 + 100_000))  # wm jumps to T0 + 99.5 s
    out = f.send(ev("FollowUp", "r1", ts=T0 + 5000, dissatisfied=True))  # 94.5 s behind the watermark
    assert len(out.valid) == 1 and out.late == []
    f.tick(DEADLINE)
    assert f.final()[0]["n_dissatisfied"] == 1


# ---------------------------------------------------------------- no early conclusion

def test_nothing_final_is_concluded_before_anchor_plus_last_horizon_plus_grace() -> None:
    f = Feed()
    for e in turn("r1", horizons=(30,)):  # served, edit, tool, accept, check at 30 s (no 120 s check yet)
        f.send(e)
    f.tick(DEADLINE - 1)
    assert f.final() == [] and f.total.excluded == []
    provisional = [r for r in f.total.rewards if r["spec_version"] == "v1"]
    assert [(r["provisional"], r["horizon_s"]) for r in provisional] == [(1, 30)]
    assert provisional[0]["n_dissatisfied"] == 0 and 120 not in provisional[0]["checked"]
    # just before the deadline: the 120 s check and a dissatisfied follow-up still count
    late_but_in_time = f.send(
        ev("PersistenceCheck", "r1", ts=DEADLINE - 2, edit_id="r1-ed", horizon_s=120, survival_score=0.8),
        ev("FollowUp", "r1", ts=DEADLINE - 1, dissatisfied=True),
    )
    assert len(late_but_in_time.valid) == 2 and late_but_in_time.late == []
    assert f.final() == []
    out = f.tick(DEADLINE)
    (final,) = [r for r in out.rewards if r["spec_version"] == "v1"]
    assert final["provisional"] == 0 and final["horizon_s"] == 120
    assert final["n_dissatisfied"] == 1
    assert final["persisted"] == {30: 1, 120: 1} and final["persistence"][120] == 0.8


def test_an_event_that_moves_the_watermark_past_the_deadline_is_counted_first() -> None:
    f = Feed()
    f.send(*turn("r1", horizons=(30,)))
    out = f.send(ev("FollowUp", "r1", ts=DEADLINE + CFG.lateness_ms, dissatisfied=True))
    (final,) = [r for r in out.rewards if r["spec_version"] == "v1" and not r["provisional"]]
    assert final["n_dissatisfied"] == 1


def test_a_new_edit_moves_the_anchor_and_so_the_deadline() -> None:
    f = Feed()
    f.send(*turn("r1", horizons=HZ))
    f.send(ev("AgentEdit", "r1", ts=T0 + 50_000, edit_id="second"))
    f.tick(DEADLINE)
    assert f.final() == []
    f.tick(T0 + 50_000 + SETTLE - 1)
    assert f.final() == []
    f.tick(T0 + 50_000 + SETTLE)
    assert f.final()[0]["n_edits"] == 2


def test_provisional_outcomes_once_per_horizon_and_off_when_disabled() -> None:
    f = Feed()
    f.send(*turn("r1", horizons=HZ))
    f.tick(ANCHOR + 31_000)
    f.tick(ANCHOR + 40_000)
    f.tick(DEADLINE)
    v1 = [(r["provisional"], r["horizon_s"]) for r in f.total.rewards if r["spec_version"] == "v1"]
    assert v1 == [(1, 30), (0, 120)]
    ids = {r["reward_id"] for r in f.total.rewards}
    assert len(ids) == len(f.total.rewards)

    g = Feed(cfg=replace(CFG, provisional=False))
    g.send(*turn("r1", horizons=HZ))
    g.tick(ANCHOR + 31_000)
    g.tick(DEADLINE)
    assert [r["provisional"] for r in g.total.rewards] == [0, 0]


# ---------------------------------------------------------------- late events

def test_late_events_are_routed_and_counted_after_finalisation() -> None:
    f = Feed()
    f.send(*turn("r1", horizons=HZ))
    f.tick(DEADLINE)
    (final,) = f.final()
    late_fu = ev("FollowUp", "r1", ts=DEADLINE - 10, dissatisfied=True)
    out = f.send(late_fu)
    assert out.valid == [] and out.rewards == []
    (row,) = out.late
    assert row["reason"] == "late" and row["event_id"] == late_fu["event_id"]
    assert row["checkpoint_id"] == "ck-a" and row["request_id"] == "r1" and row["watermark"] == DEADLINE
    # a turn too old to start is late too; a served event names its own checkpoint, any other none
    out = f.send(ev("InferenceServed", "old", ts=DEADLINE - SETTLE - 1, checkpoint_id="ck-b"))
    assert [(r["reason"], r["checkpoint_id"]) for r in out.late] == [("late", "ck-b")]
    out = f.send(ev("FollowUp", "older", ts=DEADLINE - SETTLE - 1))
    assert [(r["reason"], r["checkpoint_id"]) for r in out.late] == [("late", "")]
    f.tick(DEADLINE + 10 * SETTLE)
    assert f.final() == [final]  # never revised
    assert len(f.total.late) == 3


def test_a_duplicate_is_attributed_to_its_turns_checkpoint() -> None:
    f = Feed()
    served = ev("InferenceServed", "r1", checkpoint_id="ck-b")
    edit = ev("AgentEdit", "r1", ts=T0 + 10)
    f.send(served, edit)
    out = f.send(edit)
    assert [(r["reason"], r["checkpoint_id"]) for r in out.excluded] == [("duplicate", "ck-b")]


def test_an_event_exactly_at_the_start_limit_still_opens_a_turn() -> None:
    f = Feed()
    f.tick(T0 + SETTLE)
    out = f.send(ev("InferenceServed", "edge", ts=T0))
    assert len(out.valid) == 1 and out.late == []
    assert [r["sample_id"] for r in out.rewards] == ["edge", "edge"]


# ---------------------------------------------------------------- duplicates and redelivery

def test_client_resend_is_a_duplicate_but_redelivery_of_the_same_record_is_not() -> None:
    f = Feed()
    served, edit, tool = turn("r1", horizons=HZ)[:3]
    broken = ev("ToolCall", "r1", ts=T0 + 10, status="broken", call_id="b")
    value, headers = json_record(served, edit, broken)
    first = f.record(value, headers)  # offset 0
    assert len(first.valid) == 3
    again = f.record(value, headers, offset=0)  # the same record redelivered
    assert again.excluded == [] and again.late == [] and again.rewards == []
    resend = f.send(broken)  # offset 1: a client resend of the same event
    assert [(x["reason"], x["event_id"]) for x in resend.excluded] == [("duplicate", broken["event_id"])]
    assert resend.valid == []
    twice_in_batch = f.send(tool, tool)
    assert len(twice_in_batch.valid) == 1 and [x["reason"] for x in twice_in_batch.excluded] == ["duplicate"]
    # same duplicate again at another offset: a distinct exclusion id
    resend2 = f.send(broken)
    assert resend2.excluded[0]["exclusion_id"] != resend.excluded[0]["exclusion_id"]
    f.tick(DEADLINE)
    (final,) = f.final()
    assert final["n_tool_calls"] == 2 and final["n_tool_broken"] == 1


def test_redelivery_reemits_the_same_rows_without_reapplying() -> None:
    """At-least-once: a redelivered record reproduces its rows (equal ids), never double counts."""
    f = Feed()
    value, headers = json_record(*turn("r1", horizons=HZ)[:2], {"event_type": "FollowUp"})
    first = f.record(value, headers, offset=7)
    again = f.record(value, headers, offset=7)
    assert again.valid == first.valid and again.dead == first.dead
    assert f.proc.wm == T0 + 1000 - CFG.lateness_ms
    f.tick(DEADLINE)
    assert f.final()[0]["n_edits"] == 1


# ---------------------------------------------------------------- orphans

def test_turn_without_served_is_held_until_grace_then_reported_once() -> None:
    f = Feed()
    f.send(ev("AgentEdit", "orph", ts=T0, edit_id="x"), ev("FollowUp", "orph", ts=T0 + 5000))
    f.tick(T0 + SETTLE - 1)
    assert f.total.excluded == []
    out = f.tick(T0 + SETTLE)
    (row,) = out.excluded
    assert row["reason"] == "orphan" and row["request_id"] == "orph" and row["checkpoint_id"] == ""
    assert orjson.loads(row["payload"]) == {"edits": 1, "counts": {"followups": 1}}
    assert out.rewards == []
    f.tick(T0 + 3 * SETTLE)
    assert len(f.total.excluded) == 1
    late = f.send(ev("InferenceServed", "orph", ts=T0 + 6000))
    assert [r["reason"] for r in late.late] == ["late"] and late.rewards == []


def test_served_arriving_before_the_deadline_rescues_a_would_be_orphan() -> None:
    f = Feed()
    f.send(ev("AgentEdit", "r", ts=T0 + 1000, edit_id="x"))
    f.tick(T0 + 1000 + SETTLE - 1)
    f.send(ev("InferenceServed", "r", ts=T0 + 1000))  # 121 s behind the watermark: still in time
    f.tick(T0 + 1000 + SETTLE)
    assert f.total.excluded == [] and [r["sample_id"] for r in f.final()] == ["r"]


# ---------------------------------------------------------------- dead letters

def test_bad_json_dead_letters_the_record_and_processing_continues() -> None:
    f = Feed()
    out = f.record(b'{"events": [{"event_type": ', JSON_H)
    (dl,) = out.dead
    assert dl["index"] == -1 and dl["reason_code"] == "bad_json" and dl["source_offset"] == 0
    assert out.counts() == {"valid": 0, "rewards": 0, "windows": 0, "dead": 1, "late": 0, "excluded": 0}
    assert len(f.send(ev("FollowUp")).valid) == 1


@pytest.mark.parametrize("encode", [json_record, avro_record])
def test_invalid_event_in_a_batch_dead_letters_only_that_event_with_its_index(encode: Any) -> None:
    good = turn("r1", horizons=HZ)
    bad = ev("ToolCall", "r1", ts=T0 + 3, status="ok", duration_ms=5)
    bad["producer"] = {"name": "", "version": "1"}  # fits the Avro schema, breaks the contract
    value, headers = encode(good[0], bad, *good[1:3])
    f = Feed()
    out = f.record(value, headers)
    (dl,) = out.dead
    assert dl["index"] == 1 and "producer.name" in dl["reason"] and dl["event_id"] == bad["event_id"]
    assert dl["session_id"] == "s1" and dl["source_offset"] == 0
    assert [r["event_id"] for r in out.valid] == [good[0]["event_id"], good[1]["event_id"], good[2]["event_id"]]
    f.send(*good[3:])
    f.tick(DEADLINE)
    assert f.final()[0]["n_tool_calls"] == 1


@pytest.mark.parametrize("value", [None, b"", b"\x00\x00", b"plain text", b"[1, 2]"])
def test_unreadable_records_never_raise(value: bytes | None) -> None:
    out = Feed().record(value, None)
    assert [d["index"] for d in out.dead] == [-1]


# ---------------------------------------------------------------- state expiry

def test_state_of_finalised_turns_is_deleted_eventually() -> None:
    cfg = replace(CFG, dedup_ms=60_000, tombstone_ms=60_000)  # tombstones go 181 s after finalisation
    f = Feed(cfg=cfg)
    rng = random.Random(3)
    sizes = []
    for i in range(150):
        t = T0 + i * 20_000
        events = turn(f"r{i}", session_id=f"s{i}", ts=t, horizons=HZ) if i % 5 else [ev("FollowUp", f"r{i}", f"s{i}", t)]
        rng.shuffle(events)
        f.send(*events)
        sizes.append(sum(1 for k in f.store.data if k.startswith("s:")))
    # a steady stream keeps a bounded number of sessions, not all 150
    assert max(sizes[50:]) < 60
    end = T0 + 150 * 20_000
    for k in range(1, 12):
        f.tick(end + k * cfg.keep_done_ms // 2)
    # left: the meta key and the stored window closes of the last offsets (no commit is known here)
    assert [k for k in f.store.data if not k.startswith("r:0:")] == ["m:0"]
    assert len({k.split(":")[2] for k in f.store.data if k.startswith("r:0:")}) <= 64
    assert len(f.final()) == 120 and len([x for x in f.total.excluded if x["reason"] == "orphan"]) == 30
    assert not f.proc._open_served


def test_tombstones_outlive_their_window_so_late_events_are_recognised() -> None:
    f = Feed()
    f.send(*turn("r1", horizons=HZ))
    f.tick(DEADLINE)
    f.tick(DEADLINE + CFG.keep_done_ms - 1)
    assert "s:org\ts1" in f.store.data
    out = f.send(ev("FollowUp", "r1", ts=T0))
    assert out.late[0]["checkpoint_id"] == "ck-a"


def test_tick_value_sets_the_watermark_and_finalises_as_idle() -> None:
    f = Feed()
    f.send(*turn("r1", horizons=HZ))
    out = f.record(orjson.dumps({"wm": DEADLINE}), {"rf-format": b"tick"})
    assert f.proc.wm == DEADLINE and out.valid == [] and out.dead == []
    assert {r["finalised_by"] for r in out.rewards} == {"idle"}


def test_idle_target_follows_the_wall_clock_after_the_timeout() -> None:
    p = PartitionProcessor(CFG, SPECS, DictStore(), "raw", 0)
    assert p.idle_target(10_000, 1000, 1.0) is None  # no event yet
    p.process(*json_record(ev("FollowUp", ts=T0)), 0, 5_000)
    assert p.idle_target(5_500, 1000, 1.0) is None
    assert p.idle_target(8_000, 1000, 1.0) == T0 - CFG.lateness_ms + 3000


def test_records_that_move_no_event_time_keep_no_partition_from_being_idle() -> None:
    p = PartitionProcessor(CFG, SPECS, DictStore(), "raw", 0)
    p.process(*json_record(ev("FollowUp", "r1", ts=T0)), 0, 5_000)
    offset = 1
    for wall in range(5_500, 9_000, 500):  # refused, late and duplicate records, every half second
        for value, headers in ((b"[]", JSON_H), json_record(ev("FollowUp", "r2", ts=T0 - 600_000)),
                               json_record(ev("FollowUp", "r1", ts=T0))):
            p.process(value, headers, offset, wall)
            offset += 1
    assert p.idle_target(8_000, 1000, 1.0) == T0 - CFG.lateness_ms + 3000  # idle since the event at 5 000


def test_a_trickle_of_events_a_millisecond_apart_keeps_no_partition_from_being_idle() -> None:
    p = PartitionProcessor(CFG, SPECS, DictStore(), "raw", 0)
    p.process(*json_record(ev("FollowUp", "r0", ts=T0)), 0, 5_000)
    for k in range(1, 10):  # one event a second, each dated a millisecond after the last
        p.process(*json_record(ev("FollowUp", f"r{k}", ts=T0 + k)), k, 5_000 + 1000 * k)
    assert p.maxts == T0 + 9
    assert p.idle_target(14_000, 1000, 1.0) == T0 - CFG.lateness_ms + 9000


def test_a_rebuilt_partition_counts_its_idle_clock_from_its_rebuilt_event_time() -> None:
    p = PartitionProcessor(CFG, SPECS, DictStore(), "raw", 0)
    p.process(*json_record(ev("FollowUp", "r0", ts=T0)), 0, 5_000)
    p._paced_ts = T0 + 600_000  # as a batch rolled back after a record had moved the anchor
    p.rebuild(0, Outputs())
    assert p.maxts == T0 and p.idle_target(8_000, 1000, 1.0) == T0 - CFG.lateness_ms + 3000


def test_a_rebuilt_partition_resumes_its_idle_clock_from_the_watermark_its_ticks_reached() -> None:
    """An idle partition handed over every few seconds (a rebalance, a restart) still reaches its turns'
    deadlines: each owner's clock goes on from the watermark the last one's ticks took it to."""
    p = PartitionProcessor(CFG, SPECS, DictStore(), "raw", 0)
    p.process(*json_record(ev("InferenceServed", "r1", ts=T0)), 0, 5_000)
    offset, wall = 1, 5_000
    for _ in range(30):  # a new owner every 3 s of wall time, each ticking its clock on while it holds it
        p.rebuild(0, Outputs())
        p.last_event_wall = wall  # (the shell's: idle time counts from when the partition was taken)
        p.process(*json_record(ev("InferenceServed", "r1", ts=T0)), offset, wall)  # a duplicate moves no clock
        offset += 1
        for _ in range(3):
            wall += 1_000
            target = p.idle_target(wall, 1_000, 1.0)
            if target is not None and target > p.wm:
                p.process(orjson.dumps({"wm": target}), TICK_H, offset, wall)
                offset += 1
    assert p.wm >= T0 - CFG.lateness_ms + 60_000  # 90 s of wall time: the clock moved on across 30 owners


def test_a_record_that_fails_leaves_the_idle_clock_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch is run again from the state before it; the idle clock (wall-time bookkeeping) goes on as it
    was, not counting the partition's idle hour a second time from the watermark its ticks reached."""
    p = PartitionProcessor(CFG, SPECS, EncodedStore(check=False), "raw", 0)
    p.process(*json_record(ev("InferenceServed", "r1", ts=T0)), 0, 5_000)
    hour = 3_600_000
    target = p.idle_target(5_000 + hour, 1_000, 1.0)
    assert target == T0 - CFG.lateness_ms + hour
    p.process(orjson.dumps({"wm": target}), TICK_H, 1, 5_000 + hour)
    real = PartitionProcessor._apply

    def apply(self: PartitionProcessor, st: Any, ev_: Any, *args: Any) -> None:
        if ev_.request_id == "poison":
            raise RuntimeError("boom")
        real(self, st, ev_, *args)

    monkeypatch.setattr(PartitionProcessor, "_apply", apply)
    out = p.process(*json_record(ev("FollowUp", "poison", ts=T0 - 10)), 2, 5_000 + hour + 1_000)
    assert [d["reason_code"] for d in out.dead] == ["processing_error"]
    assert p.idle_target(5_000 + hour + 60_000, 1_000, 1.0) == T0 - CFG.lateness_ms + hour + 60_000


def test_events_that_keep_pace_with_the_wall_clock_keep_a_partition_active() -> None:
    p = PartitionProcessor(CFG, SPECS, DictStore(), "raw", 0)
    for k in range(10):  # one event a second, each dated 600 ms after the last (a clock 40 % slow)
        p.process(*json_record(ev("FollowUp", f"r{k}", ts=T0 + 600 * k)), k, 5_000 + 1000 * k)
        assert p.idle_target(5_000 + 1000 * k + 999, 1000, 1.0) is None
    assert p.idle_target(14_000 + 1000, 1000, 1.0) == T0 + 5400 - CFG.lateness_ms + 1000


def test_a_processor_needs_a_spec() -> None:
    with pytest.raises(ValueError):
        PartitionProcessor(CFG, [], DictStore(), "raw", 0)


# ---------------------------------------------------------------- crash and restart

class LoggedStore(DictStore):
    """A DictStore that also keeps an ordered copy of every write (the changelog)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, Any]] = []

    def put(self, key: str, value: Any) -> None:
        super().put(key, value)
        self.log.append((key, orjson.loads(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS))))

    def delete(self, key: str) -> None:
        super().delete(key)
        self.log.append((key, None))


def snapshot(log: list[tuple[str, Any]], n: int) -> DictStore:
    """The store a restart sees when the first ``n`` changelog writes survived (JSON round trip)."""
    store = DictStore()
    for key, value in log[:n]:
        if value is None:
            store.delete(key)
        else:
            store.put(key, orjson.loads(orjson.dumps(value)))
    return store


def workload(seed: int) -> list[tuple[bytes | None, Any]]:
    """Records of one partition: turns, orphans, resends, late events, junk and ticks, jittered in time."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    for i in range(14):
        sid, t = f"s{rng.randrange(4)}", T0 + rng.randrange(0, 300_000)
        if rng.random() < 0.15:
            events += [ev("AgentEdit", f"o{i}", sid, t, edit_id="x"), ev("FollowUp", f"o{i}", sid, t + 10)]
            continue
        evs = turn(f"r{i}", session_id=sid, ts=t, horizons=HZ, survival=rng.random(),
                   checkpoint=rng.choice(["ck-a", "ck-b"]), latency_ms=rng.randrange(100, 9000))
        if rng.random() < 0.5:
            evs.append(ev("ToolCall", f"r{i}", sid, t + 20, status=rng.choice(["broken", "error"])))
        if rng.random() < 0.5:
            evs.append(ev("FollowUp", f"r{i}", sid, t + rng.randrange(100_000), dissatisfied=True))
        events += evs
    arrival = sorted(events, key=lambda e: e["ts"] + rng.randrange(CFG.lateness_ms))
    records: list[tuple[bytes | None, Any]] = []
    i = 0
    while i < len(arrival):
        n = rng.randint(1, 4)
        chunk = arrival[i:i + n]
        i += n
        if rng.random() < 0.1:  # a client resend of an earlier event
            chunk.append(rng.choice(arrival[:i]))
        records.append(avro_record(*chunk) if rng.random() < 0.3 else json_record(*chunk))
        if rng.random() < 0.05:
            records.append((b"{not json", JSON_H))
        if rng.random() < 0.05:
            records.append(json_record(chunk[0], {"event_type": "FollowUp", "session_id": "s0"}))
        if rng.random() < 0.08:  # an event of a turn that already arrived (late once it is final)
            first = rng.choice(arrival[:i])
            records.append(json_record(ev("FollowUp", first["request_id"], first["session_id"], first["ts"])))
        if rng.random() < 0.05:  # an event too old to start a turn
            records.append(json_record(ev("FollowUp", f"gone{i}", "s0", T0 - SETTLE)))
    end = arrival[-1]["ts"]
    for k in range(1, 4):
        records.append((orjson.dumps({"wm": end + k * SETTLE}), TICK_H))
    return records


def ids_of(rows: list[Any], kind: str) -> dict[Any, Any]:
    key = {"valid": "event_id", "rewards": "reward_id", "windows": "window_id", "dead": "dead_letter_id",
           "late": "exclusion_id", "excluded": "exclusion_id"}[kind]
    return {r[key]: r for r in rows}


KINDS = ("valid", "rewards", "windows", "dead", "late", "excluded")


def run_uninterrupted(records: list[tuple[bytes | None, Any]]) -> tuple[list[Any], list[int], LoggedStore]:
    store = LoggedStore()
    f = Feed(store=store)
    outs, marks = [], [0]
    for value, headers in records:
        outs.append(f.record(value, headers))
        marks.append(len(store.log))
    return outs, marks, store


def restart_and_compare(records: list[tuple[bytes | None, Any]], outs: list[Any], marks: list[int],
                        log: list[tuple[str, Any]], x: int, partial: int, c: int) -> None:
    """Crash after record x (plus ``partial`` writes of x+1), resume at committed offset c <= x+1."""
    n_writes = marks[x + 1] + min(partial, marks[x + 2] - marks[x + 1])
    if n_writes == marks[x + 2]:  # every write of x+1 survived: the crash was after x+1
        x += 1
    f = Feed(store=snapshot(log, n_writes), offset=c)
    for value, headers in records[c:]:
        f.record(value, headers)
    for kind in KINDS:
        want_rows = [r for o in outs for r in getattr(o, kind)]
        got_rows = [r for o in outs[:c] for r in getattr(o, kind)] + getattr(f.total, kind)
        if kind == "rewards":  # provisional rewards are best effort: only the final ones must be complete
            assert all(r in want_rows for r in got_rows if r["provisional"])  # ...but never different
            want_rows = [r for r in want_rows if not r["provisional"]]
            got_rows = [r for r in got_rows if not r["provisional"]]
        want = ids_of(want_rows, kind)
        assert set(ids_of(got_rows, kind)) == set(want), (kind, x, partial, c)
        replayed = {key for o in outs[c:x + 1] for key in ids_of(getattr(o, kind), kind)}
        for row in got_rows:
            key = next(iter(ids_of([row], kind)))
            if kind in ("late", "excluded") and key in replayed and row["reason"] != "orphan":
                # Known limit: an exclusion re-decided while replaying a record whose effects are
                # already in the store carries the restored (later) watermark, not the original, and
                # may name the checkpoint a later record of its turn made known (a duplicate that came
                # before its turn's served event).
                assert row["watermark"] >= want[key]["watermark"]
                row = {**row, "watermark": want[key]["watermark"]}
                if want[key]["checkpoint_id"] == "":
                    row = {**row, "checkpoint_id": ""}
            assert row == want[key], (kind, x, partial, c, row, want[key])


def test_workload_exercises_every_output() -> None:
    records = workload(11)
    outs, _, _ = run_uninterrupted(records)
    counts = {k: sum(len(getattr(o, k)) for o in outs) for k in KINDS}
    assert all(counts.values()), counts
    reasons = {x["reason"] for o in outs for x in o.excluded}
    assert reasons == {"duplicate", "orphan"}


@pytest.mark.parametrize("seed", [11, 12])
def test_restart_after_every_record_reproduces_the_uninterrupted_outputs(seed: int) -> None:
    records = workload(seed)
    outs, marks, store = run_uninterrupted(records)
    rng = random.Random(seed)
    for x in range(-1, len(records) - 1):
        partial = rng.randrange(0, 4)
        c = rng.randint(max(0, x - 3), x + 1)
        restart_and_compare(records, outs, marks, store.log, x, partial, c)


def test_restart_window_sums_do_not_depend_on_rebuild_order() -> None:
    """A case found by the property below: float sums in another order differed in the last bit."""
    records = workload(10)
    outs, marks, store = run_uninterrupted(records)
    restart_and_compare(records, outs, marks, store.log, 42, 0, 39)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data())
def test_restart_anywhere_reproduces_the_uninterrupted_outputs(seed: int, data: st.DataObject) -> None:
    records = workload(seed)
    outs, marks, store = run_uninterrupted(records)
    x = data.draw(st.integers(-1, len(records) - 2), label="crash after record")
    partial = data.draw(st.integers(0, 6), label="writes of the next record that survived")
    c = data.draw(st.integers(max(0, x - 4), x + 1), label="committed offset")
    restart_and_compare(records, outs, marks, store.log, x, partial, c)


# ---------------------------------------------------------------- regressions found by the tests above

def test_events_of_an_open_turn_stay_deduplicated_past_the_dedup_horizon() -> None:
    """A turn can outlive the dedup horizon of its first events (a later edit moves its anchor)."""
    f = Feed(cfg=replace(CFG, dedup_ms=10_000))
    served, edit, tool = turn("r1", horizons=HZ)[:3]
    value, headers = json_record(served, edit, tool)
    f.record(value, headers)  # offset 0
    f.send(ev("AgentEdit", "r1", ts=T0 + 60_000, edit_id="later"))  # wm ~ T0 + 60 s, turn open until + 181 s
    resend = f.send(tool)
    redelivered = f.record(value, headers, offset=0)
    assert [x["reason"] for x in resend.excluded] == ["duplicate"]
    assert redelivered.excluded == [] and len(redelivered.valid) == 3
    f.tick(T0 + 60_000 + SETTLE)
    (final,) = f.final()
    assert final["n_tool_calls"] == 1 and final["n_edits"] == 2


def test_a_blocked_tombstone_does_not_postpone_another_turns_deadline() -> None:
    """Housekeeping of a session (tombstones waiting for their window) must not delay its turns."""
    f = Feed(cfg=replace(CFG, tombstone_ms=0))  # keep_done = window + settle = 181 s
    s = 1000
    f.send(ev("InferenceServed", "a1", "sa", T0))  # holds the window of T0 open while a1 is open
    f.send(ev("InferenceServed", "b1", "sb", T0 + 10 * s))
    f.send(ev("AgentEdit", "a1", "sa", T0 + 100 * s, edit_id="x"))
    f.tick(T0 + 131 * s)
    assert [r["sample_id"] for r in f.final()] == ["b1"]
    f.send(ev("AgentEdit", "a1", "sa", T0 + 210 * s, edit_id="y"))  # a1 open until T0 + 331 s
    f.send(ev("InferenceServed", "b2", "sb", T0 + 200 * s))  # deadline T0 + 321 s
    f.tick(T0 + 231 * s)
    f.tick(T0 + 313 * s)  # b1's tombstone is old enough to go, but its window cannot close yet
    assert "b1" in f.store.data["s:org\tsb"][4]
    out = f.tick(T0 + 321 * s)
    assert [r["sample_id"] for r in out.rewards if not r["provisional"]] == ["b2", "b2"]
    assert f.final()[-1]["finalised_wm"] == T0 + 321 * s


def test_restart_counts_redelivered_events_in_the_watermark() -> None:
    """After a crash between a record's session write and its meta write, the watermark is the same."""
    store = LoggedStore()
    f = Feed(store=store)
    f.send(ev("InferenceServed", "r1", ts=T0))
    n = len(store.log)
    second = json_record(ev("FollowUp", "r1", ts=T0 + 50_000))
    f.record(*second)
    assert [k for k, _ in store.log[n:]] == ["s:org\ts1", "m:0"]
    g = Feed(store=snapshot(store.log, n + 1), offset=1)  # the session survived, the meta did not
    g.record(*second)
    assert g.proc.wm == f.proc.wm == T0 + 50_000 - CFG.lateness_ms


def test_windows_re_emitted_after_restart_keep_int_keys() -> None:
    """Closed windows are re-emitted from the (JSON) meta key; they must equal the originals."""
    store = LoggedStore()
    f = Feed(store=store)
    f.send(*turn("r1", horizons=HZ))
    wins = f.tick(T0 + 10**6).windows
    assert len(wins) == 2 and all(isinstance(h, int) for w in wins for h in w["latency_hist"])
    g = Feed(store=snapshot(store.log, len(store.log)), offset=f.offset - 1)
    assert g.tick(T0 + 10**6).windows == wins


@pytest.mark.parametrize("value", [None, b"", b"not json", b"[1]", b'{"wm": "soon"}', b'{"wm": null}'])
def test_an_unreadable_tick_is_a_dead_letter_not_a_crash(value: bytes | None) -> None:
    f = Feed()
    f.send(ev("FollowUp", ts=T0))
    wm = f.proc.wm
    out = f.record(value, TICK_H)
    assert [(d["index"], d["reason_code"]) for d in out.dead] == [(-1, "bad_tick")]
    assert f.proc.wm == wm


# ---------------------------------------------------------------- batches

def _batches(rng: random.Random, n: int) -> list[range]:
    """Consecutive offset ranges covering 0..n-1, of random sizes 1..12."""
    out, i = [], 0
    while i < n:
        k = rng.randint(1, 12)
        out.append(range(i, min(n, i + k)))
        i += k
    return out


def _run_batches(proc: PartitionProcessor, records: list[tuple[bytes | None, Any]], batches: list[range],
                 base: int = 0) -> list[Any]:
    outs = []
    for b in batches:
        recs = [(records[i - base][0], records[i - base][1], i) for i in b]
        outs.append(proc.process_batch(recs, 1_000_000 + b[0]))
    return outs


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), split=st.integers(0, 10_000))
def test_batched_processing_gives_the_outputs_of_record_by_record_processing(seed: int, split: int) -> None:
    records = workload(seed)
    one = Feed()
    singles = [one.proc.process(v, h, i, 1_000_000 + i) for i, (v, h) in enumerate(records)]
    proc = PartitionProcessor(CFG, list(SPECS), DictStore(), "raw", 0)
    batched = _run_batches(proc, records, _batches(random.Random(split), len(records)))
    for kind in KINDS:
        want = [r for o in singles for r in getattr(o, kind) if kind != "dead"]
        got = [r for o in batched for r in getattr(o, kind) if kind != "dead"]
        assert got == want, kind
    # dead letters carry the wall clock of their batch; everything else about them is equal
    strip = lambda rows: [{k: v for k, v in r.items() if k != "dead_lettered_at"} for r in rows]  # noqa: E731
    assert strip([r for o in batched for r in o.dead]) == strip([r for o in singles for r in o.dead])
    def no_marks(data: dict[str, Any]) -> dict[str, Any]:  # batch-start watermarks differ by construction
        return {k: ({**v, "marks": None} if k.startswith("m:") else v) for k, v in data.items()}
    assert no_marks(one.store.data) == no_marks(proc.store.data)  # type: ignore[attr-defined]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data())
def test_restart_after_a_batch_reproduces_the_uninterrupted_outputs(seed: int, data: st.DataObject) -> None:
    """Crash after batch X plus part of X+1's writes; resume at a committed batch start up to X+1; regroup."""
    records = workload(seed)
    rng = random.Random(seed)
    batches = _batches(rng, len(records))
    store = LoggedStore()
    proc = PartitionProcessor(CFG, list(SPECS), store, "raw", 0)
    outs, marks = [], [0]
    for b in batches:
        outs += _run_batches(proc, records, [b])
        marks.append(len(store.log))
    x = data.draw(st.integers(0, len(batches) - 2), label="crash after batch")
    partial = data.draw(st.integers(0, 8), label="writes of the next batch that survived")
    n_writes = marks[x + 1] + min(partial, marks[x + 2] - marks[x + 1])
    # Faust acks a whole batch at once, so a committed offset is the start of some batch
    c = batches[data.draw(st.integers(max(0, x - 3), x + 1), label="batch committed up to")][0]
    again = PartitionProcessor(CFG, list(SPECS), snapshot(store.log, n_writes), "raw", 0)
    assert again.expected_offset() is not None and again.expected_offset() >= c  # type: ignore[operator]
    regrouped = [range(b[0] + c, b[-1] + c + 1) for b in _batches(random.Random(seed + 1), len(records) - c)]
    tail = _run_batches(again, records[c:], regrouped, base=c)
    for kind in KINDS:
        key = {"valid": "event_id", "rewards": "reward_id", "windows": "window_id", "dead": "dead_letter_id",
               "late": "exclusion_id", "excluded": "exclusion_id"}[kind]
        want = {r[key]: r for o in outs for r in getattr(o, kind) if not r.get("provisional")}
        before = [r for b, o in zip(batches, outs) if b[-1] < c for r in getattr(o, kind)]
        got = {r[key]: r for r in before + [r for o in tail for r in getattr(o, kind)]
               if not r.get("provisional")}
        assert set(got) == set(want), kind
        if kind in ("rewards", "windows"):
            assert all(got[k] == want[k] for k in want), kind


def test_expected_offset_comes_from_the_meta_key_and_follows_processing() -> None:
    store = DictStore()
    proc = PartitionProcessor(CFG, list(SPECS), store, "raw", 0)
    assert proc.expected_offset() is None
    proc.process_batch([(*json_record(*turn("r1", horizons=HZ)), 7), (*json_record(ev("FollowUp", "r2", "s1")), 8)], 0)
    assert proc.expected_offset() == 9
    assert PartitionProcessor(CFG, list(SPECS), store, "raw", 0).expected_offset() == 9


def test_stored_window_closes_are_deleted_once_the_commit_passes_them() -> None:
    records = workload(5)
    store = DictStore()
    proc = PartitionProcessor(CFG, list(SPECS), store, "raw", 0)
    batches = _batches(random.Random(5), len(records))
    closed_at: list[int] = []
    for b in batches:
        if _run_batches(proc, records, [b])[0].windows:
            closed_at.append(b[0])
    assert closed_at, "the workload closes windows"
    committed = batches[-1][0]  # everything before the last batch is committed
    kept = {int(k.split(":")[2]) for k in store.data if k.startswith("r:0:")}
    assert kept and min(kept) < committed  # no commit was known: closes before it are still stored
    proc.process_batch([(*tick_record_of(10**15), len(records))], 0, committed=committed)
    assert all(int(k.split(":")[2]) >= committed for k in store.data if k.startswith("r:0:"))


def tick_record_of(wm: int) -> tuple[bytes, Any]:
    return orjson.dumps({"wm": wm}), TICK_H


def test_a_replay_after_a_watermark_jump_redelivers_rather_than_judging_late() -> None:
    """Crash after a batch ending in a far-future tick (all seen ids past the dedup horizon), before the
    commit: replaying the batch must recognise its events as redeliveries, not late events."""
    records = [(*json_record(*turn(f"r{i}", session_id="s1", ts=T0 + i * 1000, horizons=HZ)), i) for i in range(3)]
    records.append((*tick_record_of(2**53), 3))
    store = DictStore()
    first = PartitionProcessor(CFG, list(SPECS), store, "raw", 0).process_batch(records, 0)
    again = PartitionProcessor(CFG, list(SPECS), store, "raw", 0).process_batch(records, 0)
    assert again.late == [] and again.excluded == []
    assert {r["event_id"] for r in again.valid} == {r["event_id"] for r in first.valid}
    finals = lambda o: {r["reward_id"] for r in o.rewards if not r["provisional"]}  # noqa: E731
    assert finals(again) == finals(first) and len(finals(first)) == 3 * len(SPECS)


@pytest.mark.parametrize("committed", [0, None])
def test_state_is_pruned_at_the_committed_watermark_so_a_replay_finds_it(committed: int | None) -> None:
    """A turn finalised by the watermark, then a far-future tick that closes every window: with the commit
    still at 0, pruning must not forget the turn, or replaying its events after a crash judges them late.
    Without a known commit (None), pruning follows the current watermark and the replay does go wrong."""
    evs = turn("r0", session_id="s1", ts=T0, horizons=HZ)
    records = [(*json_record(*evs[:3]), 0), (*json_record(*evs[3:]), 1),  # one session, two records
               (*json_record(ev("FollowUp", "x", "s2", ts=T0 + 10 * SETTLE)), 2),
               (*tick_record_of(2**53), 3)]
    store = DictStore()
    PartitionProcessor(CFG, list(SPECS), store, "raw", 0).process_batch(records, 0, committed=committed)
    again = PartitionProcessor(CFG, list(SPECS), store, "raw", 0).process_batch(records, 0, committed=committed)
    if committed is None:
        assert again.late, "the scenario no longer reproduces the problem: the test proves nothing"
    else:
        assert again.late == [] and len(again.valid) == len(turn("r0", horizons=HZ)) + 1


def test_a_turn_finalised_and_pruned_in_one_uncommitted_batch_is_re_emitted_after_a_crash() -> None:
    """The batch finalises a turn, then a far-future tick prunes its tombstone; the process dies before the
    batch's outputs are confirmed, with its state writes in the changelog. The replay from the commit must
    re-emit the turn's final rewards: its events are redeliveries, so only the stored tombstone can.
    (Lost by the kill -9 fault test in CI: 25 turns' final rewards missing.)"""
    evs = turn("r0", session_id="s1", ts=T0, horizons=HZ)
    records = [(*json_record(*evs[:3]), 0), (*json_record(*evs[3:]), 1),
               (*json_record(ev("FollowUp", "x", "s2", ts=T0 + 10 * SETTLE)), 2),  # finalises r0 (and orphan x later)
               (*tick_record_of(2**53), 3)]
    finals = lambda o: sorted((r["sample_id"], r["spec_version"]) for r in o.rewards if not r["provisional"])  # noqa: E731
    store = DictStore()
    first = PartitionProcessor(CFG, list(SPECS), store, "raw", 0).process_batch(records, 0, committed=0)
    assert ("r0", SPECS[0].version) in finals(first)
    assert store.data["s:org\ts1"][4] == {} and "r0" in store.data["s:org\ts1"][6]  # pruned by the tick, held
    again = PartitionProcessor(CFG, list(SPECS), store, "raw", 0).process_batch(records, 0, committed=0)
    assert finals(again) == finals(first)
    assert {x["exclusion_id"] for x in again.excluded} == {x["exclusion_id"] for x in first.excluded}
    # once the commit passed the batch, the held tombstones go at the session's next wake-up
    proc = PartitionProcessor(CFG, list(SPECS), store, "raw", 0)
    proc.process_batch([(*tick_record_of(2**53 + 10**9), 4)], 0, committed=4)
    assert "s:org\ts1" not in store.data


def test_a_batch_that_replays_records_below_the_commit_still_finds_their_state() -> None:
    """Faust can deliver, in one batch, new records and then (after a re-seek) older ones again, while its
    in-memory committed offset is already past the older ones: pruning must follow the lowest offset."""
    evs = turn("r0", session_id="s1", ts=T0, horizons=HZ)
    records = [(*json_record(*evs[:3]), 0), (*json_record(*evs[3:]), 1),
               (*json_record(ev("FollowUp", "x", "s2", ts=T0 + 10 * SETTLE)), 2),
               (*tick_record_of(2**53), 3), (*json_record(ev("FollowUp", "y", "s3", ts=T0 + 11 * SETTLE)), 4)]
    store = DictStore()
    PartitionProcessor(CFG, list(SPECS), store, "raw", 0).process_batch(records[:4], 0, committed=0)
    again = PartitionProcessor(CFG, list(SPECS), store, "raw", 0)
    out = again.process_batch([records[4], *records[:4]], 0, committed=4)  # 4, then 0..3 again
    assert [r["request_id"] for r in out.late] == ["y"]  # only the genuinely new, too-old event


@pytest.mark.parametrize("cached", [0, 3, 10_000])
def test_an_encoded_store_gives_the_outputs_and_state_of_the_dict_store(cached: int) -> None:
    """Sessions written with their reused encodings (put_json) and taken back between batches
    (or decoded again, when the store's cache dropped them) decide exactly as with a dict store."""
    from rewardflow.events.samples import PRODUCERS, START_MS, turn_events
    from rewardflow.events.validate import to_dict

    rng = random.Random(7)
    records = []
    for s in range(12):
        envelope = {"org_id": "org", "session_id": f"s{s}", "producer": PRODUCERS[0]}
        at = START_MS + rng.randint(0, 600_000)
        for _ in range(3):
            events = [to_dict(e) for e in turn_events(rng, envelope, at)]
            records.append((max(e["ts"] for e in events), avro_record(*sorted(events, key=lambda e: e["ts"]))))
            at += rng.randint(20_000, 200_000)
    records.sort(key=lambda r: r[0])
    dict_store, encoded = DictStore(), EncodedStore(cached)
    runs = []
    for store in (dict_store, encoded):
        proc = PartitionProcessor(CFG, SPECS, store, "raw", 0)  # type: ignore[arg-type]
        outs = [proc.process_batch([(v, h, i) for i, (_, (v, h)) in enumerate(records[j:j + 2], j)], 0)
                for j in range(0, len(records), 2)]
        outs.append(proc.process_batch([(orjson.dumps({"wm": 2**62}), TICK_H, len(records))], 0))
        runs.append([orjson.dumps([getattr(o, n) for n in o.__slots__], option=orjson.OPT_NON_STR_KEYS) for o in outs])
    assert runs[0] == runs[1]
    assert sum(len(o) for o in runs[0]) > 10_000  # rewards, windows and rows were produced
    assert encoded.put_json_calls > 0
    plain = {k: orjson.loads(orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS)) for k, v in dict_store.data.items()}
    assert plain == dict(encoded.items())


# ---------------------------------------------------------------- restarts under commits

def _with_far_tick(records: list[tuple[bytes | None, Any]], rng: random.Random) -> list[tuple[bytes | None, Any]]:
    """The workload with a tick far past every tombstone's lifetime at a random place: it finalises
    and prunes in one batch (and makes the events after it late)."""
    at = rng.randint(len(records) // 3, len(records))
    return [*records[:at], tick_record_of(T0 + 50 * CFG.keep_done_ms), *records[at:]]


# derandomized: every run checks the same 200 examples (6,000 random ones passed on this code;
# explore more with a local edit of max_examples and derandomize=False)
@settings(max_examples=200, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), data=st.data())
def test_restart_under_the_workers_commits_reproduces_the_uninterrupted_outputs(seed: int, data: st.DataObject) -> None:
    """As the worker runs: each batch knows a committed offset (a batch start, lagging a few batches),
    and a tick may jump the watermark past every tombstone's lifetime. Crash after batch X plus part of
    X+1's writes, resume at a committed offset between the one X+1 was given and X+1's start."""
    restart_under_commits(seed, lambda label, lo, hi: data.draw(st.integers(lo, hi), label=label))


@pytest.mark.parametrize("seed,crash_after,partial,commit_at", [
    (34, 5, 1, 5),  # a late event replayed against a session written after the prune (found in CI)
    (406, 2, 1, 0),  # the final rewards of turns finalised and pruned in the lost batch
    (918, 2, 1, 1),  # a window recomputed without a tombstone the lost batch pruned
    (62, 4, 1, 4),  # an event of a pruned turn opened the turn again on replay
])
def test_restart_under_the_workers_commits_regressions(seed: int, crash_after: int, partial: int, commit_at: int) -> None:
    picks = {"crash after batch": crash_after, "writes of the next batch that survived": partial,
             "batch the broker's commit is at": commit_at}
    restart_under_commits(seed, lambda label, lo, hi: min(max(picks[label], lo), hi))


def restart_under_commits(seed: int, pick: Any, cfg: JoinConfig = CFG, make: Any = workload) -> None:
    """The property above for one seed; ``pick(label, lo, hi)`` chooses the crash point and commit;
    ``make(seed)`` builds the records the join rules ``cfg`` process."""
    rng = random.Random(seed)
    records = _with_far_tick(make(seed), rng)
    batches = _batches(rng, len(records))
    store = LoggedStore()
    proc = PartitionProcessor(cfg, list(SPECS), store, "raw", 0)
    outs, marks, given_commit, j = [], [0], [], 0
    for i, b in enumerate(batches):
        j = rng.randint(j, i)  # commits only move forward, and never past the batch being processed
        given_commit.append(j)
        outs.append(proc.process_batch([(*records[k], k) for k in b], 1_000_000, committed=batches[j][0]))
        marks.append(len(store.log))
    x = pick("crash after batch", 0, len(batches) - 2)
    partial = pick("writes of the next batch that survived", 0, 8)
    n_writes = marks[x + 1] + min(partial, marks[x + 2] - marks[x + 1])
    c = batches[pick("batch the broker's commit is at", given_commit[x + 1], x + 1)][0]
    again = PartitionProcessor(cfg, list(SPECS), snapshot(store.log, n_writes), "raw", 0)
    tail = [again.process_batch([(*records[i], i) for i in r], 1_000_000, committed=c)
            for r in (range(b[0] + c, b[-1] + c + 1) for b in _batches(random.Random(seed + 1), len(records) - c))]
    def rows(kind: str, run: list[Any], skip: int) -> list[Any]:
        done = [r for b, o in zip(batches, outs) if b[-1] < skip for r in getattr(o, kind)]
        return [r for r in done + [r for o in run for r in getattr(o, kind)] if not r.get("provisional")]

    for kind, key in (("valid", "event_id"), ("rewards", "reward_id"), ("windows", "window_id"),
                      ("dead", "dead_letter_id")):
        want = {r[key]: r for r in rows(kind, outs, 0)}
        got = {r[key]: r for r in rows(kind, tail, c)}
        assert set(got) == set(want), (kind, sorted(set(want) - set(got))[:3], sorted(set(got) - set(want))[:3])
        if kind in ("rewards", "windows"):
            assert all(got[k] == want[k] for k in want), kind
    orphans = lambda run, skip: {r["exclusion_id"] for r in rows("excluded", run, skip) if r["reason"] == "orphan"}  # noqa: E731
    assert orphans(tail, c) == orphans(outs, 0)
    # Known limit (PartitionProcessor._mark): seen ids are pruned at the committed offset's watermark, so
    # a client resend arriving after a far watermark jump is a duplicate or late depending on when
    # commits happened. Either way it is excluded, and nothing else about it differs.
    excluded = lambda run, skip: {r["event_id"] for r in rows("late", run, skip) + rows("excluded", run, skip)  # noqa: E731
                                  if r["reason"] != "orphan"}
    assert excluded(tail, c) == excluded(outs, 0)
    # Late rows decided after the crash point are the same rows. Known limit: a record replayed from the
    # commit up to the crash point meets state (and a watermark) written after it, so its late rows
    # keep their ids but may carry a later watermark and no checkpoint, as if the turn's tombstone
    # had already expired.
    redecided = {r["exclusion_id"] for b, o in zip(batches, outs) if b[0] <= batches[x + 1][-1] for r in o.late}
    want_late = {r["exclusion_id"]: r for r in rows("late", outs, 0)}
    for row in rows("late", tail, c):
        first = want_late.get(row["exclusion_id"])
        if first is not None and row["exclusion_id"] in redecided:
            assert {**row, "watermark": 0, "checkpoint_id": ""} == {**first, "watermark": 0, "checkpoint_id": ""}
        elif first is not None:
            assert row == first


def test_the_decoded_states_kept_between_batches_stay_within_their_bytes_and_change_no_output() -> None:
    """A decoded state takes several times its bytes: the states a partition keeps decoded are bounded by
    the bytes of their encodings as well as by their count, and a state beyond them is decoded again."""
    rng = random.Random(7)
    events = [e for s in range(40) for t in range(6) for e in turn(f"r{s}-{t}", f"s{s}", T0 + s * 700 + t * 9_000, horizons=HZ)]
    records = [json_record(e) for e in sorted(events, key=lambda e: (e["ts"], rng.random()))]

    def run(cfg: JoinConfig) -> tuple[PartitionProcessor, list[bytes], int]:
        proc = PartitionProcessor(cfg, list(SPECS), EncodedStore(cached=10_000, check=True), "raw", 0)
        rows, most = [], 0
        for start in range(0, len(records), 25):  # batches of 25 records: each session comes back batch after batch
            batch = [(v, h, start + i) for i, (v, h) in enumerate(records[start:start + 25])]
            out = proc.process_batch(batch, 0)
            rows += [orjson.dumps(r, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS) for name in Outputs.__slots__ for r in getattr(out, name)]
            most = max(most, proc._states.bytes)  # (what the cache holds adds up: tests/core/test_recent.py)
        return proc, rows, most

    _, unbounded, most = run(CFG)
    cap = most // 4
    assert cap > 2_000  # (the states are large enough that the cap binds)
    _, bounded, kept_most = run(replace(CFG, state_cache_bytes=cap))
    assert bounded == unbounded
    assert 0 < kept_most <= cap
