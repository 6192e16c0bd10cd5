"""Consumer-group lag of a topic: high watermarks minus committed offsets; and the pipeline's.

The pipeline is drained when the workers' group has committed every raw record and the sink's group
every output record: nothing sent is still on its way to the tables.

Contract: blocks up to ``timeout`` seconds a call (a transient Kafka error, a busy or just started
broker's, is asked again until then); returns None when the broker does not answer by then, or
refuses (never raises for a Kafka error).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

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

    def ask() -> int:
        left = max(0.1, deadline - time.monotonic())  # (each attempt within the call's timeout)
        md = consumer.list_topics(topic, timeout=left)
        parts = md.topics.get(topic)
        if parts is None:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        if parts.error is not None:
            raise KafkaException(parts.error)
        tps = [TopicPartition(topic, p) for p in parts.partitions]
        lag = 0
        for tp in consumer.committed(tps, timeout=left):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=left)
            start = max(tp.offset if tp.offset >= 0 else low, low)
            behind = max(0, high - start)
            if skip_ticks and 0 < behind <= SCAN_RECORDS:
                behind = _not_ticks(consumer, TopicPartition(topic, tp.partition, start), high, left)
            lag += behind
        return lag

    try:
        return until(deadline, ask)
    except KafkaException:
        return None
    finally:
        consumer.close()


# Errors a busy or just started broker answers with for a while: the group's coordinator loading or
# moving, a topic's metadata or leader not there yet, a connection or request that timed out.
TRANSIENT = frozenset({
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._WAIT_COORD,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT,
})
T_ = TypeVar("T_")


def until(deadline: float, call: Callable[[], T_], pause: float = 0.2) -> T_:
    """``call()``, asked again after a transient Kafka error (:data:`TRANSIENT`, or one librdkafka
    flags retriable) until the ``time.monotonic()`` ``deadline``; then, or for any other error,
    the ``KafkaException`` is raised."""
    while True:
        try:
            return call()
        except KafkaException as exc:
            err = exc.args[0]
            transient = isinstance(err, KafkaError) and (err.retriable() or err.code() in TRANSIENT)
            if not transient or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)


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
