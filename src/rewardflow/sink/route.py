"""The ClickHouse sink: output topics -> tables, exactly once per row.

Stages, in this order, one thread (arroyo-style; each stage is its own module):

    consume (confluent-kafka, no auto-commit)
      -> decode   (:func:`.decode.line_from_message`: frame check, row count)
      -> batch    (:class:`.batching.PartitionBuffer`, :func:`.batching.cut`)
      -> record   (:class:`.ledger.BatchLedger`: the batch's offset range)
      -> write    (:class:`.writer.BatchWriter`: deduplicated insert, bad rows to dead_letters;
                   :class:`.inflight.ParallelWriter`: in the background, partitions in parallel,
                   each in order, while this thread reads on; :mod:`.inserts`)
      -> commit   (offsets after the last *written* record, synchronously, once its insert returned)

Guarantees:

* Offsets are committed only after ClickHouse confirmed every row before them,
  so a crash at any point loses nothing (records are re-read).
* Re-read records are re-cut into the recorded ranges and re-inserted under
  the same tokens, which ClickHouse drops: each row is stored once (within the
  tables' deduplication window of 10,000 inserts per table; beyond it the
  ReplacingMergeTree key still collapses duplicates, and readers use FINAL).
* A table flushes at the first of ``sink_batch_rows`` rows or
  ``sink_batch_seconds`` since its oldest buffered record; one insert per
  partition range. Per partition, rows are written in offset order.
* ClickHouse unavailable: the pending batches are retried with exponential
  backoff (0.2 s .. 30 s), partitions are paused (the consumer keeps polling,
  so it stays in its group), nothing is committed, and it resumes by itself.
* A row a table rejects goes to ``dead_letters``; its partition moves on.
* Rebalance: inserts in flight are waited for and committed first; then the
  buffers of revoked partitions are dropped uncommitted; their new owner
  re-reads them.
* Memory: at most ~4 x ``sink_batch_rows`` rows are held read but unwritten;
  beyond that :meth:`poll_once` waits for an insert before reading more.

Threads: create it anywhere, then call :meth:`run` (or :meth:`poll_once` in a
loop, then :meth:`close`) from one thread. :meth:`run` returns after
``stop_event`` is set and :meth:`close` flushed and committed what it could.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from rewardflow.sink.batching import PartitionBuffer, Pending
from rewardflow.clickhouse.catalog import table_of_topic
from rewardflow.clickhouse.connect import as_dsn
from rewardflow.clickhouse.enginelock import probe_engine
from rewardflow.clickhouse.errors import EngineBusyError
from rewardflow.sink.metrics import SinkMetrics
from rewardflow.sink.decode import MessageRejected, line_from_message
from rewardflow.sink.flush import Flusher
from rewardflow.sink.config import consumer_config, resolve_topics, topic_ids
from rewardflow.kafka.lag import sink_group
from rewardflow.sink.writer import Fault
from rewardflow.settings import Settings

log = logging.getLogger(__name__)
TP = tuple[str, int]


class RewardSink:
    """Consume the output topics and write them to ClickHouse (see the module doc).

    ``topics``: logical output topics (under ``settings.topic_prefix``), or a
    mapping full topic -> logical topic. ``database`` overrides the DSN's.
    With chDB, the process that runs the sink owns the directory; ``rewardflow run``
    serves the read endpoint (:mod:`rewardflow.readapi`) beside it. ``in_flight``: inserts running at
    once (different partitions; each partition stays in order). ``fault`` is a
    test hook called before every insert. Raises ``SinkConfigError`` (auto-commit configured,
    unknown topic) or ``EngineBusyError`` (chDB directory owned elsewhere).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        topics: Sequence[str] | Mapping[str, str] | None = None,
        group_id: str | None = None,
        database: str | None = None,
        consumer_overrides: Mapping[str, Any] | None = None,
        fault: Fault | None = None,
        in_flight: int = 2,
    ) -> None:
        self.settings = settings
        self.dsn = as_dsn(settings.dsn).with_database(database)
        self.topics = resolve_topics(settings, topics)
        self.metrics = SinkMetrics()
        config = consumer_config(settings, group_id or sink_group(settings), consumer_overrides)
        if self.dsn.embedded and self.dsn.path is not None:
            owner = probe_engine(self.dsn.path)
            if owner is not None and not owner.this_process:
                raise EngineBusyError(f"chDB directory {self.dsn.path} is open in process {owner.pid}; the sink must own it")
        self._flusher = Flusher(self.dsn, self.metrics, settings.sink_batch_rows, settings.sink_batch_seconds, fault, in_flight)
        self._buffers: dict[TP, PartitionBuffer] = {}
        self._topic_ids = topic_ids(settings.kafka_client_config(), list(self.topics))
        self._closed = False
        self._consumer = Consumer(config)
        self._consumer.subscribe(list(self.topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke)
        log.info("sink joining consumer group %s: partitions a stopped sink held come back once the group's "
                 "session timeout passes if it did not leave the group (%.0f s here; the stopped sink's own "
                 "REWARDFLOW_GROUP_SESSION_TIMEOUT_S governs)", config["group.id"],
                 settings.group_session_timeout_s)

    # --- consume + decode + batch --------------------------------------------
    def poll_once(self, timeout: float = 0.1) -> int:
        """Consume what is available (up to ``timeout`` s), buffer it, flush what is due.

        Returns the number of records read. Never raises for ClickHouse being
        down (it retries later); raises ``KafkaException`` for fatal Kafka errors.
        """
        messages: list[Message] = self._consumer.consume(num_messages=10_000, timeout=timeout)
        now = time.monotonic()
        for message in messages:
            self._decode(message, now)
        self.metrics.records_read += len(messages)
        self._flusher.maybe_flush(self._consumer, self._buffers, now, force=False)
        return len(messages)

    def _decode(self, message: Message, now: float) -> None:
        err = message.error()
        if err is not None:
            if err.fatal():
                raise KafkaException(err)
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("kafka: %s", err)
            return
        topic, partition, offset, value = message.topic(), message.partition(), message.offset(), message.value()
        if topic is None or partition is None or offset is None:
            return  # not a record (no error and no position): nothing to store or commit
        logical = self.topics[topic]
        try:
            line = line_from_message(logical, value)
            pending = Pending(offset, line.rows, line.body)
        except MessageRejected as exc:
            pending = Pending(offset, 0, b"", (exc.reason_code, str(exc), value or b""))
        tp = (topic, partition)
        if tp not in self._buffers:
            self._buffers[tp] = PartitionBuffer(topic, partition, table_of_topic(logical).name, self._topic_id(topic))
        self._buffers[tp].add(pending, now)

    def _topic_id(self, topic: str) -> str:
        if not self._topic_ids.get(topic):
            self._topic_ids.update(topic_ids(self.settings.kafka_client_config(), [topic]))
        return self._topic_ids.get(topic, "")

    # --- rebalance --------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("sink assigned %s", _listed(partitions))
        if self._flusher.paused:
            consumer.pause(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._flusher.drain(consumer)  # inserts in flight finish and are committed while we still own them
        for p in partitions:
            tp = (p.topic, p.partition)
            self._buffers.pop(tp, None)
            self._flusher.forget(tp)
        log.info("sink revoked %s (unwritten records dropped; the new owner re-reads them)", _listed(partitions))

    # --- run / shutdown ---------------------------------------------------------
    def flush(self) -> bool:
        """Write and commit everything buffered now (one attempt). True if nothing is left pending."""
        return self._flusher.maybe_flush(self._consumer, self._buffers, time.monotonic(), force=True)

    def run(self, stop_event: threading.Event) -> None:
        """Poll until ``stop_event`` is set, then :meth:`close`. Blocks; for a dedicated thread."""
        try:
            while not stop_event.is_set():
                self.poll_once(timeout=0.2)
        finally:
            self.close()

    def close(self, timeout: float = 30.0) -> None:
        """Flush and commit what can be written within ``timeout`` s, then release everything.

        Records that could not be written stay uncommitted (re-read on restart);
        this is logged, never lost. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        while self._flusher.pending(self._buffers) and time.monotonic() < deadline:
            if self._flusher.maybe_flush(self._consumer, self._buffers, time.monotonic(), force=True):
                break
            time.sleep(0.1)
        left = self._flusher.pending(self._buffers)
        if left:
            log.warning("sink closing with %d rows unwritten; their offsets are not committed and will be re-read", left)
        self._consumer.close()
        self._flusher.close()


def _listed(partitions: Any) -> str:
    """Partitions for a log line: each topic once, with its partition numbers (``t [0, 1, 2]; u [3]``)."""
    by_topic: dict[str, list[int]] = {}
    for p in partitions:
        by_topic.setdefault(p.topic, []).append(p.partition)
    return "; ".join(f"{topic} {sorted(numbers)}" for topic, numbers in sorted(by_topic.items())) or "nothing"
