"""Consumer-group lag of a topic: high watermarks minus committed offsets; and the pipeline's.

The pipeline is drained when the workers' group has committed every raw record and the sink's group
every output record: nothing sent is still on its way to the tables.

Contract: blocks up to ``timeout`` seconds a call; returns None when the broker does
not answer (never raises for a transient Kafka error).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from rewardflow.core.ticks import TICK
from rewardflow.events.wire import FORMAT_HEADER
from rewardflow.kafka import topics as T

if TYPE_CHECKING:
    from rewardflow.settings import Settings


def sink_group(settings: Settings) -> str:
    """The sink's consumer group."""
    return f"{settings.topic_prefix}sink"


@dataclass(frozen=True, slots=True)
class PipelineLag:
    """Records not yet committed: the workers' on the raw topic (ticks not counted), the sink's over the
    output topics (None: Kafka did not answer)."""

    worker: int | None
    sink: int | None

    @property
    def drained(self) -> bool:
        return self.worker == 0 and self.sink == 0


def pipeline_lag(settings: Settings, timeout: float = 5.0, skip_ticks: bool = True) -> PipelineLag:
    """The workers' and the sink's lag under ``settings`` (``skip_ticks``: see :func:`group_lag`)."""
    cfg = settings.kafka_client_config()
    worker = group_lag(cfg, settings.topic("worker"), settings.topic(T.RAW), timeout=timeout, skip_ticks=skip_ticks)
    if worker is None:  # no answer: not asked again for each output topic
        return PipelineLag(None, None)
    sink: int | None = 0
    for name in T.OUTPUT_TOPICS:
        lag = group_lag(cfg, sink_group(settings), settings.topic(name), timeout=timeout)
        sink = None if lag is None or sink is None else sink + lag
    return PipelineLag(worker, sink)


def group_lag(kafka_config: dict[str, Any], group: str, topic: str, timeout: float = 2.0,
              skip_ticks: bool = False) -> int | None:
    """Records in ``topic`` not yet committed by ``group`` (all partitions). With ``skip_ticks``, a partition
    at most :data:`SCAN_RECORDS` behind is read, and the workers' tick records (header ``rf-format: tick``,
    which they write to idle partitions while turns are open) are not counted."""
    consumer = Consumer({**kafka_config, "group.id": group, "enable.auto.commit": False})
    deadline = time.monotonic() + timeout
    try:
        while True:  # a retriable error (the group's coordinator still loading) is asked again until the deadline
            try:
                md = consumer.list_topics(topic, timeout=timeout)
                parts = md.topics.get(topic)
                if parts is None or parts.error is not None:
                    return None
                tps = [TopicPartition(topic, p) for p in parts.partitions]
                committed = consumer.committed(tps, timeout=timeout)
                break
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        lag = 0
        for tp in committed:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=timeout)
            start = max(tp.offset if tp.offset >= 0 else low, low)
            behind = max(0, high - start)
            if skip_ticks and 0 < behind <= SCAN_RECORDS:
                behind = _not_ticks(consumer, TopicPartition(topic, tp.partition, start), high, timeout)
            lag += behind
        return lag
    except KafkaException:
        return None
    finally:
        consumer.close()


SCAN_RECORDS = 1_000
_TICK_HEADER = (FORMAT_HEADER, TICK.encode())


def _not_ticks(consumer: Consumer, tp: TopicPartition, high: int, timeout: float) -> int:
    """Records from ``tp.offset`` up to ``high`` that are not ticks (all of them that were not read)."""
    consumer.assign([tp])
    offset, count, deadline = tp.offset, 0, time.monotonic() + timeout
    try:
        while offset < high and time.monotonic() < deadline:
            msgs = consumer.consume(min(high - offset, 500), timeout)
            if not msgs:
                break
            for m in msgs:
                at = m.offset()
                if m.error() is not None or at is None or at >= high:
                    continue
                if _TICK_HEADER not in (m.headers() or []):
                    count += 1
                offset = at + 1
    finally:
        consumer.unassign()
    return count + max(0, high - offset)
