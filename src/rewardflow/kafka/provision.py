"""Create the topics a deployment needs (idempotent), with its security settings.

Contract: blocks until every topic exists or ``timeout`` passes; raises
``RuntimeError`` naming the topic on failure. Existing topics keep their
partition count; their record size limit (``max.message.bytes``) is raised to
what the settings need, never lowered, and the raw topic is made to stamp
records with the broker's time (``message.timestamp.type=LogAppendTime``).

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

from rewardflow.kafka import topics as T
from rewardflow.core.config import JoinConfig
from rewardflow.core.limits import EVENT_BYTES, RECORD_SLACK, TURN_BYTES, stored_factor
from rewardflow.core.limits import raw_record_limit as core_raw_record_limit
from rewardflow.settings import Settings

ALL_TOPICS = (T.RAW, *T.OUTPUT_TOPICS)


def raw_record_limit(settings: Settings) -> int:
    """``max.message.bytes`` of the raw topic: a little over the largest record accepted."""
    return core_raw_record_limit(settings.max_record_bytes)


def dead_letter_record_limit(settings: Settings) -> int:
    """``max.message.bytes`` of the dead-letter topic: one dead letter carrying a whole raw record."""
    return raw_record_limit(settings) * 4 // 3 + 2 * RECORD_SLACK


def state_record_limit(settings: Settings) -> int:
    """``max.message.bytes`` of the worker's state changelog: the largest session state the session
    limits allow (:data:`~rewardflow.core.limits.TURN_BYTES` per turn, ``EVENT_BYTES`` per event,
    times :func:`~rewardflow.core.limits.stored_factor` for the finalised turns a held-back window keeps),
    and never below twice the largest raw record."""
    factor = stored_factor(JoinConfig.from_settings(settings))
    need = factor * (settings.max_session_turns * TURN_BYTES + settings.max_session_events * EVENT_BYTES) + RECORD_SLACK
    return max(2 * settings.max_record_bytes, need)


def changelog_topic(settings: Settings) -> str:
    """The name Faust gives the worker's state changelog."""
    return f"{settings.topic('worker')}-join-state-changelog"


def changelog_configs(settings: Settings) -> dict[str, str]:
    """The worker's state changelog's configs: its size limit (:func:`state_record_limit`), and
    ``cleanup.policy=compact`` alone (a ``delete`` policy would drop session state after its
    retention, so a takeover would restore less than the worker had)."""
    isr = {"min.insync.replicas": str(settings.topic_min_insync_replicas)} if settings.topic_min_insync_replicas else {}
    return {"max.message.bytes": str(state_record_limit(settings)), "cleanup.policy": "compact", **isr}


def topic_configs(settings: Settings) -> dict[str, dict[str, str]]:
    """Topic name -> the configs it needs beyond the broker defaults.

    The raw topic is stamped by the broker (``LogAppendTime``): the core bounds every event's time by
    its record's timestamp, which no client can then choose, and a replay reads the same stamps.
    """
    isr = {"min.insync.replicas": str(settings.topic_min_insync_replicas)} if settings.topic_min_insync_replicas else {}
    configs = {settings.topic(n): dict(isr) for n in ALL_TOPICS}
    configs[settings.topic(T.RAW)].update({"max.message.bytes": str(raw_record_limit(settings)),
                                           "message.timestamp.type": "LogAppendTime"})
    configs[settings.topic(T.DEADLETTERS)]["max.message.bytes"] = str(dead_letter_record_limit(settings))
    return configs


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the raw and output topics and the worker's changelog with ``settings.partitions`` and
    ``settings.topic_replication_factor`` replicas (unset: the cluster's default); return the names of
    the raw and output topics.

    Existing topics get the configs :func:`topic_configs` requires (a record size limit is only ever
    raised), and so does the changelog (:func:`changelog_configs`).

    The changelog is created here, before any worker starts, rather than by Faust at a worker's
    start: Faust's group leader hands each raw partition's changelog partition to its owner only
    when the leader's consumer metadata holds the changelog topic, and a consumer that subscribed
    before the topic existed learns of it at its next metadata refresh (minutes later). A member
    that joined meanwhile was given raw partitions without their changelog, and so processed them
    from empty state.
    """
    names = [settings.topic(n) for n in ALL_TOPICS]
    changelog = changelog_topic(settings)
    configs = {**topic_configs(settings), changelog: changelog_configs(settings)}
    client = AdminClient(settings.kafka_client_config())
    replicas = settings.topic_replication_factor or -1  # (-1: the cluster's default.replication.factor)
    new = [NewTopic(n, num_partitions=settings.partitions, replication_factor=replicas, config=configs.get(n, {}))
           for n in (*names, changelog)]
    existing = []
    for name, fut in client.create_topics(new, operation_timeout=timeout, request_timeout=timeout).items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"cannot create topic {name!r}: {exc}") from None
            existing.append(name)
    _apply_configs(client, {n: c for n, c in configs.items() if n in existing}, timeout)
    _wait_visible(client, [*names, changelog], timeout)
    return names


def _apply_configs(client: AdminClient, wanted: dict[str, dict[str, str]], timeout: float) -> None:
    """Set the ``wanted`` configs of existing topics where they differ (``max.message.bytes`` only upwards)."""
    if not wanted:
        return
    alter = []
    for name, current in _describe(client, list(wanted), timeout).items():
        changes = []
        for key, value in wanted[name].items():
            entry = current.get(key)
            have = None if entry is None else entry.value
            if key == "max.message.bytes" and have is not None and int(have) >= int(value):
                continue
            if have != value:
                changes.append(ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET))
        if changes:
            alter.append(ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=changes))
    if not alter:
        return
    for res, fut in client.incremental_alter_configs(alter).items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:
            raise RuntimeError(f"cannot set {[c.name for c in res.incremental_configs]} of topic {res.name!r}: "
                               f"{exc}") from None
    _wait_configs(client, {r.name: {c.name: str(c.value) for c in r.incremental_configs} for r in alter}, timeout)


def _wait_configs(client: AdminClient, wanted: dict[str, dict[str, str]], timeout: float) -> None:
    """Block until the broker describes every topic with the ``wanted`` values (an accepted change
    reaches the broker's view a moment later; records appended before that would miss it)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        described = _describe(client, list(wanted), timeout)
        stale = [name for name, current in described.items()
                 if any(current.get(k) is None or current[k].value != v for k, v in wanted[name].items())]
        if not stale:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic configs not in effect within {timeout:.0f}s: {stale}")
        time.sleep(0.1)


def _describe(client: AdminClient, names: list[str], timeout: float) -> dict[str, dict[str, ConfigEntry]]:
    """Each topic's configs, as the broker describes them.

    A topic another client created a moment ago may not be in the answering broker's metadata yet
    (``UNKNOWN_TOPIC_OR_PART``): asked again until ``timeout``, then that error is raised.
    """
    import time

    deadline = time.monotonic() + timeout
    while True:
        got: dict[str, dict[str, ConfigEntry]] = {}
        for res, fut in client.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, n) for n in names]).items():
            try:
                got[res.name] = fut.result(timeout=timeout)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                unknown = isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                if not unknown or time.monotonic() > deadline:
                    raise RuntimeError(f"cannot describe topic {res.name!r}: {exc}") from None
        if len(got) == len(names):
            return got
        time.sleep(0.1)


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
