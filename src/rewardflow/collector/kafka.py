"""The edge's Kafka producer: a request is answered only once Kafka acknowledged all of it.

One idempotent librdkafka producer (``acks=all``) per collector; a daemon thread polls it, and each
record's delivery report resolves an asyncio future on the serving loop. Records are keyed by
``session_id`` (one record per session of a request, JSON: the events as validated), so a session's
events keep their order on one partition.

Contract: :meth:`AckingProducer.send` returns once every record is acknowledged, or raises
:class:`KafkaUnavailable` (a full queue, a failed delivery, or no acknowledgement within
``timeout_s``). It never reports success for a record Kafka did not confirm; records of a refused
request may still arrive later, and the pipeline deduplicates them by ``event_id`` when the client
retries. :meth:`close` flushes what is in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from rewardflow.events.wire import FORMAT_HEADER, JSON, encode_json

_HEADERS: list[tuple[str, str | bytes | None]] = [(FORMAT_HEADER, JSON.encode())]


class KafkaUnavailable(Exception):
    """Kafka did not take a request's records; the client should retry later."""


class AckingProducer:
    def __init__(self, config: dict[str, Any], topic: str, timeout_s: float) -> None:
        self.topic, self.timeout_s = topic, timeout_s
        self._producer = Producer({
            **config, "enable.idempotence": True, "acks": "all", "linger.ms": 5, "compression.type": "lz4",
            "message.timeout.ms": int(timeout_s * 1000), "client.id": "rewardflow-collector",
        })
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="rewardflow-collector-kafka", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    async def send(self, sessions: Mapping[str, Sequence[dict[str, Any]]]) -> float:
        """Produce one record per session and wait for every acknowledgement; returns the seconds it took."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []
        started = time.perf_counter()

        def report(fut: asyncio.Future[None]) -> Any:
            def done(err: KafkaError | None, _msg: Message) -> None:
                loop.call_soon_threadsafe(_settle, fut, err)
            return done

        try:
            for session_id, events in sessions.items():
                fut: asyncio.Future[None] = loop.create_future()
                value = encode_json(events)
                self._producer.produce(self.topic, value, session_id.encode(), headers=_HEADERS, on_delivery=report(fut))
                futures.append(fut)
        except BufferError:
            _cancel(futures)
            raise KafkaUnavailable("the edge's Kafka queue is full") from None
        try:
            await asyncio.wait_for(asyncio.gather(*futures), timeout=self.timeout_s + 1.0)
        except asyncio.TimeoutError:
            raise KafkaUnavailable(f"Kafka did not acknowledge within {self.timeout_s:.0f} s") from None
        return time.perf_counter() - started

    def close(self, timeout: float = 30.0) -> int:
        """Flush what is in flight, then stop polling; returns the records still unsent."""
        left = int(self._producer.flush(timeout))
        self._stop.set()
        self._thread.join(timeout=5)
        del self._producer  # librdkafka's threads end with the handle, not with the broker connection
        return left


def _settle(fut: asyncio.Future[None], err: KafkaError | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(KafkaUnavailable(f"Kafka refused a record: {err.name()}: {err.str()}"))


def _cancel(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        fut.cancel()
