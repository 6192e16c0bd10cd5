"""The broker lookups of the worker's offset bookkeeping (``streams/commits.py``), on the test broker.

:func:`log_starts` gives the first offset each partition still holds (after records were deleted,
the offset past them), and None where the broker cannot answer, so the caller falls back;
:func:`group_offsets` gives a group's committed offsets, None where it committed nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from faust.types import TP

from rewardflow_streams.commits import group_offsets, log_starts

pytestmark = pytest.mark.kafka


def _produce(bootstrap: str, topic: str, partition: int, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        p.produce(topic, b"%d" % i, partition=partition)
    assert p.flush(30) == 0


def test_log_starts_follow_deleted_records_and_are_none_where_the_broker_cannot_say(
        kafka_broker: Any, unique_topic: Any) -> None:
    topic = unique_topic("log-starts", partitions=2)
    _produce(kafka_broker.bootstrap, topic, 0, 10)
    _produce(kafka_broker.bootstrap, topic, 1, 3)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    deleted = admin.delete_records([TopicPartition(topic, 0, 7)], request_timeout=30)
    for f in deleted.values():
        f.result(timeout=30)
    tps = [TP(topic, 0), TP(topic, 1)]
    assert log_starts(admin, tps) == {TP(topic, 0): 7, TP(topic, 1): 0}
    missing = TP(f"{topic}.absent", 0)
    assert log_starts(admin, [missing]) == {missing: None}


def test_group_offsets_are_the_commits_and_none_where_nothing_was_committed(
        kafka_broker: Any, unique_topic: Any, unique_group: str) -> None:
    topic = unique_topic("group-offsets", partitions=2)
    _produce(kafka_broker.bootstrap, topic, 0, 5)
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": unique_group,
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    finally:
        c.close()
    reader = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": unique_group, "enable.auto.commit": False})
    try:
        assert group_offsets(reader, [TP(topic, 0), TP(topic, 1)]) == {TP(topic, 0): 4, TP(topic, 1): None}
    finally:
        reader.close()
