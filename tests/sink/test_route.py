"""The sink against a real Kafka broker and ClickHouse engine: exactly once, commit last."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rewardflow.clickhouse.errors import ClickHouseUnavailable
from rewardflow.sink.route import RewardSink
from rewardflow.sink.config import SinkConfigError
from tests.clickhouse.rows import T0, committed, event_row, produce, pump, reset_offsets, reward, values
from tests.conftest_clickhouse import ChDatabase

pytestmark = [pytest.mark.clickhouse, pytest.mark.kafka]


def _count(client: Any, table: str, final: bool = False) -> int:
    return int(client.command(f"SELECT count() FROM {table}{' FINAL' if final else ''}"))


def _sink(ch_db: ChDatabase, kafka_broker: Any, topic: str, logical: str, group: str, **kw: Any) -> RewardSink:
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, sink_batch_rows=kw.pop("rows", 40),
                              sink_batch_seconds=kw.pop("seconds", 0.2))
    return RewardSink(settings, topics={topic: logical}, group_id=group, **kw)


def test_rows_land_once_even_when_the_whole_topic_is_replayed(ch_db: ChDatabase, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    topic = unique_topic("rewards", partitions=2)
    rows = [reward(i) for i in range(300)]
    sink = _sink(ch_db, kafka_broker, topic, "rewards", unique_group)
    # produced in rounds while the sink runs, so batches are cut by time as well as by size
    for k in range(0, 300, 60):
        produce(kafka_broker.bootstrap, topic, values(rows[k:k + 60], per_record=7))
        target = k + 60
        pump(sink, lambda: sink.metrics.rows_written["rewards"] >= target)
    sink.close()
    assert _count(ch_db.client, "rewards") == 300
    first_batches = sink.metrics.batches["rewards"]

    reset_offsets(kafka_broker.bootstrap, unique_group, topic, 2)
    replay = _sink(ch_db, kafka_broker, topic, "rewards", unique_group, rows=1000)
    pump(replay, lambda: replay.metrics.rows_written["rewards"] >= 300)
    replay.close()
    assert replay.metrics.replayed_batches == first_batches  # same ranges -> same tokens
    assert _count(ch_db.client, "rewards") == 300  # dropped by the insert tokens, not by merges
    assert _count(ch_db.client, "rewards", final=True) == 300
    assert ch_db.client.command("SELECT uniqExact(reward_id) FROM rewards") == 300


def test_row_values_round_trip(ch_db: ChDatabase, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    topic = unique_topic("events.valid")
    rows = [event_row(i) for i in range(25)]
    produce(kafka_broker.bootstrap, topic, values(rows, per_record=4))
    sink = _sink(ch_db, kafka_broker, topic, "events.valid", unique_group)
    pump(sink, lambda: sink.metrics.rows_written["events"] >= 25)
    sink.close()
    got = ch_db.client.query("SELECT * FROM events ORDER BY source_offset").named_results()
    stored = [{k: v for k, v in r.items() if not k.startswith("_")} for r in got]
    assert stored == rows
    assert committed(kafka_broker.bootstrap, unique_group, topic, 1) == {0: 7}


def test_a_batch_spanning_more_partitions_than_the_engines_default_insert_limit_is_written(
        ch_db: ChDatabase, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    """events is partitioned by day of event time, which a client chooses: one batch of rows dated on 150
    days is stored, not retried for ever (the engine refuses over 100 partitions an insert by default)."""
    topic = unique_topic("events.valid")
    rows = [event_row(i, ts=T0 - i * 86_400_000) for i in range(150)]
    produce(kafka_broker.bootstrap, topic, values(rows, per_record=150))
    sink = _sink(ch_db, kafka_broker, topic, "events.valid", unique_group, rows=1000)
    pump(sink, lambda: sink.metrics.rows_written["events"] >= 150)
    sink.close()
    assert _count(ch_db.client, "events") == 150
    assert ch_db.client.command("SELECT uniqExact(_partition_id) FROM events") == 150
    assert committed(kafka_broker.bootstrap, unique_group, topic, 1) == {0: 1}


def test_no_commit_while_clickhouse_fails_then_resume(ch_db: ChDatabase, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str, caplog: pytest.LogCaptureFixture) -> None:
    topic = unique_topic("rewards")
    down = {"on": True, "calls": 0}

    def fault(table: str) -> None:
        down["calls"] += 1
        if down["on"]:
            raise ClickHouseUnavailable("injected outage")

    produce(kafka_broker.bootstrap, topic, values([reward(i) for i in range(50)], per_record=5))
    sink = _sink(ch_db, kafka_broker, topic, "rewards", unique_group, fault=fault)
    pump(sink, lambda: sink.metrics.retries >= 3)
    assert _count(ch_db.client, "rewards") == 0
    assert committed(kafka_broker.bootstrap, unique_group, topic, 1)[0] < 0  # nothing committed
    assert sink.metrics.snapshot()["unavailable"] is True
    assert "ClickHouse unavailable (Code" in caplog.text or "ClickHouse unavailable (" in caplog.text
    down["on"] = False
    pump(sink, lambda: sink.metrics.rows_written["rewards"] >= 50, timeout=60)
    assert _count(ch_db.client, "rewards") == 50
    assert committed(kafka_broker.bootstrap, unique_group, topic, 1) == {0: 10}
    sink.close()


def test_a_rejected_row_goes_to_dead_letters_and_the_partition_moves_on(ch_db: ChDatabase, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    topic = unique_topic("rewards")
    rows = [reward(i) for i in range(20)]
    rows[7]["latency_ms"] = "slow"  # type: ignore[typeddict-item]
    rows[13]["n_edits"] = -1
    vals = values(rows, per_record=4) + [b"not json at all"]
    produce(kafka_broker.bootstrap, topic, vals)
    sink = _sink(ch_db, kafka_broker, topic, "rewards", unique_group)
    pump(sink, lambda: committed(kafka_broker.bootstrap, unique_group, topic, 1)[0] == len(vals), timeout=60)
    sink.close()
    assert _count(ch_db.client, "rewards") == 18
    dead = ch_db.client.query("SELECT source_offset, index, reason_code, reason, event_id FROM dead_letters ORDER BY source_offset, index").result_rows
    assert [(d[0], d[1], d[2]) for d in dead] == [(1, 3, "sink_rejected"), (3, 1, "sink_rejected"), (5, -1, "sink_not_a_list")]
    assert dead[0][4] == rows[7]["reward_id"] and "latency_ms" in dead[0][3]
    assert sink.metrics.dead_lettered == 3


def test_auto_commit_is_refused(ch_db: ChDatabase, kafka_broker: Any) -> None:
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap)
    with pytest.raises(SinkConfigError, match="enable.auto.commit"):
        RewardSink(settings, consumer_overrides={"enable.auto.commit": True})


def test_sink_thread_serves_reads_while_running_and_flushes_on_stop(ch_db: ChDatabase, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    import os
    import subprocess
    import sys
    import threading

    topic = unique_topic("rewards")
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, sink_batch_rows=1_000_000, sink_batch_seconds=3600)
    from rewardflow.readapi.server import ReadServer

    sink = RewardSink(settings, topics={topic: "rewards"}, group_id=unique_group)
    reads = ReadServer(sink.dsn, settings).start() if ch_db.dsn.embedded else None  # as rewardflow run does
    stop = threading.Event()
    thread = threading.Thread(target=sink.run, args=(stop,))
    thread.start()
    try:
        produce(kafka_broker.bootstrap, topic, values([reward(i) for i in range(30)], per_record=3))
        pump_until = __import__("time").monotonic() + 60
        while sink.metrics.records_read < 10:
            assert __import__("time").monotonic() < pump_until
            __import__("time").sleep(0.05)
        if ch_db.dsn.embedded:  # another process reads through the sink's endpoint while it runs
            env = {**os.environ, "REWARDFLOW_CLICKHOUSE_DSN": ch_db.dsn.secret, "REWARDFLOW_WEB_PORT": str(settings.web_port),
                   "REWARDFLOW_HOME": str(settings.home)}
            code = "import typer; from rewardflow.cli.sql import command; typer.run(command)"
            child = subprocess.run([sys.executable, "-c", code, "SELECT count() AS n FROM rewards", "-f", "json"],
                                   env=env, capture_output=True, text=True, timeout=120)
            assert child.returncode == 0, child.stderr
            assert child.stdout.strip() == '[{"n":0}]'  # nothing due yet: nothing written
        assert committed(kafka_broker.bootstrap, unique_group, topic, 1)[0] < 0
    finally:
        stop.set()
        thread.join(60)
        if reads is not None:
            reads.stop()
    assert not thread.is_alive()
    assert _count(ch_db.client, "rewards") == 30  # close() flushed
    assert committed(kafka_broker.bootstrap, unique_group, topic, 1) == {0: 10}  # ... and committed


def test_a_recreated_topic_is_not_mistaken_for_a_replay(ch_db: ChDatabase, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    import time

    from rewardflow.kafka_local.admin import create_topics, delete_topics
    from rewardflow.kafka_local.errors import KafkaLocalError

    topic = unique_topic("rewards")
    produce(kafka_broker.bootstrap, topic, values([reward(i) for i in range(20)], per_record=5))
    sink = _sink(ch_db, kafka_broker, topic, "rewards", unique_group)
    pump(sink, lambda: sink.metrics.rows_written["rewards"] >= 20)
    sink.close()
    delete_topics(kafka_broker.bootstrap, [topic], timeout=30)
    deadline = time.monotonic() + 60
    while True:  # deletion is asynchronous; the name frees up shortly after
        try:
            create_topics(kafka_broker.bootstrap, {topic: 1})
            break
        except KafkaLocalError:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    # same name, same offsets 0..3, same batch cuts: only the topic id tells the new rows apart
    produce(kafka_broker.bootstrap, topic, values([reward(i) for i in range(100, 120)], per_record=5))
    again = _sink(ch_db, kafka_broker, topic, "rewards", unique_group + "-2")
    pump(again, lambda: again.metrics.rows_written["rewards"] >= 20)
    again.close()
    assert _count(ch_db.client, "rewards") == 40


def test_unreachable_server_is_retried_not_fatal_and_the_password_stays_secret(ch_db: ChDatabase, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from pydantic import SecretStr

    from tests.conftest_clickhouse import free_port

    caplog.set_level(logging.DEBUG)
    topic = unique_topic("rewards")
    produce(kafka_broker.bootstrap, topic, values([reward(i) for i in range(10)], per_record=5))
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, sink_batch_seconds=0.1,
                              clickhouse_dsn=SecretStr(f"http://rf:TopSecret42@127.0.0.1:{free_port()}/db"))
    sink = RewardSink(settings, topics={topic: "rewards"}, group_id=unique_group)
    pump(sink, lambda: sink.metrics.retries >= 2)
    assert sink.metrics.rows_written["rewards"] == 0
    assert committed(kafka_broker.bootstrap, unique_group, topic, 1)[0] < 0
    sink.close(timeout=1)
    assert "ClickHouse unavailable" in caplog.text
    assert "TopSecret42" not in caplog.text and "TopSecret42" not in repr(sink.dsn) and "TopSecret42" not in str(sink.metrics.snapshot())


def test_reads_on_while_an_insert_runs_and_commits_only_after_it_returned(ch_db: ChDatabase, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    import threading

    topic = unique_topic("rewards")
    entered, release = threading.Event(), threading.Event()

    def slow_first_insert(table: str) -> None:
        if table == "rewards" and not entered.is_set():
            entered.set()
            assert release.wait(60)

    produce(kafka_broker.bootstrap, topic, values([reward(i) for i in range(40)], per_record=5))
    sink = _sink(ch_db, kafka_broker, topic, "rewards", unique_group, fault=slow_first_insert)
    pump(sink, entered.is_set)
    produce(kafka_broker.bootstrap, topic, values([reward(i) for i in range(40, 80)], per_record=5))
    pump(sink, lambda: sink.metrics.records_read >= 16)  # the sink thread is not blocked by the running insert
    assert committed(kafka_broker.bootstrap, unique_group, topic, 1)[0] < 0  # nothing committed before it returns
    assert sink.metrics.rows_written["rewards"] == 0
    release.set()
    pump(sink, lambda: sink.metrics.rows_written["rewards"] >= 80)
    assert committed(kafka_broker.bootstrap, unique_group, topic, 1) == {0: 16}
    sink.close()
    assert _count(ch_db.client, "rewards") == 80
