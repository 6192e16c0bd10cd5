"""Sends a :class:`~tests.fault.workload.Workload` to the raw topic, the way clients would.

Valid events go through the SDK (:class:`~rewardflow.client.EventProducer`,
batched per session). Planted bad records and duplicated Kafka records go
through a plain idempotent confluent-kafka producer, whose delivery reports
give each planted record's (partition, offset): the dead letters expected.
A second SDK client resends whole batches.

Ordering, as ``rewardflow simulate`` does it: every ``sync_ms`` of event time
both producers are flushed, so records reach Kafka in event-time order up to
that interval (well inside grace − lateness). :meth:`Sender.finish` flushes
and then appends one tick per partition whose watermark finalises everything:
the last record of every partition.

Contract: blocks while flushing; raises AssertionError if any delivery fails
for good (the SDK's ``UndeliveredEvents`` is turned into one).
"""

from __future__ import annotations

import gc
from typing import Any

from confluent_kafka import Producer

from rewardflow.kafka import topics as T
from rewardflow.client import EventProducer, ProducerConfig
from rewardflow.core.ticks import signed_tick
from rewardflow.events.wire import encode_avro
from rewardflow.settings import Settings, tick_key
from tests.fault.workload import AVRO_H, Item, Planted

FINAL_WATERMARK = 2**61


class Sender:
    """One client population for one deployment; :meth:`close` releases both producers."""

    def __init__(self, settings: Settings, wire_format: str = "avro", sync_ms: int = 10_000) -> None:
        self.settings, self.sync_ms = settings, sync_ms
        self.topic = settings.topic(T.RAW)
        config = ProducerConfig(wire_format=wire_format, block_timeout_s=120.0)  # type: ignore[arg-type]
        self.sdk = EventProducer(settings, config)
        self.resender = EventProducer(settings, config)
        # the SDK's partitioner, so a session's records share one partition whichever producer wrote them
        self.raw = Producer({**settings.kafka_client_config(), "enable.idempotence": True, "linger.ms": 5,
                             "partitioner": T.RAW_PARTITIONER,
                             "message.max.bytes": 4_000_000})
        self.planted: dict[tuple[int, int], Planted] = {}
        self._errors: list[str] = []
        self._last_sync: int | None = None

    # ------------------------------------------------------------------ sending
    def send(self, items: list[Item]) -> None:
        """Send ``items`` in order; returns once every record is acknowledged."""
        for item in items:
            due = item.group.due_ms if item.group is not None else None
            if due is not None and (self._last_sync is None or due - self._last_sync >= self.sync_ms):
                self.flush()
                self._last_sync = due
            if item.op == "group":
                assert item.group is not None
                for event in item.group.events:
                    self.sdk.emit(event)
            elif item.op == "plant":
                assert item.planted is not None
                self._produce(item.planted.value, item.planted.key, item.planted.headers, planted=item.planted)
            elif item.op == "resend":  # a client that did not see its ack resends the whole batch
                assert item.group is not None
                self.sdk.flush(60)
                for event in item.group.events:
                    self.resender.emit(event)
                self._flush_sdk(self.resender)
            elif item.op == "twice":  # the same record delivered twice (a retry without idempotence)
                assert item.group is not None
                self.sdk.flush(60)
                events = [e.model_dump() for e in item.group.events]
                value = encode_avro(events, batch_id=f"twice-{events[0]['event_id']}")
                for _ in range(2):
                    self._produce(value, item.group.session_id, AVRO_H)
                self._flush_raw()
            else:  # pragma: no cover
                raise ValueError(item.op)
        self.flush()

    def finish(self) -> None:
        """Flush, then end every partition with a tick that finalises every turn and window."""
        self.flush()
        for p in range(self.settings.partitions):
            self.raw.produce(self.topic, value=signed_tick(tick_key(self.settings), self.topic, FINAL_WATERMARK), partition=p,
                             headers=[("rf-format", b"tick")], on_delivery=self._report(None))
        self._flush_raw()

    def flush(self) -> None:
        self._flush_sdk(self.sdk)
        self._flush_raw()

    def close(self) -> None:
        """Close both SDK clients and drop every librdkafka handle now, while the broker still runs
        (destroying one at interpreter exit, with the broker gone, can hang)."""
        for sdk in (self.sdk, self.resender):
            try:
                sdk.close(timeout=30)
            except Exception as exc:  # noqa: BLE001 - teardown must go on
                self._errors.append(f"close: {exc}")
        self.raw.flush(30)
        del self.sdk, self.resender, self.raw
        gc.collect()  # an EventProducer and its pump form a reference cycle

    # ------------------------------------------------------------------ plumbing
    def _produce(self, value: bytes | None, key: str, headers: Any, planted: Planted | None = None) -> None:
        self.raw.produce(self.topic, value=value, key=key.encode(), headers=headers, on_delivery=self._report(planted))
        self.raw.poll(0)

    def _report(self, planted: Planted | None) -> Any:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                self._errors.append(str(err))
            elif planted is not None:
                self.planted[(msg.partition(), msg.offset())] = planted
        return cb

    def _flush_sdk(self, sdk: EventProducer) -> None:
        try:
            sdk.flush(120)
        except Exception as exc:
            raise AssertionError(f"SDK delivery failed: {exc}") from exc

    def _flush_raw(self) -> None:
        left = self.raw.flush(120)
        assert left == 0 and not self._errors, f"raw produce failed: {self._errors or f'{left} undelivered'}"
