"""The edge's Kafka producer: a request is answered only once Kafka acknowledged all of it.

One idempotent librdkafka producer (``acks=all``, no linger) per collector, polled by a task on the serving
loop itself: a delivery report resolves its request's future where it is awaited, with no thread
hand-over (a poll thread would wait for the interpreter lock behind the busy loop). Records are keyed by
``session_id`` (one record per session of a request, JSON: the events as validated; several when they do
not fit one record the worker takes, :mod:`.records`), so a session's events keep their order on one
partition.

Contract: :meth:`AckingProducer.send` returns once every record is acknowledged, or raises
:class:`KafkaUnavailable` (a full queue, a record the producer refuses, a failed delivery, or no
acknowledgement within ``timeout_s``), or :class:`~.records.RecordTooLarge` before producing anything.
It never reports success for a record Kafka did not confirm; records of a refused
request may still arrive later, and the pipeline deduplicates them by ``event_id`` when the client
retries. :meth:`close` flushes what is in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from rewardflow.collector.records import session_records
from rewardflow.kafka.topics import RAW_PARTITIONER
from rewardflow.events.wire import DEFAULT_MAX_BATCH_EVENTS, DEFAULT_MAX_RECORD_BYTES, FORMAT_HEADER, JSON

POLL_BUSY_S, POLL_IDLE_S = 0.001, 0.05
_HEADERS: list[tuple[str, str | bytes | None]] = [(FORMAT_HEADER, JSON.encode())]


class KafkaUnavailable(Exception):
    """Kafka did not take a request's records; the client should retry later."""


class _Request:
    """The records of one request still awaiting acknowledgement, the future its caller awaits, and
    the monotonic time after which it has failed."""

    __slots__ = ("future", "left", "deadline")

    def __init__(self, future: asyncio.Future[None], left: int, deadline: float) -> None:
        self.future, self.left, self.deadline = future, left, deadline

    def report(self, err: KafkaError | None, _msg: Message | None = None) -> None:
        """A delivery report: count an acknowledgement; done at the last, or failed at the first error."""
        fut = self.future
        if fut.done() or fut.get_loop().is_closed():  # timed out, or served after the loop ended
            return
        if err is not None:
            fut.set_exception(KafkaUnavailable(f"Kafka refused a record: {err.name()}: {err.str()}"))
            return
        self.left -= 1
        if self.left == 0:
            fut.set_result(None)


class AckingProducer:
    def __init__(self, config: dict[str, Any], topic: str, timeout_s: float, *,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, max_batch_events: int = DEFAULT_MAX_BATCH_EVENTS) -> None:
        self.topic, self.timeout_s = topic, timeout_s
        self.max_record_bytes, self.max_batch_events = max_record_bytes, max_batch_events
        # linger.ms 0: every request waits for its acknowledgement, so a linger adds its whole value to
        # each request's latency (and clients wait on it); records queued while a produce request is in
        # flight are still sent together in the next one
        self._producer = Producer({
            **config, "enable.idempotence": True, "acks": "all", "linger.ms": 0, "compression.type": "lz4",
            "message.timeout.ms": int(timeout_s * 1000), "client.id": "rewardflow-collector",
            "partitioner": RAW_PARTITIONER,  # a session's records land where the SDK's do
            # a record of max_record_bytes, with its key, headers and framing (librdkafka's default is 1,000,000)
            "message.max.bytes": max(1_000_000, max_record_bytes + 65_536),
        })
        self._waiting: deque[_Request] = deque()  # in send order, so in deadline order
        self._poller: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # set by a send while the poller idles

    async def _serve_reports(self) -> None:
        """Poll for delivery reports on the serving loop: every millisecond while requests wait, else
        every 50 ms (librdkafka's error events), woken at once by a send. Reports settle their requests
        here, on the loop; a request past its deadline is failed here too (one sweep, not a timer per
        request)."""
        waiting, wake = self._waiting, self._wake
        while True:
            self._producer.poll(0)
            if waiting:
                now = time.monotonic()
                while waiting and (waiting[0].future.done() or waiting[0].deadline < now):
                    fut = waiting.popleft().future
                    if not fut.done():
                        fut.set_exception(KafkaUnavailable(f"Kafka did not acknowledge within {self.timeout_s:.0f} s"))
            if waiting:
                await asyncio.sleep(POLL_BUSY_S)
                continue
            wake.clear()
            try:
                async with asyncio.timeout(POLL_IDLE_S):
                    await wake.wait()
            except TimeoutError:
                pass

    async def send(self, sessions: Mapping[str, Sequence[dict[str, Any]]]) -> float:
        """Produce one record per session and wait for every acknowledgement; returns the seconds it took."""
        loop = asyncio.get_running_loop()
        if self._poller is None or self._poller.get_loop() is not loop:
            self._wake = asyncio.Event()  # (an Event binds to the loop that first waits on it)
            self._poller = loop.create_task(self._serve_reports(), name="rewardflow-collector-kafka")
        started = time.perf_counter()
        records = [(session_id.encode(), value) for session_id, events in sessions.items()
                   for value in session_records(events, self.max_record_bytes, self.max_batch_events)]
        request = _Request(loop.create_future(), len(records), time.monotonic() + self.timeout_s + 1.0)
        try:
            for key, value in records:
                self._producer.produce(self.topic, value, key, headers=_HEADERS, on_delivery=request.report)
        except BufferError:
            request.future.cancel()
            raise KafkaUnavailable("the edge's Kafka queue is full") from None
        except KafkaException as exc:
            request.future.cancel()
            raise KafkaUnavailable(f"the edge's producer refused a record: {exc}") from None
        self._waiting.append(request)
        self._wake.set()
        await request.future
        return time.perf_counter() - started

    def close(self, timeout: float = 30.0) -> int:
        """After the serving loop ended: flush what is in flight; returns the records still unsent."""
        left = int(self._producer.flush(timeout))
        del self._producer  # librdkafka's threads end with the handle, not with the broker connection
        return left
