"""kill -9 of the worker mid-stream: after restart its distinct outputs are those of an uninterrupted run.

Ground truth is the raw topic itself (ticks included) replayed through fresh
processors: the core is deterministic in the record sequence, so that replay
is exactly what a worker that never crashed would have emitted.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from rewardflow.kafka import topics as T
from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.processor import PartitionProcessor
from rewardflow.events.wire import decode_record
from rewardflow.rewards.spec import RewardSpec
from tests.factories import T0, ev, turn
from tests.streams.kafka_io import OutputCollector, avro_record, json_record, read_raw, tick_record
from tests.streams.replay import FIELD_OF, ID_OF, on_wire, replay, rows_by_id
from tests.streams.scenario import varied_turn

FLUSH_WM = 2**53  # a tick this far ahead settles everything and stops the idle clock for good
Record = tuple[int, bytes, Any]
JSON_H = [("rf-format", b"json")]


def session_records(rng: random.Random, sessions: range, turns: int, start: int, hz: list[int]) -> tuple[
        list[Record], dict[str, list[dict[str, Any]]]]:
    """Each turn as two records, its first 1.5 s and the rest; records in the order of their newest event.

    Sent that way no event is late (every turn is still open when its second record comes), yet a
    record's events are out of order and a session's turns are spread over many records.
    """
    timed: list[tuple[int, int, Record]] = []
    by_turn: dict[str, list[dict[str, Any]]] = {}
    for k in sessions:
        for j in range(turns):
            rid, ts = f"r{k}-{j}", start + j * 20_000 + k * 100
            events = varied_turn(rng, rid, f"s{k}", ts, hz, checkpoint=f"ck-{j % 2}", surface="agent")
            by_turn[rid] = events
            encode = json_record if (k + j) % 2 else avro_record
            for part in ([e for e in events if e["ts"] <= ts + 1_500], [e for e in events if e["ts"] > ts + 1_500]):
                if part:
                    timed.append((max(e["ts"] for e in part), len(timed), (k % 2, *encode(*part))))
    return [r for _, _, r in sorted(timed)], by_turn


def with_late_and_resent(records: list[Record], every: int) -> tuple[list[Record], list[dict[str, Any]], int]:
    """Every ``every`` records, a day-old event (late) and a client resend of an earlier record."""
    out: list[Record] = []
    late: list[dict[str, Any]] = []
    n_resent = 0
    for i, rec in enumerate(records):
        out.append(rec)
        if i % every == every - 1:
            late.append(ev("FollowUp", f"old{i}", f"s-old{i}", T0 - 86_400_000))
            out.append((i % 2, *json_record(late[-1])))
            out.append(records[i - every // 2])
            n_resent += len(decode_record(records[i - every // 2][1], records[i - every // 2][2]))
    return out, late, n_resent


def distinct(out: OutputCollector) -> dict[str, dict[str, list[dict[str, Any]]]]:
    return {topic: rows_by_id(topic, out.rows[topic]) for topic in ID_OF}


@pytest.mark.kafka
def test_kill_9_mid_stream_then_restart_gives_the_outputs_of_an_uninterrupted_run(deploy: Any) -> None:
    d = deploy(worker_batch_records=10)  # the backlog takes ~80 batches, each confirmed: the kill lands between two
    hz, rng, n_specs = list(d.settings.horizons_s), random.Random(3), 2
    records, turns = session_records(rng, range(40), 8, T0, hz)
    records, late, n_resent = with_late_and_resent(records, 10)
    n_events = sum(len(e) for e in turns.values())

    # 1. a backlog of ~770 records; SIGKILL while the worker is working through it
    d.raw.send_many(records)
    d.out.until(lambda o: len(o.rows[T.VALID]) >= n_events // 3, 30, "a third of the events processed")
    at_kill = len(d.out.rows[T.VALID])
    d.worker.kill()
    assert at_kill < n_events, "the worker finished before it was killed: make the backlog larger"

    # 2. restart; it finishes the backlog, then its idle clock settles every turn and closes the windows
    d.worker.restart()
    try:
        d.out.until(lambda o: len({r["reward_id"] for r in o.finals()}) == len(turns) * n_specs, 40,
                    "every first-stream turn final")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(d, turns)}") from None

    # 3. stop while only idle ticks flow; a tick is the first record the restarted worker reads
    d.worker.stop()
    d.raw.send_many([(p, *tick_record(T0, d.settings)) for p in (0, 1)])
    d.worker.restart()
    d.worker.wait_caught_up()
    time.sleep(1.5)  # idle clock periods with nothing new read after that tick

    # 4. signals for first-stream turns after they were finalised (within the correction window: each
    #    corrects its turn), then a second stream an hour later, resends, malformed records
    records2, turns2 = session_records(rng, range(100, 120), 3, T0 + 3_600_000, hz)
    late2 = [ev("FollowUp", f"r{k}-0", f"s{k}", T0 + 10_000, dissatisfied=True) for k in range(10)]
    resent2 = records2[:6]
    broken = [(0, b"{not json", JSON_H), (1, b"\x00\x00\x00\x00\x63oops", None)]
    d.raw.send_many([(k % 2, *json_record(e)) for k, e in enumerate(late2)] + records2 + resent2 + broken)
    d.raw.send_many([(p, *tick_record(FLUSH_WM, d.settings)) for p in (0, 1)])
    turns.update(turns2)
    n_resent += sum(len(decode_record(value, headers)) for _, value, headers in resent2)

    # everything read and committed (so its outputs were flushed): the raw topic is now the whole input
    d.worker.wait_caught_up()
    got = distinct(d.out.settle(0.5))
    truth = {topic: rows_by_id(topic, on_wire(getattr(replay(d.settings, read_raw(d.settings)), FIELD_OF[topic])))
             for topic in ID_OF}
    for topic in ID_OF:
        missing, extra = set(truth[topic]) - set(got[topic]), set(got[topic]) - set(truth[topic])
        assert not missing and not extra, f"{topic}: {len(missing)} ids missing, {len(extra)} unexpected"
        for row_id, rows in got[topic].items():
            want = truth[topic][row_id][0]
            for r in rows:
                diff = {k: (r.get(k), want.get(k)) for k in set(r) | set(want) if r.get(k) != want.get(k)}
                assert not diff, f"{topic} {row_id}: rows differ (got, uninterrupted): {diff}"

    # and the simple counts an uninterrupted run must give
    first = [rows[0] for rows in got[T.REWARDS].values() if rows[0]["revision"] == 0]
    assert len(first) == len(turns) * n_specs, "final rewards != turns x specs (events routed late?)"
    revised = [rows[0] for rows in got[T.REWARDS].values() if rows[0]["revision"]]
    assert {(r["sample_id"], r["revision"]) for r in revised} == {(e["request_id"], 1) for e in late2}
    assert len(revised) == len(late2) * n_specs and all(r["n_dissatisfied"] >= 1 for r in revised)
    sent = {e["event_id"]: e for events in [*turns.values(), late2] for e in events}
    assert set(got[T.VALID]) == set(sent), (
        f"valid ids: {len(set(sent) - set(got[T.VALID]))} of the sent events missing, e.g. "
        f"{[sent[i] for i in sorted(set(sent) - set(got[T.VALID]))[:2]]}; {len(set(got[T.VALID]) - set(sent))} unexpected")
    assert {r[0]["event_id"] for r in got[T.LATE].values()} == {e["event_id"] for e in late}
    assert len(got[T.LATE]) == len(late)
    assert len(got[T.DEADLETTERS]) == len(broken)
    assert sorted(r[0]["reason"] for r in got[T.EXCLUSIONS].values()) == ["duplicate"] * n_resent
    assert len(got[T.WINDOWS]) > 0
    assert d.worker.starts == 3


def _diagnose(d: Any, turns: dict[str, list[dict[str, Any]]]) -> str:
    """Which turns lack a final reward, on which partitions, and what the raw topic ends with."""
    final = {r["sample_id"] for r in d.out.finals()}
    missing = sorted(set(turns) - final)
    parts = {int(turns[rid][0]["session_id"][1:]) % 2 for rid in missing}
    raw = read_raw(d.settings)
    tails = {p: [(r.offset, (r.headers or [(None, b"")])[0][1], (r.value or b"")[:40]) for r in recs[-3:]]
             for p, recs in raw.items()}
    late = [r["event_id"] for r in d.out.rows[T.LATE]]
    seen = {rid: (sum(r["request_id"] == rid for r in d.out.rows[T.VALID]), len(turns[rid]),
                  [x["reason"] for x in d.out.rows[T.EXCLUSIONS] + d.out.rows[T.LATE] if x["request_id"] == rid])
            for rid in missing[:3]}
    replayed = {r["sample_id"] for r in replay(d.settings, raw).rewards if not r["provisional"]}
    return (f"{len(missing)} turns without a final reward (e.g. {missing[:5]}) on partitions {sorted(parts)}; "
            f"(valid rows, events, exclusions) of those: {seen}; a replay of the raw topic finalises "
            f"{sorted(set(missing) & replayed)[:5]} of them; {len(late)} late rows; prefix {d.settings.topic_prefix}; "
            f"raw topic sizes {({p: len(v) for p, v in raw.items()})}, tails {tails}")


def test_a_late_row_reread_after_a_restart_equals_the_first() -> None:
    """Pure core, no broker: the state was stored after record 3, the commit was at record 2."""
    cfg = JoinConfig(horizons_s=(30, 120), grace_ms=1000, lateness_ms=500, window_sizes_s=(60,))
    specs = [RewardSpec(version="v1")]
    records = [json_record(*turn("r1", horizons=(30, 120))),
               json_record(ev("FollowUp", "x", "s2", ts=T0 + 200_000)),  # r1 final
               json_record(ev("UserAction", "r1", ts=T0 + 2_000, action="undo")),  # late
               json_record(ev("FollowUp", "y", "s3", ts=T0 + 400_000))]
    store = DictStore()
    first = PartitionProcessor(cfg, specs, store, "raw", 0)
    before = [first.process(v, h, i, 0) for i, (v, h) in enumerate(records)]
    restarted = PartitionProcessor(cfg, specs, store, "raw", 0)
    again = [restarted.process(v, h, i, 0) for i, (v, h) in enumerate(records) if i >= 2]
    assert again[0].late == before[2].late


@pytest.mark.kafka
def test_turns_finalised_and_pruned_by_a_batch_that_died_before_its_outputs_are_re_emitted(
        deploy: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """One batch finalises turns by the watermark, then a far-future tick prunes their tombstones; the
    worker dies with that state in the changelog and none of the batch's outputs sent (the fault hook
    ``RF_FAULT_DIE_BEFORE_OUTPUTS``). The restarted worker replays the batch, whose events are all
    redeliveries: only the pruned tombstones, held for it, can give the final rewards back."""
    marker = tmp_path / "died"
    monkeypatch.setenv("RF_FAULT_DIE_BEFORE_OUTPUTS", str(marker))
    d = deploy()
    settle = JoinConfig.from_settings(d.settings).settle_ms
    d.worker.stop()  # what follows reaches the restarted worker in one batch
    turns = [turn(f"r{i}", "s1", T0 + i * 1000, horizons=(30, 120)) for i in range(5)]
    later = ev("InferenceServed", "x", "s1", ts=T0 + 10 * settle)  # its event time finalises the five
    d.raw.send_many([(0, *json_record(*evs)) for evs in turns] + [(0, *json_record(later)), (0, *tick_record(FLUSH_WM, d.settings))])
    d.worker.start()
    assert d.worker.wait_exit(60) == 9, d.worker.log_tail()
    first, last = (int(x) for x in marker.read_text().split(":")[1].split(".."))
    assert last - first + 1 >= 7, f"the batch that died was {first}..{last}: not all 7 records, not the scenario"
    d.worker.restart(60)
    want = {f"r{i}" for i in range(5)} | {"x"}
    out = d.out.until(lambda o: {r["sample_id"] for r in o.finals()} >= want, 40, "every turn final").settle(1.0)
    finals = out.finals()
    assert {r["sample_id"] for r in finals} == want and len(finals) == len({r["reward_id"] for r in finals}) == 12
    assert out.rows[T.LATE] == []
