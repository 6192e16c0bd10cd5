"""Configuration of the sink's Kafka consumer, checked before anything starts.

The sink commits offsets itself, after ClickHouse confirmed the rows; a
consumer that auto-commits would commit rows that may never be written. So
:func:`consumer_config` refuses ``enable.auto.commit`` (and
``enable.auto.offset.store``) set to true, whoever sets them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from rewardflow.settings import Settings
from rewardflow.kafka.topics import OUTPUT_TOPICS, TABLE_OF_TOPIC


log = logging.getLogger(__name__)


class SinkConfigError(ValueError):
    """The sink's configuration is unsafe or inconsistent; the message says how to fix it."""


_TRUE = {"true", "1", "yes", "on"}


def consumer_config(settings: Settings, group_id: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """librdkafka config of the sink's consumer; raises :class:`SinkConfigError` on auto-commit."""
    cfg: dict[str, Any] = {
        **settings.kafka_client_config(),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "max.poll.interval.ms": 300_000,
        "session.timeout.ms": int(settings.group_session_timeout_s * 1000),
    }
    for key in ("enable.auto.commit", "enable.auto.offset.store"):
        if overrides and str((overrides.get(key, False))).lower() in _TRUE:
            raise SinkConfigError(
                f"refusing to start the ClickHouse sink with {key}=true: offsets would be committed before "
                "ClickHouse confirmed the rows (the sink commits after each insert); remove that setting"
            )
    cfg.update(overrides or {})
    return cfg


def resolve_topics(settings: Settings, topics: Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
    """Full topic name -> logical output topic.

    ``None``: every output topic under ``settings.topic_prefix``; a sequence:
    those logical names under the prefix; a mapping: explicit full -> logical
    (tests use it with uniquely named topics).
    """
    if topics is None:
        topics = list(OUTPUT_TOPICS)
    mapping = dict(topics) if isinstance(topics, Mapping) else {settings.topic(t): t for t in topics}
    unknown = sorted(set(mapping.values()) - set(TABLE_OF_TOPIC))
    if unknown:
        raise SinkConfigError(f"not output topics: {', '.join(unknown)}; known: {', '.join(TABLE_OF_TOPIC)}")
    if not mapping:
        raise SinkConfigError("the sink needs at least one topic")
    return mapping


def topic_ids(kafka_config: Mapping[str, Any], topics: Sequence[str], timeout: float = 10.0) -> dict[str, str]:
    """Kafka's topic id (one per incarnation of a name) of each existing topic; blocks up to ``timeout``.

    A topic that does not exist (yet), or a broker that gives no ids, maps to
    ``''``; the sink asks again when it first sees a record of that topic.
    """
    if not topics:
        return {}
    admin = AdminClient(dict(kafka_config))
    out: dict[str, str] = {}
    for name, future in admin.describe_topics(TopicCollection(list(topics)), request_timeout=timeout).items():
        try:
            out[name] = str(future.result(timeout=timeout).topic_id or "")
        except (KafkaException, TimeoutError, ValueError) as exc:
            log.debug("no topic id for %s: %s", name, exc)
            out[name] = ""
    return out
