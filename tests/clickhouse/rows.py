"""Builders of output-topic rows (RewardRecord, EventRow, ...) and Kafka helpers for sink tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from rewardflow.clickhouse.tables import REWARDS
from rewardflow.core.records import stable_id
from rewardflow.core.rows import EventRow, RewardRecord

T0 = 1_790_000_000_000


def reward(i: int, *, checkpoint: str = "ck-a", arm: str = "control", spec: str = "v1", provisional: int = 0, reward_value: float = 0.5, **over: Any) -> RewardRecord:
    sample = f"req-{i}"
    horizon = 30 if provisional else 900
    rec = RewardRecord(
        reward_id=stable_id(spec, sample, horizon if provisional else "final"), sample_id=sample, spec_version=spec,
        spec_hash="h" * 16, org_id="org", session_id=f"s-{i // 10}", checkpoint_id=checkpoint, experiment_arm=arm,
        surface="agent", served_ts=T0 + i * 1000, finalised_wm=T0 + i * 1000 + 960_000, finalised_by="watermark",
        provisional=provisional, horizon_s=horizon, revision=0, reward=reward_value, components={"persist": 0.4, "accept": 0.1},
        latency_ms=1000 + i % 7, ttft_ms=100, completion_tokens=200, n_edits=1, n_tool_calls=2, n_tool_broken=0,
        n_tool_error=0, n_clarifying=0, n_followups=1, n_dissatisfied=i % 5 == 0, n_accept=1, n_reject=0, n_undo=0,
        n_revert=0, persistence={30: 1.0, 900: 0.8}, persisted={30: 1, 900: 1}, checked={30: 1, 900: 1},
    )
    rec["n_dissatisfied"] = int(rec["n_dissatisfied"])
    rec.update(over)  # type: ignore[typeddict-item]
    return rec


def event_row(i: int, **over: Any) -> EventRow:
    row = EventRow(event_id=f"e-{i}", event_type="AgentEdit", schema_version=1, ts=T0 + i, org_id="org",
                   session_id=f"s-{i // 10}", request_id=f"req-{i // 3}", producer_name="test", producer_version="1",
                   payload=orjson.dumps({"event_id": f"e-{i}", "text": "a},{\"b\":1"}).decode(),
                   source_partition=0, source_offset=i)
    row.update(over)  # type: ignore[typeddict-item]
    return row


def values(rows: list[Any], per_record: int) -> list[bytes]:
    """Rows packed per_record to a Kafka value (an orjson list), as the stream worker does."""
    return [orjson.dumps(rows[k:k + per_record], option=orjson.OPT_NON_STR_KEYS) for k in range(0, len(rows), per_record)]


def produce(bootstrap: str, topic: str, vals: Iterable[bytes], partition: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n, v in enumerate(vals):
        key = f"k{n}".encode()
        if partition is None:
            producer.produce(topic, v, key=key)
        else:
            producer.produce(topic, v, key=key, partition=partition)
    assert producer.flush(30) == 0


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def reset_offsets(bootstrap: str, group: str, topic: str, partitions: int, offset: int = 0) -> None:
    """Commit ``offset`` for every partition of ``topic`` in ``group`` (the group must be idle)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, offset) for p in range(partitions)], asynchronous=False)
    finally:
        c.close()


def pump(sink: Any, until: Callable[[], bool], timeout: float = 60.0) -> None:
    """Call sink.poll_once until ``until()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; sink metrics: {sink.metrics.snapshot()}")
        sink.poll_once(timeout=0.05)


def insert(client: Any, rows: Any, token: str | None = None) -> None:
    """Insert reward rows straight into ``rewards`` (as the sink would, without Kafka)."""
    body = b"\n".join(orjson.dumps(r, option=orjson.OPT_NON_STR_KEYS) for r in rows)
    settings = {"insert_deduplication_token": token} if token else {}
    client.raw_insert("rewards", list(REWARDS.record_columns), body, fmt="JSONEachRow", settings=settings)
