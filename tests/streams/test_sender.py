"""The worker's output path: chunking of output rows and the librdkafka sender's confirm contract."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer

from rewardflow_streams.sender import chunks
from rewardflow_streams.sender import OutputSender, SendFailed


def _rows(n: int, width: int) -> list[dict[str, Any]]:
    return [{"i": i, "pad": "x" * (width + (i % 7) * 13), "m": {"a": i}} for i in range(n)]


@pytest.mark.parametrize(("n", "width", "limit"), [(1, 10, 1000), (500, 100, 4096), (3000, 700, 1_000_000),
                                                   (50, 2000, 2500), (7, 10, 10)])
def test_chunks_keep_every_row_in_order_within_the_limit(n: int, width: int, limit: int) -> None:
    rows = _rows(n, width)
    parts = list(chunks(rows, limit))
    back = [r for c in parts for r in orjson.loads(c)]
    assert back == rows
    for c in parts:
        assert len(c) <= limit or len(orjson.loads(c)) == 1  # only a lone row may exceed it


def test_chunks_of_skewed_rows_still_respect_the_limit() -> None:
    """The chunk count is estimated from the first rows; later, larger rows must still be split."""
    rows = [{"pad": "s"} for _ in range(200)] + [{"pad": "L" * 900} for _ in range(200)]
    parts = list(chunks(rows, 8000))
    assert [r for c in parts for r in orjson.loads(c)] == rows
    assert all(len(c) <= 8000 for c in parts)


def test_chunks_with_int_keys_need_the_option() -> None:
    rows = [{"persisted": {30: 1}}]
    with pytest.raises(orjson.JSONEncodeError):
        list(chunks(rows, 1000))
    assert orjson.loads(next(chunks(rows, 1000, orjson.OPT_NON_STR_KEYS))) == [{"persisted": {"30": 1}}]
    assert list(chunks([], 1000)) == []


def _read_all(bootstrap: str, topic: str, n: int) -> list[Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[Any] = []
    for _ in range(60):
        got += [m for m in c.consume(1000, 0.5) if m.error() is None]
        if len(got) >= n:
            break
    c.close()
    return got


@pytest.mark.kafka
def test_confirm_returns_once_every_record_is_in_the_topic_in_order(kafka_broker: Any, unique_topic: Any) -> None:
    topic = unique_topic("out", partitions=2)
    sender = OutputSender({"bootstrap.servers": kafka_broker.bootstrap}, max_message_bytes=1_000_000,
                          client_id="test-sender")
    for i in range(2000):
        sender.send(topic, str(i).encode(), b"k", partition=i % 2)
    sender.send(topic, None, b"k", partition=0)  # a tombstone (changelog delete)
    asyncio.run(sender.confirm())
    assert sender.pending == 0
    got = _read_all(kafka_broker.bootstrap, topic, 2001)  # confirm() returned: all of it is readable now
    assert len(got) == 2001
    for p in (0, 1):
        values = [m.value() for m in got if m.partition() == p]
        expected = [str(i).encode() for i in range(p, 2000, 2)] + ([None] if p == 0 else [])
        assert values == expected
    assert sender.close() == 0


@pytest.mark.kafka
def test_confirm_raises_for_a_record_the_topic_refuses(kafka_broker: Any, unique_topic: Any) -> None:
    topic = unique_topic("small")
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    entry = ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource("topic", topic, incremental_configs=[entry])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(timeout=30)
    sender = OutputSender({"bootstrap.servers": kafka_broker.bootstrap}, max_message_bytes=1_000_000,
                          client_id="test-sender")
    sender.send(topic, os.urandom(50_000), b"k")  # accepted locally, refused by the broker (incompressible)
    with pytest.raises(SendFailed, match=topic):
        asyncio.run(sender.confirm())
    sender.close(1)


@pytest.mark.kafka
def test_a_batch_is_confirmed_while_a_later_one_is_still_undelivered(kafka_broker: Any, unique_topic: Any) -> None:
    ok, missing = unique_topic("ok"), f"missing-{uuid.uuid4().hex}"
    # a topic that does not exist, and may not be created: its record waits until it times out
    sender = OutputSender({"bootstrap.servers": kafka_broker.bootstrap, "message.timeout.ms": 8_000,
                           "allow.auto.create.topics": False}, max_message_bytes=1_000_000, client_id="test-sender")
    for i in range(100):
        sender.send(ok, str(i).encode(), b"k")
    first = sender.mark()
    sender.send(missing, b"later", b"k")
    assert sender.mark() == first + 1
    asyncio.run(sender.confirm(first))
    assert sender.pending == 1  # the later batch's record: confirming the first did not wait for it
    assert len(_read_all(kafka_broker.bootstrap, ok, 100)) == 100
    with pytest.raises(SendFailed, match=missing):
        asyncio.run(sender.confirm())
    sender.close(0)


def test_send_raises_for_a_record_over_the_producer_limit() -> None:
    sender = OutputSender({"bootstrap.servers": "127.0.0.1:9"}, max_message_bytes=10_000, client_id="test-sender")
    with pytest.raises(SendFailed, match="big"):
        sender.send("big", b"x" * 200_000, None)
    sender.close(0)


def test_confirm_waits_for_an_unreachable_broker_then_fails_loudly(caplog: pytest.LogCaptureFixture) -> None:
    """No broker: confirm() keeps waiting (warning) and raises once librdkafka gives the record up."""
    sender = OutputSender({"bootstrap.servers": "127.0.0.1:9", "message.timeout.ms": 12_000},
                          max_message_bytes=10_000, client_id="test-sender")
    sender.send("t", b"v", None)
    with caplog.at_level("WARNING", logger="rewardflow.streams"), pytest.raises(SendFailed, match="timed out"):
        asyncio.run(sender.confirm(warn_every_s=5.0))
    assert any("not acknowledged" in r.getMessage() for r in caplog.records)
    assert sender.pending == 0
    sender.close(0)
