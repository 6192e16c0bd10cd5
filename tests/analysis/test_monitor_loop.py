"""The live monitor: which windows a round evaluates, and that what it reads is bounded by the settings."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from rewardflow.analysis.goodhart import MonitorConfig, evaluate_windows
from rewardflow.analysis.monitor_loop import CHUNK_WINDOWS, FIRST_LOOKBACK_WINDOWS, MonitorLoop, chunks
from rewardflow.settings import Settings
from tests.analysis.test_goodhart import CLEAN, V1, W0, WINDOW_MS, Behaviour, _turns, windows_direct

HACKED = Behaviour(hack="over-ask", hack_rate=0.8)


def test_chunks_cover_a_span_in_pieces_of_at_most_n_windows() -> None:
    assert list(chunks(0, 10, 1, 4)) == [(0, 4), (4, 8), (8, 10)]
    assert list(chunks(5, 5, 1, 4)) == []
    assert max(b - a for a, b in chunks(0, 10**9, 60_000)) == CHUNK_WINDOWS * 60_000


def test_a_round_evaluates_what_closed_or_changed_since_the_last_not_the_history(tmp_path: Any) -> None:
    loop = MonitorLoop(Settings(home=tmp_path, correction_window_ms=3_600_000), None)
    horizon = W0 + 1_000 * WINDOW_MS
    lo = horizon - FIRST_LOOKBACK_WINDOWS * WINDOW_MS - 3_600_000
    assert loop.affected(300, horizon, set()) == [(lo, horizon)]  # a fresh loop: a bounded look back
    loop.through[300] = horizon
    later = horizon + 3 * WINDOW_MS
    assert loop.affected(300, later, set()) == [(horizon, later)]  # only what closed since
    old = W0 + 10 * WINDOW_MS  # a window whose partials changed (a correction, a partition reporting late):
    trailing = MonitorConfig().trailing_windows  # it, and the windows whose trailing baseline holds it
    assert loop.affected(300, later, {old}) == [(old, old + (trailing + 1) * WINDOW_MS), (horizon, later)]
    assert loop.affected(300, horizon - WINDOW_MS, {old}) == [(old, old + (trailing + 1) * WINDOW_MS)]
    with_baseline = MonitorLoop(Settings(home=tmp_path), "base")
    with_baseline.through[300] = horizon
    assert with_baseline.affected(300, horizon, {old}) == [(old, old + WINDOW_MS)]


def _row(template: dict[str, Any], start: int, partition: int) -> dict[str, Any]:
    return {**template, "window_start": start, "window_end": start + WINDOW_MS, "source_partition": partition,
            "window_id": f"w-{start}-{partition}", "window_key": f"k-{start}"}


@pytest.mark.clickhouse
def test_the_horizon_is_the_earliest_of_each_partitions_latest_window(ch_db: Any) -> None:
    from rewardflow.analysis.source import fetch_window_horizons
    from rewardflow.cli.rewards import Store

    template = dict(windows_direct(_turns(1, {"c": [CLEAN]}, per_window=5), V1)[0])
    store = Store(None, ch_db.client)
    store.insert("reward_windows", [_row(template, W0, 0), _row(template, W0 + WINDOW_MS, 0),
                                    _row(template, W0, 1)], "t1")
    settings = ch_db.settings()
    assert fetch_window_horizons(settings) == {300: W0}  # partition 1 has not moved past W0: only before it
    store.insert("reward_windows", [_row(template, W0 + 2 * WINDOW_MS, 1)], "t2")
    assert fetch_window_horizons(settings) == {300: W0 + WINDOW_MS}


@pytest.mark.clickhouse
@pytest.mark.kafka
def test_a_round_publishes_each_alert_of_the_closed_windows_once(ch_db: Any, kafka_broker: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from rewardflow.cli.rewards import Store
    from rewardflow.kafka import topics as T
    from rewardflow.kafka.provision import ensure_topics

    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"m{uuid.uuid4().hex[:8]}.",
                              partitions=1, window_sizes_s=[300], correction_window_ms=0)
    ensure_topics(settings)
    rows = windows_direct(_turns(7, {"cand": [CLEAN] * 4 + [HACKED, CLEAN, CLEAN]}), V1)
    expected = [a for a in evaluate_windows(rows, None, MonitorConfig(baseline="trailing"))
                if a["window_start"] < W0 + 6 * WINDOW_MS]  # the last window is not closed yet
    assert expected and {a["window_start"] for a in expected} == {W0 + 4 * WINDOW_MS}
    Store(None, ch_db.client).insert("reward_windows", rows, "t-windows")
    loop = MonitorLoop(settings, None)
    assert loop.round() == len(expected)
    assert loop.round() == 0  # published once
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "t", "enable.auto.commit": False})
    low, high = consumer.get_watermark_offsets(TopicPartition(settings.topic(T.ALERTS), 0), timeout=30)
    consumer.close()
    assert high - low == len({a["checkpoint_id"] for a in expected})  # one message per checkpoint a round
    # partials stored later for windows the loop evaluated already (a correction, a partition reporting late)
    late = windows_direct(_turns(8, {"late": [CLEAN] * 4 + [HACKED, CLEAN]}), V1)
    again = evaluate_windows(late, None, MonitorConfig(baseline="trailing"))
    assert again and {a["window_start"] for a in again} == {W0 + 4 * WINDOW_MS}
    Store(None, ch_db.client).insert("reward_windows", late, "t-late")
    assert loop.round() == len(again)  # are evaluated again
    assert loop.round() == 0
