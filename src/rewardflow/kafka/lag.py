"""Consumer-group lag of a topic: high watermarks minus committed offsets.

Contract: blocks up to ``timeout`` seconds; returns None when the broker does
not answer (never raises for a transient Kafka error).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition


def group_lag(kafka_config: dict[str, Any], group: str, topic: str, timeout: float = 2.0) -> int | None:
    """Records in ``topic`` not yet committed by ``group`` (all partitions)."""
    consumer = Consumer({**kafka_config, "group.id": group, "enable.auto.commit": False})
    try:
        md = consumer.list_topics(topic, timeout=timeout)
        parts = md.topics.get(topic)
        if parts is None or parts.error is not None:
            return None
        tps = [TopicPartition(topic, p) for p in parts.partitions]
        committed = consumer.committed(tps, timeout=timeout)
        lag = 0
        for tp in committed:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=timeout)
            start = tp.offset if tp.offset >= 0 else low
            lag += max(0, high - start)
        return lag
    except KafkaException:
        return None
    finally:
        consumer.close()
