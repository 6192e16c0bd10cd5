"""Topic administration and readiness probes, on ``confluent_kafka.admin.AdminClient``.

Every function takes a ``bootstrap`` string (``host:port[,host:port]``), builds
a short-lived client, blocks until done or until its ``timeout`` (seconds), and
raises a :class:`KafkaLocalError` subclass on failure. librdkafka's own log
lines (e.g. "Connection refused" while a broker starts) go to the
``rewardflow.kafka_local.librdkafka`` logger instead of stderr.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]  # re-exported from cimpl

from rewardflow.kafka_local.errors import MetadataTimeoutError, TopicError

_LIBRDKAFKA_LOG = logging.getLogger("rewardflow.kafka_local.librdkafka")
_LIBRDKAFKA_LOG.addHandler(logging.NullHandler())


def admin_client(bootstrap: str) -> AdminClient:
    """An AdminClient for ``bootstrap`` whose log lines go to Python logging."""
    return AdminClient({"bootstrap.servers": bootstrap}, logger=_LIBRDKAFKA_LOG)


def metadata_ready(bootstrap: str, timeout: float = 1.0, config: dict[str, Any] | None = None) -> bool:
    """True if a broker at ``bootstrap`` answers a metadata request within ``timeout``; ``config`` is
    the whole client config (security, credentials) when the cluster needs more than the address."""
    try:
        client = admin_client(bootstrap) if config is None else AdminClient(config)
        metadata = client.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(metadata.brokers)


def wait_for_metadata(bootstrap: str, timeout: float = 30.0) -> None:
    """Block until a broker at ``bootstrap`` answers metadata requests.

    Raises :class:`MetadataTimeoutError` if none does within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not metadata_ready(bootstrap, timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            raise MetadataTimeoutError(f"no Kafka broker answered at {bootstrap} within {timeout:.0f} s")
        time.sleep(0.2)


def _kafka_error(exc: BaseException) -> KafkaError | None:
    arg = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def create_topics(
    bootstrap: str,
    topics: Mapping[str, int],
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create ``{name: partitions}`` topics (replication factor 1) and wait until usable.

    Idempotent: a topic that already exists is left as it is (its partition
    count and config are *not* changed). Returns once every topic has a leader
    for every partition, so producing right away succeeds. ``config`` (e.g.
    ``{"cleanup.policy": "compact"}``) applies to every new topic. Raises
    :class:`TopicError` on any other failure, :class:`MetadataTimeoutError`
    when the leaders do not appear within ``timeout`` seconds.
    """
    if not topics:
        return
    new = [NewTopic(name, num_partitions=n, replication_factor=1, config=dict(config or {}))
           for name, n in topics.items()]
    client = admin_client(bootstrap)  # must outlive the futures: its destruction fails them
    futures = client.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            err = _kafka_error(exc)
            if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicError(f"cannot create topic {name!r}: {exc}") from None
        except TimeoutError:
            raise TopicError(f"create topic {name!r}: no answer within {timeout:.0f} s") from None
    _wait_for_leaders(bootstrap, set(topics), timeout)


def _wait_for_leaders(bootstrap: str, names: set[str], timeout: float) -> None:
    client = admin_client(bootstrap)
    deadline = time.monotonic() + timeout
    while True:
        try:
            metadata = client.list_topics(timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            ready = {
                name for name in names
                if (t := metadata.topics.get(name)) is not None and t.error is None and t.partitions
                and all(p.leader >= 0 for p in t.partitions.values())
            }
        except KafkaException:
            ready = set()
        if ready == names:
            return
        if time.monotonic() >= deadline:
            missing = ", ".join(sorted(names - ready))
            raise MetadataTimeoutError(f"topics without a leader after {timeout:.0f} s: {missing}")
        time.sleep(0.1)


def delete_topics(bootstrap: str, names: Iterable[str], timeout: float = 30.0) -> None:
    """Delete topics; idempotent (an unknown topic is not an error).

    Blocks until the controller accepted each deletion (the data is removed
    asynchronously afterwards). Raises :class:`TopicError` on other failures.
    """
    wanted = list(names)
    if not wanted:
        return
    client = admin_client(bootstrap)  # must outlive the futures: its destruction fails them
    futures = client.delete_topics(wanted, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            err = _kafka_error(exc)
            if err is None or err.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise TopicError(f"cannot delete topic {name!r}: {exc}") from None
        except TimeoutError:
            raise TopicError(f"delete topic {name!r}: no answer within {timeout:.0f} s") from None
