"""Test-side Kafka I/O of one deployment: raw records in, output rows out (confluent-kafka).

* :class:`RawProducer` writes records to chosen raw partitions and returns their offsets.
* :class:`OutputCollector` reads every output topic from the beginning by
  assignment (no group join to wait for) and keeps the decoded rows by logical
  topic name; :meth:`OutputCollector.until` polls until a predicate holds.
* :func:`read_raw` returns a raw topic's records up to its current end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from rewardflow.kafka import topics as T
from rewardflow.core.ticks import signed_tick
from rewardflow.events.wire import encode_avro, encode_json
from rewardflow.settings import Settings, tick_key

LIBRDKAFKA_LOG = logging.getLogger("tests.streams.librdkafka")  # not stderr: pytest shows it on failure
OUTPUTS = (T.VALID, T.REWARDS, T.WINDOWS, T.DEADLETTERS, T.LATE, T.EXCLUSIONS)
Headers = list[tuple[str, bytes]] | None


def json_record(*events: dict[str, Any]) -> tuple[bytes, Headers]:
    return encode_json(list(events)), [("rf-format", b"json")]


def avro_record(*events: dict[str, Any]) -> tuple[bytes, Headers]:
    return encode_avro(list(events), batch_id="b" if len(events) > 1 else None), [("rf-format", b"avro")]


def tick_record(wm: int, settings: Settings) -> tuple[bytes, Headers]:
    """A tick as the deployment's workers write it: signed with its tick key."""
    return signed_tick(tick_key(settings), settings.topic(T.RAW), wm), [("rf-format", b"tick")]


class RawProducer:
    """Produces to explicit partitions of the raw topic; :meth:`send_many` returns offsets in order."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.topic(T.RAW)
        self._p: Any = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 5,
                                 "enable.idempotence": True, "message.max.bytes": 4_000_000}, logger=LIBRDKAFKA_LOG)

    def send_many(self, records: Sequence[tuple[int, bytes | None, Headers]], key: bytes | None = None) -> list[int]:
        offsets: list[int] = [-1] * len(records)
        errors: list[str] = []

        def done(i: int) -> Callable[[Any, Any], None]:
            def cb(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    offsets[i] = msg.offset()
            return cb

        for i, (partition, value, headers) in enumerate(records):
            self._p.produce(self.topic, value=value, key=key, partition=partition, headers=headers, on_delivery=done(i))
            self._p.poll(0)
        left = self._p.flush(30)
        assert left == 0 and not errors, f"raw produce failed: {errors or left}"
        return offsets

    def send(self, partition: int, value: bytes | None, headers: Headers = None) -> int:
        return self.send_many([(partition, value, headers)])[0]

    def close(self) -> None:
        """Drop the client (librdkafka has no close for producers: it goes with its last reference)."""
        self._p = None


def _assign_from_start(c: Consumer, topics: Sequence[str], partitions: int) -> None:
    c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(partitions)])


class OutputCollector:
    """Every row the worker has emitted so far, by logical output topic, in consumption order."""

    def __init__(self, settings: Settings, group: str, worker: Any = None) -> None:
        self.settings, self.worker = settings, worker  # a worker that dies fails ``until`` at once
        self.rows: dict[str, list[dict[str, Any]]] = {name: [] for name in OUTPUTS}
        self._name = {settings.topic(n): n for n in OUTPUTS}
        self._c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group,
                            "enable.auto.commit": False, "auto.offset.reset": "earliest"}, logger=LIBRDKAFKA_LOG)
        _assign_from_start(self._c, list(self._name), settings.partitions)

    def poll(self, seconds: float) -> int:
        """Consume for ``seconds``; return how many rows arrived."""
        n, deadline = 0, time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for msg in self._c.consume(1000, timeout=min(0.1, left)):
                if msg.error():
                    raise AssertionError(f"output consumer: {msg.error()}")
                rows = orjson.loads(msg.value())
                self.rows[self._name[msg.topic()]].extend(rows)
                n += len(rows)
        return n

    def until(self, predicate: Callable[[OutputCollector], bool], timeout: float, what: str) -> OutputCollector:
        """Poll until ``predicate(self)``; raise AssertionError naming ``what`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if self.worker is not None and not self.worker.alive:
                raise AssertionError(f"the worker exited (code {self.worker.proc.returncode}) while waiting for {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; rows so far: {self.counts()}")
            self.poll(0.2)
        return self

    def settle(self, quiet: float = 1.0, timeout: float = 20.0) -> OutputCollector:
        """Poll until nothing new arrived for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        while self.poll(quiet) and time.monotonic() < deadline:
            pass
        return self

    def counts(self) -> dict[str, int]:
        return {name: len(rows) for name, rows in self.rows.items()}

    def finals(self, request_id: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.rows[T.REWARDS]
                if not r["provisional"] and (request_id is None or r["sample_id"] == request_id)]

    def close(self) -> None:
        self._c.close()


@dataclass(frozen=True, slots=True)
class RawRecord:
    partition: int
    offset: int
    value: bytes | None
    headers: Headers
    timestamp: int | None = None  # the broker's (the raw topic stamps LogAppendTime), ms


def _end_offset(c: Consumer, tp: TopicPartition, timeout: float = 20.0) -> int:
    """The partition's end offset; retried while its leader is not known yet (a topic made a moment ago)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(c.get_watermark_offsets(tp, timeout=10)[1])
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.NOT_LEADER_FOR_PARTITION or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_raw(settings: Settings, timeout: float = 20.0) -> dict[int, list[RawRecord]]:
    """The raw topic from its start to its current end, per partition in offset order (ticks included)."""
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "raw-reader",
                  "enable.auto.commit": False}, logger=LIBRDKAFKA_LOG)
    topic = settings.topic(T.RAW)
    try:
        ends = {p: _end_offset(c, TopicPartition(topic, p)) for p in range(settings.partitions)}
        _assign_from_start(c, [topic], settings.partitions)
        out: dict[int, list[RawRecord]] = {p: [] for p in ends}
        deadline = time.monotonic() + timeout
        while any(len(out[p]) < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"raw topic not read to its end {ends} within {timeout}s"
            for msg in c.consume(1000, timeout=0.2):
                assert not msg.error(), msg.error()
                if msg.offset() < ends[msg.partition()]:
                    out[msg.partition()].append(RawRecord(msg.partition(), msg.offset(), msg.value(), msg.headers(),
                                                          msg.timestamp()[1]))
        return out
    finally:
        c.close()


def stable_members(settings: Settings) -> list[Any]:
    """The members of the workers' consumer group while it is stable; empty while it rebalances or its
    coordinator loads (confluent-kafka's ``MemberDescription``s: ``member_id``, ``assignment``)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.kafka_client_config(), logger=LIBRDKAFKA_LOG)
    group = settings.topic("worker")
    try:
        desc = admin.describe_consumer_groups([group])[group].result(timeout=5)
    except Exception:  # coordinator loading, group rebalancing
        return []
    return list(desc.members) if str(desc.state).split(".")[-1] == "STABLE" else []
