"""Create the topics a deployment needs (idempotent), with its security settings.

Contract: blocks until every topic exists or ``timeout`` passes; raises
``RuntimeError`` naming the topic on failure. Existing topics keep their
partition count; their record size limit (``max.message.bytes``) is raised to
what the settings need, never lowered.

Record sizes: the raw topic takes records a little over ``max_record_bytes``,
so an oversized record reaches the worker and is dead-lettered instead of being
refused by the broker; the dead-letter topic takes a dead letter that carries
such a record whole (base64, 4/3 of its size, plus the reason and metadata).
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from rewardflow import topics as T
from rewardflow.settings import Settings

ALL_TOPICS = (T.RAW, *T.OUTPUT_TOPICS)
_BROKER_DEFAULT_MAX = 1_048_588  # Kafka's default max.message.bytes
_SLACK = 64 * 1024


def raw_record_limit(settings: Settings) -> int:
    """``max.message.bytes`` of the raw topic: a little over the largest record accepted."""
    return max(_BROKER_DEFAULT_MAX, settings.max_record_bytes + _SLACK)


def dead_letter_record_limit(settings: Settings) -> int:
    """``max.message.bytes`` of the dead-letter topic: one dead letter carrying a whole raw record."""
    return raw_record_limit(settings) * 4 // 3 + 2 * _SLACK


def topic_limits(settings: Settings) -> dict[str, int]:
    """Topic name -> the ``max.message.bytes`` it needs above the broker default."""
    return {settings.topic(T.RAW): raw_record_limit(settings),
            settings.topic(T.DEADLETTERS): dead_letter_record_limit(settings)}


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the raw and output topics with ``settings.partitions``; return their names."""
    names = [settings.topic(n) for n in ALL_TOPICS]
    limits = topic_limits(settings)
    client = AdminClient(settings.kafka_client_config())
    new = [NewTopic(n, num_partitions=settings.partitions, replication_factor=1,
                    config={"max.message.bytes": str(limits[n])} if n in limits else {}) for n in names]
    existing = []
    for name, fut in client.create_topics(new, operation_timeout=timeout, request_timeout=timeout).items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"cannot create topic {name!r}: {exc}") from None
            existing.append(name)
    _raise_limits(client, {n: v for n, v in limits.items() if n in existing}, timeout)
    _wait_visible(client, names, timeout)
    return names


def _raise_limits(client: AdminClient, limits: dict[str, int], timeout: float) -> None:
    """Raise ``max.message.bytes`` of existing topics that are below ``limits`` (never lower it)."""
    if not limits:
        return
    described = client.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, n) for n in limits])
    low = []
    for res, fut in described.items():
        entry = fut.result(timeout=timeout).get("max.message.bytes")
        if entry is None or int(entry.value) < limits[res.name]:
            low.append(res.name)
    if not low:
        return
    alter = [ConfigResource(ConfigResource.Type.TOPIC, n, incremental_configs=[
        ConfigEntry("max.message.bytes", str(limits[n]), incremental_operation=AlterConfigOpType.SET)])
        for n in low]
    for res, fut in client.incremental_alter_configs(alter).items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:
            raise RuntimeError(f"cannot raise max.message.bytes of topic {res.name!r}: {exc}") from None


def _wait_visible(client: AdminClient, names: list[str], timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while True:
        md = client.list_topics(timeout=max(1.0, deadline - time.monotonic()))
        missing = [n for n in names if n not in md.topics or any(
            p.leader < 0 for p in md.topics[n].partitions.values())]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics not ready within {timeout:.0f}s: {missing}")
        time.sleep(0.2)
