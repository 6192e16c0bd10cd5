"""A broker that cannot be reached: events are buffered up to the bound, then refused; every one is counted.

No broker is needed: the producer points at a loopback port nobody listens on.
"""

from __future__ import annotations

import socket

import pytest

from rewardflow.client import BufferFull, EventProducer, ProducerConfig, UndeliveredEvents
from rewardflow.events.samples import sample_events
from rewardflow.settings import Settings, load_settings


def closed_port_settings() -> Settings:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the socket is closed: connections to the port are refused
    return load_settings(kafka_bootstrap=f"127.0.0.1:{port}")


QUIET = {"log_level": 0}  # librdkafka would print a connection error per retry


@pytest.mark.timeout(30)
def test_buffers_up_to_the_bound_then_refuses_with_exact_counts() -> None:
    config = ProducerConfig(topic="t", max_pending_events=2_000, max_events=50, kafka_overrides=QUIET)
    producer = EventProducer(closed_port_settings(), config)
    events = sample_events(3_000, seed=9)
    accepted = 0
    with pytest.raises(BufferFull) as info:
        for event in events:
            producer.emit(event)
            accepted += 1
    assert accepted == 2_000
    assert "max_pending_events=2000" in str(info.value) and "reachable" in str(info.value)
    stats = producer.stats
    assert (stats.accepted, stats.sent, stats.failed, stats.pending) == (2_000, 0, 0, 2_000)
    with pytest.raises(BufferFull):  # still full: refused again, never dropped
        producer.emit(events[accepted])
    with pytest.raises(UndeliveredEvents) as undelivered:
        producer.close(timeout=0.5)
    assert undelivered.value.stats.pending == 2_000 and "2000 events still undelivered" in str(undelivered.value)


@pytest.mark.timeout(30)
def test_delivery_timeout_fails_events_with_their_reason() -> None:
    config = ProducerConfig(topic="t", delivery_timeout_ms=1_500, max_delay_ms=10, kafka_overrides=QUIET)
    producer = EventProducer(closed_port_settings(), config)
    events = sample_events(300, seed=10)
    for event in events:
        producer.emit(event)
    with pytest.raises(UndeliveredEvents) as info:
        producer.flush(timeout=15)
    assert info.value.stats.failed == 300 and info.value.stats.pending == 0
    [(reason, count)] = info.value.failures.items()
    assert reason.startswith("_MSG_TIMED_OUT") and count == 300
    assert producer.close(timeout=1).failed == 300  # reported once; close has nothing new to raise
