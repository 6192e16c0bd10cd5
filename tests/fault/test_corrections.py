"""A late persistence check on the real pipeline: revision 1 after the trainer's cursor, through a kill -9.

A turn is finalised without its 120 s check (the laptop slept). The trainer pulls its revision 0
and commits its cursor. The check then arrives, 60 s of event time after the turn's deadline
(inside the correction window), and the worker is SIGKILLed right after it is produced, before
or after it processed it. Once restarted: ClickHouse holds exactly one revision 1 per spec, equal
to what the pure core gives the turn with the check on time; the trainer's next pull hands out
those rows and nothing else; the merged windows count the turn as corrected.
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Any

import pytest

from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.processor import PartitionProcessor
from rewardflow.events.wire import encode_json
from rewardflow.rewards.registry import active_specs
from rewardflow.trainer.reader import RewardReader
from tests.factories import T0, ev, turn
from tests.fault.pipeline import SinkThread
from tests.fault.verify import recompute_windows
from tests.streams.kafka_io import RawProducer, tick_record

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(300)]
JSON_H = [("rf-format", b"json")]
TIMING = ("finalised_wm", "finalised_by", "reward_id", "revision", "_seq")


def _wait(what: str, probe: Any, healthy: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        healthy()
        got = probe()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _pull(ch_db: Any) -> list[dict[str, Any]]:
    """The trainer's new final rows, committed (Arrow maps back to dicts)."""
    reader = RewardReader(ch_db.dsn, trainer="ppo", settle_s=0, settings=ch_db.settings())
    try:
        rows = [{k: dict(v) if isinstance(v, list) else v for k, v in r.items()} for b in reader for r in b.to_pylist()]
        reader.commit()
        return rows
    finally:
        reader.close()


def _on_time(settings: Any, events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The final rows the pure core gives the turn with every signal in time, per spec."""
    proc = PartitionProcessor(JoinConfig.from_settings(settings), active_specs(settings), DictStore(), "raw", 0)
    out = proc.process(encode_json(events), JSON_H, 0, 0)
    out.extend(proc.process(b'{"wm": 2305843009213693952}', [("rf-format", b"tick")], 1, 0))
    return {r["spec_version"]: r for r in out.rewards if not r["provisional"]}


def test_a_late_check_corrects_its_turn_once_through_a_kill_and_reaches_the_trainer_after_its_cursor(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack) -> None:
    d = deployment()
    s = d.settings
    assert s.correction_window_ms >= 120_000
    sink_settings = d.sink_settings(ch_db.dsn.secret)
    sink = SinkThread(sink_settings)
    stack.callback(sink.stop)
    raw = RawProducer(s)

    def healthy() -> None:
        sink.check()
        assert d.worker.alive, f"the worker exited:\n{d.worker.log_tail(3000)}"

    hz = tuple(s.horizons_s)
    events = turn("r1", "s1", horizons=hz[:1])  # no check at the final horizon yet
    deadline = T0 + 1000 + hz[-1] * 1000 + s.grace_ms
    raw.send_many([(0, encode_json(events), JSON_H), (0, *tick_record(deadline, s))])

    def finals(revision: int) -> list[dict[str, Any]]:
        return list(ch_db.client.query(
            "SELECT spec_version, revision FROM rewards FINAL WHERE sample_id = 'r1' AND provisional = 0 "
            "AND revision = {r:UInt32}", parameters={"r": revision}).named_results())

    specs = {sp.version for sp in active_specs(s)}
    _wait("revision 0 in ClickHouse", lambda: len(finals(0)) == len(specs), healthy)
    first = _pull(ch_db)
    assert {(r["sample_id"], r["revision"]) for r in first} == {("r1", 0)} and len(first) == len(specs)

    late = ev("PersistenceCheck", "r1", "s1", deadline + 60_000, edit_id="r1-ed", horizon_s=hz[-1], survival_score=0.3)
    raw.send_many([(0, encode_json([late]), JSON_H)])
    time.sleep(random.Random(7).uniform(0.0, 0.8))
    d.worker.kill()  # between the signal and its revision, or just after: either way nothing lost or doubled
    d.worker.restart(60)
    _wait("revision 1 in ClickHouse", lambda: len(finals(1)) == len(specs), healthy)
    time.sleep(2 * sink_settings.sink_batch_seconds + 1.0)  # a doubled revision would have landed by now
    stored = ch_db.client.query("SELECT spec_version, revision, count() AS n FROM rewards FINAL WHERE sample_id = 'r1' "
                                "AND provisional = 0 GROUP BY spec_version, revision").named_results()
    assert sorted((r["spec_version"], r["revision"], r["n"]) for r in stored) == sorted(
        (v, rev, 1) for v in specs for rev in (0, 1))

    second = _pull(ch_db)
    assert {(r["sample_id"], r["revision"]) for r in second} == {("r1", 1)} and len(second) == len(specs)
    want = _on_time(s, [*events, {**late, "ts": T0 + 1000 + hz[-1] * 1000}])
    for row in second:
        got = {k: v for k, v in row.items() if k not in TIMING and k in want[row["spec_version"]]}
        assert got == {k: v for k, v in want[row["spec_version"]].items() if k not in TIMING}
        assert row["finalised_by"] == "correction"
    assert _pull(ch_db) == []

    # close the turn's windows; merged, they count it as its latest revision (its partial plus its delta)
    raw.send_many([(0, *tick_record(deadline + 10 * max(s.window_sizes_s) * 1000, s))])
    want_windows = recompute_windows(second, list(s.window_sizes_s))

    def merged() -> dict[str, Any]:
        rows = {w["window_key"]: w for w in ch_db.client.query("SELECT * FROM windows_merged").named_results()}
        return rows if all(rows.get(k, {}).get("samples") == 1 for k in want_windows) else {}

    got_windows = _wait("the turn's windows closed", merged, healthy)
    for key, w in want_windows.items():
        assert got_windows[key]["samples"] == w["samples"] == 1
        assert {str(h): n for h, n in got_windows[key]["checked"].items() if n} == {
            str(h): n for h, n in w["checked"].items()}
        assert abs(got_windows[key]["reward_sum"] - w["reward_sum"]) < 1e-9
