"""Corrections: a signal after finalisation, within the correction window, re-scores its turn.

The revision must equal what an on-time signal would have given; its window deltas must make the
merged windows equal those of the on-time run; anything past the window stays late; a restart
anywhere re-emits exactly the revisions of the uninterrupted run.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rewardflow.core.config import JoinConfig
from rewardflow.core.corrections import KEEP_REVISIONS
from rewardflow.core.session import Tombstone
from rewardflow.events.wire import decode_record
from tests.core.feed import CFG, TICK_H, Feed, json_record
from tests.core.test_processor import (KINDS, LoggedStore, _with_far_tick, ids_of, restart_under_commits, snapshot,
                                       workload)
from tests.factories import T0, ev, turn

CORR = JoinConfig(horizons_s=CFG.horizons_s, grace_ms=CFG.grace_ms, lateness_ms=CFG.lateness_ms,
                  window_sizes_s=CFG.window_sizes_s, correction_ms=600_000)
HZ = (30, 120)
ANCHOR = T0 + 1000
DEADLINE = ANCHOR + CORR.settle_ms
TIMING = ("finalised_wm", "finalised_by", "revision", "reward_id")


def _what(r: Any) -> dict[str, Any]:
    return {k: v for k, v in r.items() if k not in TIMING}


def _merged(windows: list[Any]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Windows as the table keeps them (the last row per window_id), merged per window_key."""
    last = {w["window_id"]: w for w in windows}
    out: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(lambda: defaultdict(float))
    for w in last.values():
        cell = out[(w["window_key"],)]
        for k in ("samples", "reward_sum", "turns_dissatisfied", "turns_followup", "tool_calls", "tool_error"):
            cell[k] += w[k]
        for k in ("persisted", "checked"):
            for h, n in w[k].items():
                cell[f"{k}{h}"] += n
    return {k: {n: round(v, 9) for n, v in c.items() if round(v, 9)} for k, c in out.items()}


def _late_check(survival: float = 0.2) -> dict[str, Any]:
    """The final-horizon check of turn r1, dated after its deadline (a laptop that slept through it)."""
    return ev("PersistenceCheck", "r1", ts=DEADLINE + 60_000, edit_id="r1-ed", horizon_s=120, survival_score=survival)


def test_a_late_check_within_the_window_yields_revision_1_equal_to_an_on_time_check() -> None:
    events = turn("r1", horizons=HZ[:1])  # its 120 s check has not come when the turn is finalised
    late = _late_check()
    on_time = Feed(CORR)
    on_time.send(*events, {**late, "ts": ANCHOR + 120_000})
    on_time.tick(DEADLINE + 10 * CORR.settle_ms)
    f = Feed(CORR)
    f.send(*events)
    f.tick(DEADLINE)
    (first,) = f.final()
    assert first["revision"] == 0 and first["checked"] == {30: 1}
    out = f.send(late)
    assert out.late == [] and [r["event_id"] for r in out.valid] == [late["event_id"]]  # stored as an event
    revs = [r for r in out.rewards if r["spec_version"] == "v1"]
    assert [r["revision"] for r in revs] == [1] and revs[0]["sample_id"] == first["sample_id"]
    assert revs[0]["reward_id"] != first["reward_id"] and revs[0]["finalised_by"] == "correction"
    assert revs[0]["finalised_wm"] == first["finalised_wm"]  # never depends on when the signal came
    (want,) = on_time.final()
    assert _what(revs[0]) == _what(want)
    f.tick(DEADLINE + 10 * CORR.settle_ms)
    assert _merged(f.total.windows) == _merged(on_time.total.windows)
    assert any(w["samples"] == 0 for w in f.total.windows)  # a delta partial per size and spec


def test_a_second_correction_is_revision_2_and_its_delta_replaces_the_first() -> None:
    events = turn("r1", horizons=HZ[:1])
    f = Feed(CORR)
    f.send(*events)
    f.tick(DEADLINE)
    f.send(_late_check(0.2))
    dissatisfied = ev("FollowUp", "r1", ts=DEADLINE + 120_000, dissatisfied=True)
    out = f.send(dissatisfied)
    assert {r["revision"] for r in out.rewards} == {2}
    assert out.rewards[0]["n_dissatisfied"] == 1 and out.rewards[0]["checked"] == {30: 1, 120: 1}
    f.tick(DEADLINE + 10 * CORR.settle_ms)
    on_time = Feed(CORR)
    on_time.send(*events, {**_late_check(0.2), "ts": ANCHOR + 120_000}, {**dissatisfied, "ts": ANCHOR + 5_000})
    on_time.tick(DEADLINE + 10 * CORR.settle_ms)
    assert _merged(f.total.windows) == _merged(on_time.total.windows)


def test_past_the_window_a_served_event_or_corrections_off_the_signal_is_late() -> None:
    for cfg, late, reason in (
        (CORR, {**_late_check(), "ts": DEADLINE + CORR.correction_ms + 1}, "past the window"),
        (CORR, ev("InferenceServed", "r1", ts=DEADLINE + 10, checkpoint_id="ck-b"), "a served event"),
        (CFG, _late_check(), "corrections off"),
    ):
        f = Feed(cfg)
        f.send(*turn("r1", horizons=HZ[:1]))
        f.tick(DEADLINE)
        out = f.send(late)
        assert out.rewards == [] and out.valid == [] and [r["reason"] for r in out.late] == ["late"], reason
    at_edge = Feed(CORR)
    at_edge.send(*turn("r1", horizons=HZ[:1]))
    at_edge.tick(DEADLINE)
    assert at_edge.send({**_late_check(), "ts": DEADLINE + CORR.correction_ms}).rewards  # inclusive


def test_a_resent_correction_is_a_duplicate_and_orphans_are_never_corrected() -> None:
    f = Feed(CORR)
    f.send(*turn("r1", horizons=HZ[:1]))
    f.send(ev("AgentEdit", "o1", ts=T0, edit_id="x"))
    f.tick(DEADLINE + 5_000)
    late = _late_check()
    assert f.send(late).rewards
    again = f.send(late)
    assert again.rewards == [] and [x["reason"] for x in again.excluded] == ["duplicate"]
    out = f.send(ev("FollowUp", "o1", ts=DEADLINE))
    assert out.rewards == [] and [r["reason"] for r in out.late] == ["late"]


def test_a_resent_correction_dated_before_the_turns_first_event_is_a_duplicate() -> None:
    """At the defaults (1 h correction window and dedup horizon), as the worker feeds records: a follow-up
    dated 50 minutes before its turn's served event corrects the turn once; resent, it is a duplicate,
    however often, and the turn's counts stay at one follow-up."""
    cfg = JoinConfig(correction_ms=3_600_000)
    f = Feed(cfg)
    f.send(ev("InferenceServed", "r1", "s1", T0))
    f.tick(T0 + cfg.settle_ms + 1_000)
    follow_up = ev("FollowUp", "r1", "s1", T0 - 3_000_000, dissatisfied=True)
    first = f.send(follow_up)
    assert [r["n_dissatisfied"] for r in first.rewards] == [1] * len(first.rewards) and first.rewards
    for _ in range(3):
        again = f.send(follow_up)
        assert again.rewards == [] and [x["reason"] for x in again.excluded] == ["duplicate"]


def test_tombstones_keep_the_turn_only_when_corrections_are_on() -> None:
    for cfg, kept in ((CORR, True), (CFG, False)):
        f = Feed(cfg)
        f.send(*turn("r1", horizons=HZ))
        f.tick(DEADLINE)
        tomb = Tombstone.from_obj(f.store.get("s:org\ts1")[4]["r1"])
        assert (tomb.turn is not None) is kept and tomb.deadline == (DEADLINE if kept else 0)
        assert Tombstone.from_obj(tomb.to_obj()) == tomb


def _corrections_workload(seed: int) -> list[tuple[bytes | None, Any]]:
    """The processor's restart workload with signals after the fact: once every turn is final (after
    its second tick), a follow-up or a check for served turns, most within the correction window, some
    past it, some resent. With the workload's own after-the-fact events, a turn is corrected at most
    twice (:data:`~rewardflow.core.corrections.KEEP_REVISIONS`: what a restart re-emits exactly)."""
    rng = random.Random(seed)
    records = workload(seed)
    served: dict[str, tuple[str, int]] = {}
    for value, headers in records:
        try:
            raws = decode_record(value, headers)
        except Exception:  # noqa: BLE001 - the workload's junk records
            continue
        for r in raws:
            if isinstance(r, dict) and r.get("event_type") == "InferenceServed":
                served.setdefault(str(r["request_id"]), (str(r["session_id"]), int(r["ts"])))
    ticks = [i for i, (_, h) in enumerate(records) if h == TICK_H]
    at = ticks[1] + 1
    extra = []
    for rid, (sid, ts) in sorted(served.items())[: 8]:
        when = ts + 1000 + CORR.settle_ms + rng.choice([10_000, 200_000, CORR.correction_ms + 50_000])
        late = ev("FollowUp", rid, sid, when, dissatisfied=True) if rng.random() < 0.5 else ev(
            "PersistenceCheck", rid, sid, when, edit_id=f"{rid}-ed", horizon_s=120, survival_score=rng.random())
        extra.append(json_record(late))
        if rng.random() < 0.3:
            extra.append(json_record(late))  # a resend
    return [*records[:at], *extra, *records[at:]]


def _most_corrections(seed: int) -> int:
    """The most revisions any turn gets in the restart-under-commits run of ``seed``."""
    f = Feed(CORR)
    for value, headers in _with_far_tick(_corrections_workload(seed), random.Random(seed)):
        f.record(value, headers)
    per = Counter(r["sample_id"] for r in f.total.rewards if r["revision"] and r["spec_version"] == "v1")
    return max(per.values(), default=0)


def _run(records: list[tuple[bytes | None, Any]]) -> tuple[list[Any], list[int], LoggedStore]:
    store = LoggedStore()
    f = Feed(CORR, store=store)
    outs, marks = [], [0]
    for value, headers in records:
        outs.append(f.record(value, headers))
        marks.append(len(store.log))
    return outs, marks, store


def test_the_workload_makes_corrections() -> None:
    outs, _, _ = _run(_corrections_workload(11))
    assert sum(1 for o in outs for r in o.rewards if r["revision"]) > 0


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_restart_anywhere_re_emits_the_revisions_of_the_uninterrupted_run(seed: int) -> None:
    records = _corrections_workload(seed)
    outs, marks, store = _run(records)
    rng = random.Random(seed)
    for x in range(-1, len(records) - 1):
        partial = rng.randrange(0, 4)
        c = rng.randint(max(0, x - 3), x + 1)
        n_writes = marks[x + 1] + min(partial, marks[x + 2] - marks[x + 1])
        f = Feed(CORR, store=snapshot(store.log, n_writes), offset=c)
        for value, headers in records[c:]:
            f.record(value, headers)
        for kind in KINDS:
            want_rows = [r for o in outs for r in getattr(o, kind)]
            got_rows = [r for o in outs[:c] for r in getattr(o, kind)] + getattr(f.total, kind)
            if kind == "rewards":
                want_rows = [r for r in want_rows if not r["provisional"]]
                got_rows = [r for r in got_rows if not r["provisional"]]
            if kind in ("late", "excluded"):  # (exclusions' watermarks: see the processor's restart tests)
                got_rows = [{**r, "watermark": 0} for r in got_rows]
                want_rows = [{**r, "watermark": 0} for r in want_rows]
            # the tables keep the last row per id (windows: a correction's delta replaces the previous one)
            assert ids_of(got_rows, kind) == ids_of(want_rows, kind), (kind, x, partial, c)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), data=st.data())
def test_restart_under_the_workers_commits_re_emits_the_same_revisions(seed: int, data: st.DataObject) -> None:
    """The processor's restart property as the worker runs (batches, lagging commits, a far tick), with
    corrections: the revisions, their window deltas and everything else come out as uninterrupted
    (for turns corrected at most KEEP_REVISIONS times; beyond: the test below)."""
    assume(_most_corrections(seed) <= KEEP_REVISIONS)
    restart_under_commits(seed, lambda label, lo, hi: data.draw(st.integers(lo, hi), label=label),
                          cfg=CORR, make=_corrections_workload)


def test_a_turn_corrected_more_often_than_kept_re_emits_its_last_revisions_after_a_restart() -> None:
    """The documented bound: a restart re-emits at most KEEP_REVISIONS revisions of one turn made by
    records not committed yet (the latest ones); none is ever different or doubled."""
    store = LoggedStore()
    f = Feed(CORR, store=store)
    f.send(*turn("r1", horizons=HZ[:1]))
    f.tick(DEADLINE)
    start = f.offset
    n = KEEP_REVISIONS + 1
    calls = [ev("ToolCall", "r1", ts=DEADLINE + 1000 + k, call_id=f"c{k}", status="broken") for k in range(n)]
    for call in calls:
        f.send(call)
    want = {r["reward_id"]: r for r in f.total.rewards if r["revision"]}
    assert {r["revision"] for r in want.values()} == set(range(1, n + 1))
    again = Feed(CORR, store=snapshot(store.log, len(store.log)), offset=start)  # crashed before any commit
    for call in calls:  # the same records again: redeliveries
        again.send(call)
    got = [r for r in again.total.rewards if r["revision"]]
    assert len({r["reward_id"] for r in got}) == len(got) and all(want[r["reward_id"]] == r for r in got)
    assert {r["revision"] for r in got} == set(range(n - KEEP_REVISIONS + 1, n + 1))
