"""Provisioning against the real broker: the raw topic is stamped by the broker, limits only grow."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from rewardflow.kafka import topics as T
from rewardflow.kafka.provision import changelog_topic, ensure_topics, raw_record_limit, state_record_limit
from rewardflow.settings import Settings

pytestmark = pytest.mark.kafka


def configs(admin: AdminClient, topic: str) -> dict[str, str]:
    """The topic's configs; a topic made a moment ago is asked for again until the broker knows it."""
    deadline = time.monotonic() + 30
    while True:
        (fut,) = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
        try:
            return {k: v.value for k, v in fut.result(timeout=30).items()}
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def test_an_existing_raw_topic_is_made_to_stamp_broker_time(kafka_broker: Any, tmp_path: Path) -> None:
    settings = Settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"p{uuid.uuid4().hex[:8]}.", home=tmp_path,
                        partitions=1)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    raw = settings.topic(T.RAW)
    for fut in admin.create_topics([NewTopic(raw, 1, 1, config={"max.message.bytes": "9000000"})]).values():
        fut.result(timeout=30)  # made before, by hand: producer time, a larger limit than needed
    assert configs(admin, raw)["message.timestamp.type"] == "CreateTime"
    ensure_topics(settings)
    got = configs(admin, raw)
    assert got["message.timestamp.type"] == "LogAppendTime"
    assert int(got["max.message.bytes"]) == 9_000_000 > raw_record_limit(settings)  # never lowered
    assert configs(admin, settings.topic(T.REWARDS))["message.timestamp.type"] == "CreateTime"  # outputs keep theirs


def test_the_worker_changelog_is_made_compacted_only(kafka_broker: Any, tmp_path: Path) -> None:
    settings = Settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"p{uuid.uuid4().hex[:8]}.", home=tmp_path,
                        partitions=1)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    changelog = changelog_topic(settings)
    made = NewTopic(changelog, 1, 1, config={"cleanup.policy": "compact,delete", "retention.ms": "60000"})
    for fut in admin.create_topics([made]).values():
        fut.result(timeout=30)  # altered by hand: session state would be deleted after a minute
    ensure_topics(settings)
    got = configs(admin, changelog)
    assert got["cleanup.policy"] == "compact"
    assert int(got["max.message.bytes"]) == state_record_limit(settings)


def test_the_worker_changelog_exists_before_any_worker_starts(kafka_broker: Any, tmp_path: Path) -> None:
    # a worker's group leader assigns changelog partitions only for a topic its metadata holds
    settings = Settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"p{uuid.uuid4().hex[:8]}.", home=tmp_path,
                        partitions=3)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    changelog = changelog_topic(settings)
    assert changelog not in admin.list_topics(timeout=10).topics
    names = ensure_topics(settings)
    assert changelog not in names  # (the topics a user writes or reads)
    topic = admin.list_topics(timeout=10).topics[changelog]
    assert len(topic.partitions) == settings.partitions
    got = configs(admin, changelog)
    assert got["cleanup.policy"] == "compact"
    assert int(got["max.message.bytes"]) == state_record_limit(settings)
    ensure_topics(settings)  # again: nothing to do, no error


def test_replication_settings_reach_every_topic(kafka_broker: Any, tmp_path: Path) -> None:
    settings = Settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"p{uuid.uuid4().hex[:8]}.", home=tmp_path,
                        partitions=1, topic_min_insync_replicas=1)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    names = [*ensure_topics(settings), changelog_topic(settings)]
    for name in names:
        assert configs(admin, name)["min.insync.replicas"] == "1", name
    md = admin.list_topics(timeout=10)
    assert settings.topic_replication_factor is None  # unset: the broker's default.replication.factor (1 here)
    assert all(len(p.replicas) == 1 for n in names for p in md.topics[n].partitions.values())
    more = settings.model_copy(update={"topic_prefix": f"q{uuid.uuid4().hex[:8]}.", "topic_replication_factor": 3})
    with pytest.raises(RuntimeError, match="cannot create topic .*[Rr]eplication factor"):
        ensure_topics(more)  # one broker cannot hold three replicas: refused with the broker's reason
