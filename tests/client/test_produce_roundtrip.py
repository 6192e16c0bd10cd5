"""The SDK against the real broker: exactly the emitted events come back, in session order."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from confluent_kafka import Consumer

from rewardflow.client import EventProducer, ProducerConfig
from rewardflow.events.samples import sample_events
from rewardflow.events.wire import decode_record
from rewardflow.settings import load_settings

pytestmark = pytest.mark.kafka


def consume_events(bootstrap: str, topic: str, group: str, expected: int, timeout: float = 40.0) -> list[dict[str, Any]]:
    """Read ``topic`` from the start with a plain consumer until ``expected`` events (or the timeout)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(5_000, 0.5):
                assert msg.error() is None, msg.error()
                events = decode_record(msg.value(), msg.headers())
                assert {e["session_id"] for e in events} == {msg.key().decode()}
                out.extend(events)
        # anything beyond the expected count would be a duplicate: give it a moment to show up
        for msg in consumer.consume(5_000, 1.0):
            out.extend(decode_record(msg.value(), msg.headers()))
    finally:
        consumer.close()
    return out


@pytest.mark.timeout(60)
def test_100k_mixed_events_come_back_exactly(kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    events = sample_events(100_000, seed=42)
    topic = unique_topic("sdk-roundtrip", partitions=4)
    settings = load_settings(kafka_bootstrap=kafka_broker.bootstrap)
    with EventProducer(settings, ProducerConfig(topic=topic)) as producer:
        for event in events:
            producer.emit(event)
    stats = producer.stats
    assert (stats.sent, stats.failed, stats.pending) == (100_000, 0, 0)

    back = consume_events(kafka_broker.bootstrap, topic, unique_group, 100_000)
    ids = Counter(e["event_id"] for e in back)
    assert len(back) == 100_000 and ids == Counter(e.event_id for e in events)  # no loss, no duplicate
    # one session lives on one partition, so its events come back in emit order
    assert _by_session((e["session_id"], e["event_id"]) for e in back) == _by_session((e.session_id, e.event_id) for e in events)


def _by_session(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for session, event_id in pairs:
        out.setdefault(session, []).append(event_id)
    return out


@pytest.mark.timeout(60)
def test_json_format_round_trip(kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    events = sample_events(5_000, seed=43)
    topic = unique_topic("sdk-json", partitions=2)
    settings = load_settings(kafka_bootstrap=kafka_broker.bootstrap)
    with EventProducer(settings, ProducerConfig(topic=topic, wire_format="json", max_events=25)) as producer:
        for event in events:
            producer.emit(event.model_dump())  # dicts take the validating path
    back = consume_events(kafka_broker.bootstrap, topic, unique_group, 5_000)
    assert sorted(e["event_id"] for e in back) == sorted(e.event_id for e in events)
    assert producer.stats.records >= 5_000 / 25
