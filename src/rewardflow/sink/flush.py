"""The sink's flush: cut due buffers, record ranges, start the inserts, commit what they wrote. Commit is last.

Contract of :meth:`Flusher.maybe_flush`:

* ``force=False`` (the poll loop): collects the inserts that finished and
  commits their written prefixes, then cuts what is due, records the new
  ranges in the ledger and *starts* their inserts in the background (at most
  one chain per partition, :mod:`.inserts`), so the sink reads Kafka while
  ClickHouse parses. It blocks only when more than ``max_pending_rows`` rows
  are read but unwritten (back-pressure), until an insert finished.
* ``force=True`` (flush / close / revoke): the same, then waits until every
  insert finished; returns True when everything was written and committed.

Either way it returns False when ClickHouse was unavailable (or still in
backoff): the unwritten batches stay queued, in order, for the next attempt,
the consumer's partitions are paused and nothing after the last written batch
of a partition is committed. It never raises for ClickHouse errors. Offsets
committed are always "one past the last record of a written batch" of that
partition, and are committed only after that batch's insert returned.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from functools import partial

from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, KafkaException, TopicPartition

from rewardflow.sink.batching import Batch, PartitionBuffer, cut
from rewardflow.clickhouse.dsn import Dsn
from rewardflow.clickhouse.errors import ClickHouseUnavailable, clean_message, is_driver_error
from rewardflow.sink.inflight import ChainResult, ParallelWriter
from rewardflow.sink.ledger import BatchLedger
from rewardflow.sink.metrics import SinkMetrics
from rewardflow.sink.retry import Backoff
from rewardflow.sink.inserts import Inserts
from rewardflow.sink.writer import Fault

log = logging.getLogger("rewardflow.sink.route")
TP = tuple[str, int]


class Flusher:
    """Owns the ClickHouse side of the sink: client, ledger, inserts in flight, backoff."""

    def __init__(
        self, dsn: Dsn, metrics: SinkMetrics, batch_rows: int, batch_seconds: float, fault: Fault | None, in_flight: int = 2
    ) -> None:
        self.dsn = dsn
        self.metrics = metrics
        self.batch_rows = batch_rows
        self.batch_seconds = batch_seconds
        self.max_pending_rows = 4 * batch_rows
        self.fault = fault
        self.ledger = BatchLedger()
        self.backoff = Backoff()
        self.paused = False
        self._client: Client | None = None  # ledger reads and writes
        self._failures = 0  # inserts started before the latest failure prove nothing about recovery
        self.inserts = Inserts(ParallelWriter(self._open_client, fault, in_flight))

    def _open_client(self) -> Client:
        from rewardflow.clickhouse.connect import get_client

        return get_client(dsn=self.dsn)

    def _ledger_client(self) -> Client:
        if self._client is None:
            self._client = self._open_client()
        return self._client

    def drain(self, consumer: Consumer) -> None:
        """Wait for every running insert and commit what it wrote (before a rebalance). Never raises for ClickHouse."""
        while self.inserts.running:
            self._settle(consumer, self.inserts.collect(block=True))

    def forget(self, tp: TP) -> None:
        """Drop everything of a revoked partition (uncommitted; its new owner re-reads it). Call after :meth:`drain`."""
        self.inserts.forget(tp)
        self.ledger.forget(tp)

    def pending(self, buffers: dict[TP, PartitionBuffer]) -> int:
        """Rows read but not yet written."""
        return self.inserts.rows() + sum(b.rows for b in buffers.values())

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
        """Commit finished inserts, start what is due (everything when ``force``); see the module contract."""
        ok = self._settle(consumer, self.inserts.collect())
        if not self.backoff.due(now):
            return False
        due = {b.table for b in buffers.values() if b.records} if force else self._due_tables(buffers, now)
        try:
            if due or self.inserts.queued:
                client = self._ledger_client()
                fresh = self._cut(consumer, client, buffers, due, now)
                self.ledger.record(client, fresh)
                self.inserts.add([dataclasses.replace(b, recorded=True) for b in fresh])
        except Exception as exc:
            if not (isinstance(exc, ClickHouseUnavailable) or is_driver_error(exc)):
                raise
            self._unavailable(consumer, exc)
            return False
        self.inserts.start(self._failures)
        while ok and self.inserts.running and (force or self.pending(buffers) > self.max_pending_rows):
            ok = self._settle(consumer, self.inserts.collect(block=True))
            if ok:
                self.inserts.start(self._failures)
        return ok and not (force and self.inserts.busy)

    def _cut(
        self, consumer: Consumer, client: Client, buffers: dict[TP, PartitionBuffer], due: set[str], now: float
    ) -> list[Batch]:
        bufs = [(tp, b) for tp, b in buffers.items() if b.records]
        positions = {(p.topic, p.partition): p.offset for p in consumer.position([TopicPartition(*tp) for tp, _ in bufs])}
        out: list[Batch] = []
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
            out.extend(batches)
        return out

    def _settle(self, consumer: Consumer, results: list[tuple[int, ChainResult]]) -> bool:
        """Count and commit what finished chains wrote; on an error back off. False if any chain failed.

        ClickHouse counts as available again only when an insert *started after* the
        latest failure succeeded (one already running when it failed proves nothing).
        """
        written: dict[TP, int] = {}
        error: ClickHouseUnavailable | None = None
        for _, chain in results:
            for batch, dead in chain.written:
                self.metrics.rows_written[batch.table] += batch.rows
                self.metrics.batches[batch.table] += 1
                self.metrics.dead_lettered += dead
                written[(batch.topic, batch.partition)] = batch.last + 1
            error = error or chain.error
        if written:
            self._commit(consumer, written)
        if error is not None:
            self._unavailable(consumer, error)
            return False
        if any(tag == self._failures for tag, _ in results):
            self._available(consumer)
        return True

    def _commit(self, consumer: Consumer, offsets: dict[TP, int]) -> None:
        try:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
            self.metrics.commits += 1
        except KafkaException as exc:
            # The rows are stored; whoever re-reads them re-cuts the recorded ranges (dropped as duplicates).
            self.metrics.commit_failures += 1
            log.warning("offset commit failed (rows are stored; a re-read is deduplicated): %s", exc)

    def _unavailable(self, consumer: Consumer, exc: BaseException) -> None:
        self._failures += 1
        delay = self.backoff.failed()
        self.metrics.retries += 1
        self.metrics.last_error = clean_message(exc)
        rows = self.inserts.rows()
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
        """Wait for running inserts (uncommitted), release the threads and connections."""
        self.inserts.writer.close()
        if self._client is not None:
            self._client.close()
            self._client = None
