"""pytest plugin: ONE real Apache Kafka broker per test session, unique topics per test.

Fixtures:

* ``kafka_broker`` (session): starts a :class:`LocalBroker` on free loopback
  ports with a temporary data dir and the shared jar cache under
  ``settings.home``; yields an object with ``.bootstrap`` (``"127.0.0.1:PORT"``);
  stops it by its PID at the end of the session. With
  ``REWARDFLOW_TEST_KAFKA_BOOTSTRAP`` set, that broker is used instead.
* ``unique_topic`` (function): ``unique_topic(name, partitions=1) -> str``
  creates a uniquely named topic (ready: every partition has a leader) and
  deletes it after the test.
* ``unique_group`` (function): a unique consumer group id.

Tests that use the broker must be marked ``@pytest.mark.kafka``; an unmarked
test that requests ``kafka_broker`` fails (marking is enforced, not hoped for).
Each session records its broker in ``<home>/kafka/test-sessions/``; a broker
orphaned by a killed session (its pytest process is gone) is stopped by its
PID at the next session start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from rewardflow.kafka_local import KafkaLocalError, LocalBroker, PortBusyError
from rewardflow.kafka_local.admin import create_topics, delete_topics, wait_for_metadata
from rewardflow.kafka_local.ports import free_ports
from rewardflow.kafka_local.process import is_broker_process, pid_alive, terminate
from rewardflow.settings import load_settings

TEST_BOOTSTRAP_ENV = "REWARDFLOW_TEST_KAFKA_BOOTSTRAP"


class TopicFactory(Protocol):
    """Type of the ``unique_topic`` fixture."""

    def __call__(self, name: str, partitions: int = 1) -> str: ...


@dataclass(frozen=True)
class SessionBroker:
    """The broker of this test session. ``local`` is None for an external broker."""

    bootstrap: str
    local: LocalBroker | None = None

    @property
    def log_file(self) -> Path | None:
        return self.local.log_file if self.local else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if "kafka_broker" in getattr(item, "fixturenames", ()) and item.get_closest_marker("kafka") is None:
        pytest.fail(f"{item.nodeid} uses the Kafka broker but is not marked @pytest.mark.kafka", pytrace=False)


def _sessions_dir(home: Path) -> Path:
    return home.expanduser() / "kafka" / "test-sessions"


def _stop_orphans(home: Path) -> None:
    """Stop brokers recorded by earlier sessions whose pytest process no longer exists.

    The record names the broker's PID and ``server.properties``; the PID is only
    signalled if it still runs that exact config (see ``is_broker_process``).
    """
    for record_file in _sessions_dir(home).glob("*.json"):
        try:
            record = json.loads(record_file.read_text())
            owner, pid, properties = int(record["owner"]), int(record["pid"]), Path(record["properties"])
        except (OSError, ValueError, KeyError, TypeError):
            record_file.unlink(missing_ok=True)
            continue
        if pid_alive(owner):
            continue
        if is_broker_process(pid, properties):
            terminate(pid, timeout=15)
        record_file.unlink(missing_ok=True)


def _start_local(home: Path, data_dir: Path) -> tuple[LocalBroker, Path]:
    """Start a broker on fresh free ports (3 tries); return it and its session record."""
    for attempt in range(3):
        port, controller_port = free_ports(2)
        broker = LocalBroker(home, port, controller_port, partitions=1, data_dir=data_dir, die_with_parent=True)
        try:
            info = broker.up(timeout=120)
        except PortBusyError:
            if attempt == 2:
                raise
            continue
        record = _sessions_dir(home) / f"{os.getpid()}-{port}.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(
            {"owner": os.getpid(), "pid": info.pid, "properties": str(broker.properties_file)}
        ))
        return broker, record
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionBroker]:
    external = os.environ.get(TEST_BOOTSTRAP_ENV)
    if external:
        try:
            wait_for_metadata(external, timeout=30)
        except KafkaLocalError as exc:
            pytest.fail(f"{TEST_BOOTSTRAP_ENV}={external}: {exc}", pytrace=False)
        yield SessionBroker(external)
        return
    home = load_settings().home
    _stop_orphans(home)
    try:
        broker, record = _start_local(home, tmp_path_factory.mktemp("kafka"))
    except KafkaLocalError as exc:
        pytest.fail(f"cannot start the test Kafka broker: {exc}", pytrace=False)
    try:
        yield SessionBroker(broker.bootstrap, broker)
    finally:
        broker.down(timeout=30)
        record.unlink(missing_ok=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:80] or "t"


@pytest.fixture
def unique_topic(kafka_broker: SessionBroker) -> Iterator[TopicFactory]:
    created: list[str] = []

    def make(name: str, partitions: int = 1) -> str:
        topic = f"test.{_slug(name)}.{uuid.uuid4().hex[:12]}"
        create_topics(kafka_broker.bootstrap, {topic: partitions})
        created.append(topic)
        return topic

    yield make
    with contextlib.suppress(KafkaLocalError):
        delete_topics(kafka_broker.bootstrap, created, timeout=10)


@pytest.fixture
def unique_group(request: pytest.FixtureRequest) -> str:
    return f"test-{_slug(request.node.name)}-{uuid.uuid4().hex[:12]}"
