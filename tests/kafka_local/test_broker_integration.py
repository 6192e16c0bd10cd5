"""The session broker really is Kafka 4.x, and our client stacks work against it.

* confluent-kafka: idempotent produce, consume in a group, commit.
* aiokafka 0.14 directly: plain, idempotent (InitProducerId) and transactional producers.
* faust-streaming 0.15.3: a worker with one agent and one Table consumes, keeps
  state (changelog) and produces; run as a subprocess that stops itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # type: ignore[import-untyped]
from confluent_kafka import Consumer, Producer

from tests.conftest_kafka import SessionBroker, TopicFactory

pytestmark = pytest.mark.kafka


def consume(bootstrap: str, topic: str, group: str, want: int, timeout: float = 60.0) -> list[tuple[str, str]]:
    """Read ``want`` records of ``topic`` from the beginning as (key, value), or fail."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group,
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    got: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            key, value = msg.key(), msg.value()
            got.append((key.decode() if key else "", value.decode() if value else ""))
        if got:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert len(got) >= want, f"only {len(got)} of {want} records from {topic} in {timeout} s"
    return got


def test_confluent_produce_and_consume(
    kafka_broker: SessionBroker, unique_topic: TopicFactory, unique_group: str
) -> None:
    topic = unique_topic("roundtrip", partitions=3)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True})
    sent = [(f"k{i % 4}", f"v{i}") for i in range(40)]
    for key, value in sent:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0

    got = consume(kafka_broker.bootstrap, topic, unique_group, want=len(sent))

    assert sorted(got) == sorted(sent)
    for key in {k for k, _ in sent}:  # per-key order survives partitioning
        assert [v for k, v in got if k == key] == [v for k, v in sent if k == key]


async def _aiokafka_roundtrip(bootstrap: str, topic: str, **producer_kwargs: object) -> list[bytes]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **producer_kwargs)
    await producer.start()
    try:
        if "transactional_id" in producer_kwargs:
            async with producer.transaction():
                for i in range(5):
                    await producer.send(topic, key=b"k", value=f"v{i}".encode())
        else:
            for i in range(5):
                await producer.send_and_wait(topic, key=b"k", value=f"v{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
        isolation_level="read_committed", enable_auto_commit=False,
    )
    await consumer.start()
    try:
        values: list[bytes] = []
        async with asyncio.timeout(30):
            while len(values) < 5:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    values.extend(r.value for r in records if r.value is not None)
        return values
    finally:
        await consumer.stop()


@pytest.mark.parametrize(
    "producer_kwargs",
    [
        pytest.param({}, id="plain"),
        pytest.param({"enable_idempotence": True}, id="idempotent"),
        pytest.param({"transactional_id": "unique"}, id="transactional"),
    ],
)
def test_aiokafka_producers(
    kafka_broker: SessionBroker, unique_topic: TopicFactory, unique_group: str,
    producer_kwargs: dict[str, object],
) -> None:
    """aiokafka's InitProducerId (idempotent and transactional) is accepted by Kafka 4.4."""
    topic = unique_topic("aiokafka", partitions=1)
    if "transactional_id" in producer_kwargs:
        producer_kwargs = {"transactional_id": unique_group}
    values = asyncio.run(_aiokafka_roundtrip(kafka_broker.bootstrap, topic, **producer_kwargs))
    assert values == [f"v{i}".encode() for i in range(5)]


FAUST_APP = '''
import os, signal, threading
import faust

app = faust.App(
    os.environ["SMOKE_APP_ID"],
    broker="kafka://" + os.environ["SMOKE_BOOTSTRAP"],
    store="memory://",
    topic_partitions=2,
    web_enabled=False,
    datadir=os.environ["SMOKE_DATADIR"],
)
source = app.topic(os.environ["SMOKE_IN"], key_serializer="raw", value_serializer="raw")
sink = app.topic(os.environ["SMOKE_OUT"], key_serializer="raw", value_serializer="raw")
counts = app.Table("counts", default=int, partitions=2)


@app.agent(source)
async def count(stream):
    async for key, value in stream.items():
        counts[key.decode()] += 1
        await sink.send(key=key, value=f"{key.decode()}={counts[key.decode()]}".encode())


# Bounded lifetime even if the test runner dies: ask ourselves to shut down.
_timer = threading.Timer(float(os.environ["SMOKE_LIFETIME_S"]), os.kill, (os.getpid(), signal.SIGTERM))
_timer.daemon = True
_timer.start()
'''


@contextmanager
def faust_worker(app_dir: Path, env: dict[str, str], log: Path) -> Iterator[None]:
    """Run the smoke app's worker as a subprocess; SIGTERM it (then SIGKILL) on exit."""
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", "smoke_app", "worker", "-l", "info"],
            cwd=app_dir, env={**os.environ, "PYTHONPATH": str(app_dir), **env},
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        yield
    except AssertionError:
        raise AssertionError(f"faust worker log:\n{log.read_text()[-4000:]}") from None
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def wait_ready(log: Path, since: int, timeout: float = 90.0) -> None:
    """Block until the worker log says ``Worker ready`` after its first ``since`` bytes.

    Records fetched around Faust's start-up rebalances can be skipped (faust #216/#221); seen in
    CI when the second worker got its records while it was still joining.
    """
    deadline = time.monotonic() + timeout
    while b"Worker ready" not in (log.read_bytes()[since:] if log.exists() else b""):
        if time.monotonic() > deadline:
            raise AssertionError(f"the faust worker was not ready after {timeout:.0f} s")
        time.sleep(0.2)


def produce(bootstrap: str, topic: str, keys: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, key in enumerate(keys):
        producer.produce(topic, key=key, value=f"e{i}")
    assert producer.flush(30) == 0


def test_faust_agent_with_table_on_kafka4(
    kafka_broker: SessionBroker, unique_topic: TopicFactory, unique_group: str, tmp_path: Path
) -> None:
    """Agent + Table + changelog work, and a restarted worker recovers the Table from Kafka."""
    source, sink = unique_topic("faust-in", partitions=2), unique_topic("faust-out", partitions=2)
    app_id = f"smoke-{unique_group}"
    (tmp_path / "smoke_app.py").write_text(textwrap.dedent(FAUST_APP))
    env = {
        "SMOKE_APP_ID": app_id, "SMOKE_BOOTSTRAP": kafka_broker.bootstrap, "SMOKE_IN": source,
        "SMOKE_OUT": sink, "SMOKE_DATADIR": str(tmp_path / "data"), "SMOKE_LIFETIME_S": "120",
    }
    bootstrap, log = kafka_broker.bootstrap, tmp_path / "worker.log"
    keys = ["a", "b", "a", "c", "a", "b"]

    with faust_worker(tmp_path, env, log):
        wait_ready(log, 0)
        produce(bootstrap, source, keys)
        first = consume(bootstrap, sink, unique_group + "-out1", want=len(keys), timeout=90)
    assert dict(first) == {"a": "a=3", "b": "b=2", "c": "c=1"}  # last value per key wins
    changelog = consume(bootstrap, f"{app_id}-counts-changelog", unique_group + "-cl", want=len(keys))
    assert len(changelog) >= len(keys)

    logged = log.stat().st_size
    with faust_worker(tmp_path, env, log):  # in-memory store: the Table is rebuilt from the changelog
        wait_ready(log, logged)
        produce(bootstrap, source, ["a", "c"])
        both = consume(bootstrap, sink, unique_group + "-out2", want=len(keys) + 2, timeout=90)
    assert dict(both) == {"a": "a=4", "b": "b=2", "c": "c=2"}

