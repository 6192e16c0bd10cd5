"""Handing closed session batches to librdkafka, in order, never dropping one.

``produce()`` can refuse a record for two reasons. librdkafka's local queue is
full (``BufferError``): the batch waits here, and every later batch queues
behind it so that a session's records keep their order; :meth:`retry` sends
them when there is room. Or the record can never be sent (``KafkaException``,
e.g. larger than the broker allows): its events are counted as failed with
the reason. Either way nothing disappears.

Not thread-safe: the producer holds its lock around every call.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from confluent_kafka import KafkaException

from rewardflow.client.batching import SessionBatch
from rewardflow.client.delivery import DeliveryLedger, reason_of
from rewardflow.client.encoding import EventEncoder


class KafkaHandoff:
    """Produces batch records to one topic; reports their fate to the ledger."""

    def __init__(self, kafka: Any, topic: str, encoder: EventEncoder, ledger: DeliveryLedger) -> None:
        self.kafka = kafka
        self._topic = topic
        self._encoder = encoder
        self._headers = encoder.headers
        self._ledger = ledger
        self._waiting: deque[SessionBatch] = deque()
        self.waiting_events = 0
        """Events in batches librdkafka refused for now."""

    def ship(self, batch: SessionBatch) -> None:
        """Produce ``batch``, or queue it behind batches still waiting."""
        if self._waiting:
            self._waiting.append(batch)
            self.waiting_events += batch.count
            self.retry()
            return
        try:
            self._produce(batch)
        except BufferError:
            self._waiting.append(batch)
            self.waiting_events += batch.count

    def retry(self) -> bool:
        """Produce waiting batches in order until librdkafka refuses again; True when none waits."""
        while self._waiting:
            try:
                self._produce(self._waiting[0])
            except BufferError:
                return False
            self.waiting_events -= self._waiting.popleft().count
        return True

    def _produce(self, batch: SessionBatch) -> None:
        value = self._encoder.record(batch.head, batch.pieces)
        try:
            self.kafka.produce(self._topic, value, batch.key, headers=self._headers,
                               on_delivery=self._ledger.callback(batch.count))
        except KafkaException as exc:  # refused for good: count the events as failed, never drop them
            self._ledger.fail(batch.count, reason_of(exc.args[0] if exc.args else exc))
