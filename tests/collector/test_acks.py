"""The edge producer's acknowledgement bookkeeping, without a broker: a request Kafka never answers
fails at its deadline, and one answered in time succeeds (librdkafka's own timeout is the first
line; the deadline sweep is the backstop that holds even when no delivery report ever comes)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rewardflow.collector.kafka import AckingProducer, KafkaUnavailable


class _Silent:
    """A producer handle that takes records and never reports on them (a wedged client)."""

    def __init__(self) -> None:
        self.produced: list[Any] = []

    def produce(self, topic: str, value: bytes, key: bytes, headers: Any, on_delivery: Any) -> None:
        self.produced.append(on_delivery)

    def poll(self, timeout: float) -> int:
        return 0


@pytest.mark.timeout(30)
def test_a_request_never_acknowledged_fails_at_its_deadline() -> None:
    producer = AckingProducer({"bootstrap.servers": "127.0.0.1:1"}, "t", timeout_s=0.05)
    silent = _Silent()
    producer._producer = silent  # type: ignore[assignment]

    async def go() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(KafkaUnavailable, match="did not acknowledge within"):
            await producer.send({"s1": [{"event_id": "e1", "ts": 1}], "s2": [{"event_id": "e2", "ts": 1}]})
        return loop.time() - started

    took = asyncio.run(go())
    assert len(silent.produced) == 2
    assert 1.0 <= took < 3.0  # the timeout plus the one second of grace, swept by the report poller


def test_an_answered_request_succeeds_and_a_late_report_is_ignored() -> None:
    producer = AckingProducer({"bootstrap.servers": "127.0.0.1:1"}, "t", timeout_s=0.05)
    silent = _Silent()
    producer._producer = silent  # type: ignore[assignment]

    async def go() -> None:
        async def ack_soon() -> None:
            while len(silent.produced) < 2:
                await asyncio.sleep(0.001)
            for report in silent.produced:
                report(None, None)

        acker = asyncio.create_task(ack_soon())
        await producer.send({"s1": [{"event_id": "e1", "ts": 1}], "s2": [{"event_id": "e2", "ts": 1}]})
        await acker
        silent.produced[0](None, None)  # a duplicate report after the request is settled changes nothing
        await asyncio.sleep(0.01)
        assert not producer._waiting or all(r.future.done() for r in producer._waiting)

    asyncio.run(go())


def test_the_server_bounds_its_graceful_stop_and_reads_no_proxy_headers(tmp_path: Any) -> None:
    """In-flight requests get the ack timeout plus 5 s to finish on stop; X-Forwarded-* is never read."""
    from rewardflow.collector.server import Collector
    from rewardflow.settings import Settings

    settings = Settings(home=tmp_path, kafka_bootstrap="127.0.0.1:1", collect_ack_timeout_s=7.0)
    collector = Collector(settings, lambda: {}, port=0)  # type: ignore[arg-type,return-value]
    try:
        config = collector._server.config
        assert config.timeout_graceful_shutdown == 12
        assert config.proxy_headers is False
    finally:
        collector.stop()
