"""Retention counts from insertion, and a change that would delete stored rows needs a confirmation."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from rewardflow.clickhouse.migrate import migrate
from rewardflow.clickhouse.retention import RetentionRefused, current_ttl
from rewardflow.clickhouse.tables import EVENTS
from tests.clickhouse.rows import event_row
from tests.conftest_clickhouse import ChDatabase

pytestmark = pytest.mark.clickhouse

DAY_MS = 86_400_000


def _insert(client: Any, rows: list[dict[str, Any]], inserted_days_ago: int | None = None) -> None:
    names = list(EVENTS.record_columns)
    data = [[r[n] for n in names] for r in rows]
    if inserted_days_ago is not None:  # rows stored long ago (ClickHouse fills _inserted_at otherwise)
        names.append("_inserted_at")
        at = datetime.now(timezone.utc) - timedelta(days=inserted_days_ago)
        data = [[*d, at] for d in data]
    client.insert("events", data, column_names=names)


def _count(client: Any) -> int:
    return int(client.command("SELECT count() FROM events"))


def test_a_backfill_of_old_events_is_kept(ch_db: ChDatabase) -> None:
    old = int(time.time() * 1000) - 200 * DAY_MS
    _insert(ch_db.client, [event_row(i, ts=old + i) for i in range(50)])
    ch_db.client.command("OPTIMIZE TABLE events FINAL")  # a merge applies the TTL
    assert _count(ch_db.client) == 50
    assert "_inserted_at" in current_ttl(ch_db.client, EVENTS)


def test_a_shorter_retention_refuses_then_reports_what_it_deleted(ch_db: ChDatabase) -> None:
    assert migrate(ch_db.client, events_ttl_days=3650).ttl_changed == ["events"]
    _insert(ch_db.client, [event_row(i) for i in range(30)], inserted_days_ago=120)
    _insert(ch_db.client, [event_row(100 + i) for i in range(20)])
    with pytest.raises(RetentionRefused, match=r"events: retention 3650 days -> .*90 DAY would delete 30 stored rows.*--allow-data-loss"):
        migrate(ch_db.client, events_ttl_days=90)
    assert "toIntervalDay(3650)" in current_ttl(ch_db.client, EVENTS) and _count(ch_db.client) == 50
    report = migrate(ch_db.client, events_ttl_days=90, allow_data_loss=True)
    assert report.deleted == {"events": 30} and _count(ch_db.client) == 20
    assert migrate(ch_db.client, events_ttl_days=90).ttl_changed == []


def test_a_shorter_retention_that_deletes_nothing_needs_no_confirmation(ch_db: ChDatabase) -> None:
    _insert(ch_db.client, [event_row(i) for i in range(10)], inserted_days_ago=5)
    assert migrate(ch_db.client, events_ttl_days=7).deleted == {"events": 0}
    assert _count(ch_db.client) == 10


def test_an_event_time_ttl_is_moved_to_insertion_time_without_loss(ch_db: ChDatabase) -> None:
    ch_db.client.command("ALTER TABLE events MODIFY TTL toDateTime(fromUnixTimestamp64Milli(ts, 'UTC')) + INTERVAL 90 DAY",
                         settings={"materialize_ttl_after_modify": 0})
    old = int(time.time() * 1000) - 30 * DAY_MS
    _insert(ch_db.client, [event_row(i, ts=old + i) for i in range(10)])
    assert migrate(ch_db.client).deleted == {"events": 0}
    assert "_inserted_at" in current_ttl(ch_db.client, EVENTS) and _count(ch_db.client) == 10


def test_a_backfill_200_days_old_is_replayable(ch_db: ChDatabase) -> None:
    from rewardflow.rewards.replay import replay_events
    from tests.rewards.test_replay import CFG, V1, _run_stream, _stream_events

    events = _stream_events(sessions=10)
    shift = int(time.time() * 1000) - 200 * DAY_MS - min(e["ts"] for e in events)
    rows, live = _run_stream([{**e, "ts": e["ts"] + shift} for e in events])
    _insert(ch_db.client, list(rows))
    ch_db.client.command("OPTIMIZE TABLE events FINAL")
    stored = ch_db.client.query("SELECT org_id, session_id, request_id, event_id, source_partition, source_offset, "
                                "payload FROM events "
                                "ORDER BY source_partition, source_offset").named_results()
    replayed = replay_events(list(stored), V1, CFG)
    assert len(rows) > 100 and _count(ch_db.client) == len(rows)
    assert sorted(r["reward_id"] for r in replayed) == sorted(r["reward_id"] for r in live) and live
