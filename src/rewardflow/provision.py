"""Create the topics a deployment needs (idempotent), with its security settings.

Contract: blocks until every topic exists or ``timeout`` passes; raises
``RuntimeError`` naming the topic on failure. Existing topics are left as they
are (their partition count is not changed).
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from rewardflow import topics as T
from rewardflow.settings import Settings

ALL_TOPICS = (T.RAW, *T.OUTPUT_TOPICS)


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the raw and output topics with ``settings.partitions``; return their names."""
    names = [settings.topic(n) for n in ALL_TOPICS]
    client = AdminClient(settings.kafka_client_config())
    new = [NewTopic(n, num_partitions=settings.partitions, replication_factor=1) for n in names]
    for name, fut in client.create_topics(new, operation_timeout=timeout, request_timeout=timeout).items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"cannot create topic {name!r}: {exc}") from None
    _wait_visible(client, names, timeout)
    return names


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
