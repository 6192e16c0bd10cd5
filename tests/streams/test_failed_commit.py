"""A commit the broker refused must not let the worker forget what a replay will bring back.

Faust's consumer moves its ``_committed_offset`` even when a commit fails (a
commit during a rebalance: ``CommitFailedError ... already rebalanced``). The
worker once passed that offset to the core, which then pruned the seen ids of
records the broker still had to replay; after a kill -9 their events came back
as *late* (seen in the six-kill fault test). The fault hook
``RF_FAULT_FAIL_COMMITS_FROM`` makes every commit past the probe fail that way.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from rewardflow.kafka import topics as T
from tests.factories import T0, turn
from tests.streams.kafka_io import json_record, tick_record

pytestmark = pytest.mark.kafka
FLUSH_WM = 2**53


def test_replay_after_refused_commits_is_recognised_not_late(deploy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RF_FAULT_FAIL_COMMITS_FROM", "0:1")  # offset 0 is the probe: its commit (to 1) goes through
    monkeypatch.setenv("RF_DEBUG_BATCHES", "1")  # one log line per batch, with the watermark after it
    # no idle or wake-up ticks: one on partition 0 during the deployment's probe would be past the
    # fault's offset, and the probe's commit would never go through
    d = deploy(idle_timeout_s=30.0)
    events = turn("rA", "sA", T0, horizons=(30, 120))
    ids = {e["event_id"] for e in events}
    d.raw.send_many([(0, *json_record(*events))])
    # finalise the turn well before the flush (its tombstone is then pruned by the flush tick)
    d.raw.send_many([(0, *tick_record(T0 + 3_600_000, d.settings))])
    d.out.until(lambda o: len(o.finals("rA")) == 2, 30, "rA final")
    time.sleep(2.5)  # Faust tries (and fails) to commit past the tick: its in-memory offset moves on
    (flush,) = d.raw.send_many([(0, *tick_record(FLUSH_WM, d.settings))])  # (capped at the broker's clock)

    def flushed(log: str) -> bool:
        return any(int(b) >= flush for b in re.findall(r"batch p=0 offsets \d+\.\.(\d+)", log))

    deadline = time.monotonic() + 30
    while not flushed(log := d.worker.log_tail(200_000)):
        assert time.monotonic() < deadline and d.worker.alive, f"the flush tick was not processed:\n{log[-3000:]}"
        time.sleep(0.2)
    time.sleep(2.5)
    log = d.worker.log_tail(200_000)
    assert "fault hook: commit of" in log, log
    before = d.out.counts()

    d.worker.kill()
    d.worker.restart(60)
    # the restarted worker reads again from the broker's commit (just past the probe): the turn's
    # record is a redelivery, its valid rows are re-emitted with the same ids
    out = d.out.until(lambda o: sum(r["event_id"] in ids for r in o.rows[T.VALID]) >= 2 * len(ids)
                      or bool(o.rows[T.LATE]), 40, "the replay").settle(1.0)
    assert out.rows[T.LATE] == [], out.rows[T.LATE]
    valid = [r["event_id"] for r in out.rows[T.VALID] if r["event_id"] in ids]
    # read again at least once (more when the restart's rebalances replay it again: its commits keep failing)
    assert set(valid) == ids and len(valid) >= 2 * len(ids)
    assert len({r["reward_id"] for r in out.finals("rA")}) == 2  # re-emitted or not, one id per spec
    assert out.counts()[T.LATE] == before[T.LATE] == 0
