"""The sink's flush: cut due buffers, record ranges, write batches, then commit. Commit is last.

Contract of :meth:`Flusher.maybe_flush`: it returns True when everything
that was due is written and committed, False when ClickHouse was unavailable
(or still in backoff), in which case the cut batches are kept, in order, for
the next attempt, the consumer's partitions are paused and nothing after the
last written batch is committed. It never raises for ClickHouse errors.
Offsets committed are always "one past the last record of a written batch"
of that partition. Blocks for the inserts and a synchronous commit.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from functools import partial

from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, KafkaException, TopicPartition

from rewardflow.clickhouse.batching import Batch, PartitionBuffer, cut
from rewardflow.clickhouse.dsn import Dsn
from rewardflow.clickhouse.errors import ClickHouseUnavailable, clean_message, is_driver_error
from rewardflow.clickhouse.ledger import BatchLedger
from rewardflow.clickhouse.metrics import SinkMetrics
from rewardflow.clickhouse.retry import Backoff
from rewardflow.clickhouse.inflight import ParallelWriter
from rewardflow.clickhouse.writer import Fault

log = logging.getLogger("rewardflow.clickhouse.sink")
TP = tuple[str, int]


class Flusher:
    """Owns the ClickHouse side of the sink: client, ledger, writer, unwritten batches, backoff."""

    def __init__(
        self, dsn: Dsn, metrics: SinkMetrics, batch_rows: int, batch_seconds: float, fault: Fault | None, in_flight: int = 2
    ) -> None:
        self.dsn = dsn
        self.metrics = metrics
        self.batch_rows = batch_rows
        self.batch_seconds = batch_seconds
        self.fault = fault
        self.ledger = BatchLedger()
        self.backoff = Backoff()
        self.unwritten: list[Batch] = []
        self.paused = False
        self._client: Client | None = None  # ledger reads and writes
        self._inserts = ParallelWriter(self._open_client, fault, in_flight)

    def _open_client(self) -> Client:
        from rewardflow.clickhouse.connect import get_client

        return get_client(dsn=self.dsn)

    def _ledger_client(self) -> Client:
        if self._client is None:
            self._client = self._open_client()
        return self._client

    def forget(self, tp: TP) -> None:
        """Drop everything of a revoked partition (uncommitted; its new owner re-reads it)."""
        self.unwritten = [b for b in self.unwritten if (b.topic, b.partition) != tp]
        self.ledger.forget(tp)

    def pending(self, buffers: dict[TP, PartitionBuffer]) -> int:
        """Rows read but not yet written."""
        return sum(b.rows for b in self.unwritten) + sum(b.rows for b in buffers.values())

    def _due_tables(self, buffers: dict[TP, PartitionBuffer], now: float) -> set[str]:
        rows: dict[str, int] = {}
        due: set[str] = set()
        for buf in buffers.values():
            if buf.records:
                rows[buf.table] = rows.get(buf.table, 0) + buf.rows
                if now - buf.since >= self.batch_seconds:
                    due.add(buf.table)
        return due | {t for t, n in rows.items() if n >= self.batch_rows}

    def maybe_flush(self, consumer: Consumer, buffers: dict[TP, PartitionBuffer], now: float, *, force: bool) -> bool:
        """Flush what is due (everything when ``force``); see the module contract."""
        if not self.backoff.due(now):
            return False
        due = {b.table for b in buffers.values() if b.records} if force else self._due_tables(buffers, now)
        if not due and not self.unwritten:
            return True
        try:
            client = self._ledger_client()
            self._cut(consumer, client, buffers, due, now)
            self.ledger.record(client, self.unwritten)
            self.unwritten = [dataclasses.replace(b, recorded=True) for b in self.unwritten]
            self._write(consumer)
        except Exception as exc:
            if not (isinstance(exc, ClickHouseUnavailable) or is_driver_error(exc)):
                raise
            self._unavailable(consumer, exc)
            return False
        self._available(consumer)
        return True

    def _cut(self, consumer: Consumer, client: Client, buffers: dict[TP, PartitionBuffer], due: set[str], now: float) -> None:
        bufs = [(tp, b) for tp, b in buffers.items() if b.records]
        positions = {(p.topic, p.partition): p.offset for p in consumer.position([TopicPartition(*tp) for tp, _ in bufs])}
        for tp, buf in bufs:
            if not self.ledger.loaded(tp):
                self.ledger.load(client, tp, buf.topic_id, buf.records[0].offset)
            pos = positions.get(tp)
            batches = cut(
                buf,
                partial(self.ledger.planned, tp),
                partial(self.ledger.next_start, tp),
                max_rows=self.batch_rows,
                force=buf.table in due,
                position=pos if pos is not None and pos >= 0 else None,
            )
            if batches and buf.records:
                buf.since = now
            self.metrics.replayed_batches += sum(b.recorded for b in batches)
            self.unwritten.extend(batches)

    def _write(self, consumer: Consumer) -> None:
        """Insert every unwritten batch (partitions in parallel), then commit the written prefixes."""
        written: dict[TP, int] = {}
        left: set[int] = set()
        error: ClickHouseUnavailable | None = None
        for chain in self._inserts.write_all(self.unwritten):
            for batch, dead in chain.written:
                self.metrics.rows_written[batch.table] += batch.rows
                self.metrics.batches[batch.table] += 1
                self.metrics.dead_lettered += dead
                written[(batch.topic, batch.partition)] = batch.last + 1
            left.update(id(b) for b in chain.remaining)
            error = error or chain.error
        self.unwritten = [b for b in self.unwritten if id(b) in left]
        if written:
            self._commit(consumer, written)
        if error is not None:
            raise error

    def _commit(self, consumer: Consumer, offsets: dict[TP, int]) -> None:
        try:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
            self.metrics.commits += 1
        except KafkaException as exc:
            # The rows are stored; whoever re-reads them re-cuts the recorded ranges (dropped as duplicates).
            self.metrics.commit_failures += 1
            log.warning("offset commit failed (rows are stored; a re-read is deduplicated): %s", exc)

    def _unavailable(self, consumer: Consumer, exc: BaseException) -> None:
        delay = self.backoff.failed()
        self.metrics.retries += 1
        self.metrics.last_error = clean_message(exc)
        rows = sum(b.rows for b in self.unwritten)
        if self.metrics.unavailable_since is None:
            self.metrics.unavailable_since = time.monotonic()
            log.warning(
                "ClickHouse unavailable (%s) at %s: holding %d rows, offsets not committed; retrying in %.1fs",
                self.metrics.last_error, self.dsn.masked(), rows, delay,
            )
        elif self.backoff.attempts & (self.backoff.attempts - 1) == 0:
            down = time.monotonic() - self.metrics.unavailable_since
            log.warning("ClickHouse still unavailable after %d attempts (%.0fs): %s", self.backoff.attempts, down, self.metrics.last_error)
        if not self.paused:
            consumer.pause(consumer.assignment())
            self.paused = True

    def _available(self, consumer: Consumer) -> None:
        if self.metrics.unavailable_since is not None:
            down = time.monotonic() - self.metrics.unavailable_since
            log.warning("ClickHouse available again after %.1fs and %d retries; resuming", down, self.backoff.attempts)
            self.metrics.unavailable_since = None
        self.backoff.succeeded()
        if self.paused:
            consumer.resume(consumer.assignment())
            self.paused = False

    def close(self) -> None:
        self._inserts.close()
        if self._client is not None:
            self._client.close()
            self._client = None
