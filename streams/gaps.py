"""Offset-gap guard: no raw record is skipped because Faust never delivered it.

Why: faust-streaming's consumer can lose a record around a rebalance. Its fetcher
keeps delivering messages fetched under the old consumer generation, the stream
skips them, and the fetcher's read offset moves past the refetched copies; then
the next acked offset is committed over the hole (its gap check tolerates one
missing offset). Seen in our kill -9 tests about 1 run in 3 under load.

Contract: :meth:`GapGuard.admit` is called with one partition's messages of a
batch, in offset order, before they are processed. The raw topic's offsets are
contiguous (no transactions, no compaction), so a message above the next offset
Faust should deliver (after an assignment, the group's committed offset; then
one past the highest delivered) means records were never delivered. Such a
hole also stalls Faust's commits for good (its acked offsets never become
contiguous), so every restart would replay from there. Then ``admit``:

* reads the missing records straight from the broker (a consumer of no group, offsets
  ``expected .. first delivered - 1``) and returns them, in offset order, before the
  messages Faust did deliver;
* tells Faust they are done through its own gap intervals, which it treats as
  committable once an acked offset passes them; that happens only with the acks of
  this batch, after its outputs are confirmed.

Seeking Faust back instead raced its fetch loop: messages fetched before the seek kept
arriving after it and moved Faust's read offset past the hole again, so the re-read
records were dropped once more (a kill -9 test stalled on one partition for 40 s).
The seek remains the fallback when the direct read fails (for ``HOLE_READ_S``):

* returns only the messages before the hole (they are processed and acked);
* marks the others as acked *for Faust only* (``message.acked``), so Faust never
  counts them as processed and cannot commit over the hole;
* seeks the consumer back to the expected offset, so the records are read again;
* drops Faust's own gap intervals at or above the expected offset (Faust treats
  them as committable, which would commit records the refetch has not reached).

When the broker no longer has the records (retention deleted them before they
were processed), the loss is logged as an error and counted in
``offset_gap_records_lost``; processing goes on from what exists. After
``max_attempts`` seeks without progress (at most one per ``RESEEK_S`` for the same
offset: messages queued before a seek keep arriving) the process exits with code 70 without
committing, rather than skip anything silently.

``admit`` waits on the broker (the start offsets after an assignment, a direct read, a seek). A
rebalance that comes meanwhile makes its messages stale: it then admits none and keeps nothing
of what it looked up (the next assignment's lookups start afresh).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rewardflow.core.processor import PartitionProcessor
from rewardflow_streams.metrics import WorkerMetrics

log = logging.getLogger("rewardflow.streams")
_END = 2**63 - 1
RESEEK_S = 1.0
HOLE_READ_S = 30.0


@dataclass(slots=True, eq=False)
class _Refetched:
    """A raw record read directly from the broker, shaped like the Faust messages the agent takes (hashed by
    identity, as they are: Faust's ack looks them up in a set)."""

    tp: Any
    offset: int
    value: bytes | None
    headers: Any
    generation_id: int
    timestamp: float | None = None  # the broker's, in seconds as Faust gives it
    acked: bool = False

    @property
    def topic(self) -> str:
        return str(self.tp.topic)

    @property
    def partition(self) -> int:
        return int(self.tp.partition)


class GapGuard:
    """Detects holes in one worker's raw partitions and has Faust read them again."""

    def __init__(self, app: Any, metrics: WorkerMetrics, committed_of: Callable[[list[Any]], dict[Any, int | None]],
                 log_starts_of: Callable[[list[Any]], dict[Any, int | None]],
                 client_config: dict[str, Any], max_attempts: int = 200) -> None:
        self.app, self.metrics, self.max_attempts = app, metrics, max_attempts
        self.no_hole_read = False  # set by the worker from its fault hooks (tests only)
        self._client_config = client_config  # librdkafka settings of the broker, to read holes directly
        self._committed_of = committed_of  # the group's committed offsets of partitions, from the broker
        self._log_starts_of = log_starts_of  # the first offset each partition still holds, from the broker
        self._looked_up: dict[Any, int] = {}  # start offsets of assigned partitions not delivered yet
        self._attempts: dict[int, int] = {}
        self._next: dict[int, int] = {}  # next offset Faust should deliver, per partition
        self._start: dict[int, int] = {}  # where delivery resumed after the assignment (broker commit)
        self._sought: dict[int, tuple[int, float]] = {}  # partition -> (offset, monotonic time) of the last seek

    def reset(self) -> None:
        """After a rebalance Faust delivers each partition from its committed offset again."""
        self._next.clear()
        self._start.clear()
        self._sought.clear()
        self._looked_up.clear()

    def expected(self, partition: int) -> int | None:
        """The next offset of ``partition`` Faust should deliver, once one batch of it was admitted since
        the assignment; else None (delivery starts at the group's committed offset)."""
        return self._next.get(partition)

    def start_offset(self, partition: int) -> int | None:
        """Where Faust resumed ``partition`` after the assignment (the group's committed offset as
        the broker reported it then): no replay can start before it. None before the first batch."""
        return self._start.get(partition)

    async def admit(self, proc: PartitionProcessor, partition: int, msgs: list[Any]) -> list[Any]:
        """The messages to process now: all of them, or those before the first hole; none when a
        rebalance came while it waited on the broker (nothing of the lookup is kept then)."""
        if not msgs:
            return msgs
        generation = self.app.consumer_generation_id
        nxt = self._next.get(partition)
        if nxt is None:
            start = await self._start_offset(msgs[0].tp)
            if self.app.consumer_generation_id != generation:
                return []  # a rebalance meanwhile: the messages are stale, and so may the lookup be
            nxt = self._start[partition] = start
        self._drop_faust_gaps(msgs[0].tp, nxt)
        admitted: list[Any] = []
        for i, m in enumerate(msgs):
            if m.offset > nxt:
                filled = await self._read_hole(m, nxt)
                if self.app.consumer_generation_id != generation:
                    self._drop_faust_gaps(m.tp, nxt)  # (the hole it registered as done is not done)
                    return []
                if filled is None:  # not readable directly: Faust reads them again after a seek
                    await self._hole(partition, nxt, msgs, i)
                    if self.app.consumer_generation_id != generation:
                        return []
                    self._delivered(partition, admitted, nxt)
                    return admitted
                admitted += filled
            admitted.append(m)
            nxt = max(nxt, m.offset + 1)
        self._delivered(partition, admitted, nxt)
        self._attempts.pop(partition, None)
        self._sought.pop(partition, None)
        return admitted

    def _delivered(self, partition: int, msgs: list[Any], nxt: int) -> None:
        if msgs:
            nxt = max(nxt, max(m.offset for m in msgs) + 1)
        self._next[partition] = nxt

    async def _read_hole(self, m: Any, expected: int) -> list[Any] | None:
        """Records ``expected .. m.offset - 1`` of ``m``'s partition, read straight from the broker
        (a consumer of no group), as messages to process before ``m``; [] when retention deleted
        them (logged and counted); None when they cannot be read now.

        Faust is told they are done through its own gap intervals (offsets it treats as
        committable once an acked offset passes them): they become committable only with the
        acks of this batch, which Faust takes after the batch's outputs are confirmed.
        """
        tp, got = m.tp, m.offset
        earliest = (await self._log_starts([tp])).get(tp)
        if earliest is not None and earliest > expected:
            lost = min(got, earliest) - expected
            self.metrics.counters["offset_gap_records_lost"] += lost
            log.error("%d records of %s[%d] (from offset %d) were deleted by the broker (retention) before "
                      "they were processed; going on from offset %d", lost, tp.topic, tp.partition, expected,
                      min(got, earliest))
            expected = min(got, earliest)
            if expected == got:
                return []
        self.metrics.counters["offset_gaps"] += 1
        log.warning("records %d..%d of %s[%d] never reached the agent (dropped by the Faust consumer, "
                    "usually around a rebalance); reading them directly from the broker",
                    expected, got - 1, tp.topic, tp.partition)
        records = await asyncio.to_thread(self._read_range, tp.topic, tp.partition, expected, got)
        if records is None:
            return None
        gaps = getattr(self.app.consumer, "_gap", None)
        if gaps is not None:
            gaps[tp].addi(expected, got)
            gaps[tp].merge_overlaps()
        return [_Refetched(tp, offset, value, headers, m.generation_id, None if ts is None else ts / 1000)
                for offset, value, headers, ts in records]

    def _read_range(self, topic: str, partition: int, start: int, end: int) -> list[tuple[int, Any, Any, int | None]] | None:
        """Offsets ``start .. end - 1`` of one partition as (offset, value, headers, timestamp ms), or None when they
        do not all arrive within ``HOLE_READ_S`` (blocking; run in a thread)."""
        from confluent_kafka import Consumer, TopicPartition

        if self.no_hole_read:  # fault hook of the tests (rewardflow_streams.faults): exercise the seek
            log.warning("fault hook: records %d..%d of %s[%d] not read directly; seeking instead",
                        start, end - 1, topic, partition)
            return None
        consumer = Consumer({**self._client_config, "group.id": "rewardflow-gap-reader",
                             "enable.auto.commit": False, "enable.partition.eof": False})
        try:
            consumer.assign([TopicPartition(topic, partition, start)])
            out: list[tuple[int, Any, Any, int | None]] = []
            deadline = time.monotonic() + HOLE_READ_S
            while len(out) < end - start and time.monotonic() < deadline:
                for msg in consumer.consume(end - start - len(out), timeout=0.5):
                    offset = msg.offset()
                    if msg.error() is None and offset is not None and start + len(out) == offset < end:
                        kind, ts = msg.timestamp()
                        out.append((offset, msg.value(), msg.headers(), ts if kind else None))
            if len(out) == end - start:
                return out
            log.warning("read %d of records %d..%d of %s[%d] directly; seeking instead",
                        len(out), start, end - 1, topic, partition)
            return None
        except Exception:  # noqa: BLE001 - the seek path remains
            log.warning("reading records %d..%d of %s[%d] directly failed; seeking instead",
                        start, end - 1, topic, partition, exc_info=True)
            return None
        finally:
            consumer.close()

    async def _hole(self, partition: int, expected: int, msgs: list[Any], i: int) -> None:
        """Hold back ``msgs[i:]`` (never acked) and have Faust read from ``expected`` again."""
        tp = msgs[i].tp
        for m in msgs[i:]:
            m.acked = True  # Faust then never acks them: its commit stays below the hole
        sought = self._sought.get(partition)
        if sought is not None and sought[0] == expected and time.monotonic() - sought[1] < RESEEK_S:
            # already reading again from there: messages Faust had queued before that seek keep
            # arriving; seeking again for each of them would restart the re-read every time
            self._drop_faust_gaps(tp, expected)
            return
        n = self._attempts[partition] = self._attempts.get(partition, 0) + 1
        if n > self.max_attempts:
            log.critical("%s[%d]: offset %d still missing after %d seeks; exiting without commit",
                         tp.topic, partition, expected, n - 1)
            os._exit(70)
        # seek_wait runs the seek in Faust's consumer thread: a plain seek() from this loop races
        # aiokafka's fetcher there (seen: KeyError in Fetcher.fetched_records, then a worker crash)
        await self.app.consumer.seek_wait({tp: expected})
        self._sought[partition] = (expected, time.monotonic())
        self._drop_faust_gaps(tp, expected)

    async def _start_offset(self, tp: Any) -> int:
        """Where Faust resumes a partition after an assignment: the group's committed offset, else
        the log start (a partition never committed is read from the beginning).

        Asked of the broker: Faust's own ``_committed_offset`` also moves on a commit that failed
        (see :mod:`rewardflow_streams.commits`); it is only the fallback when the broker cannot say.
        The first partition to ask looks up every assigned partition of its topic not delivered
        yet, in one request each (committed offsets, log starts; :meth:`_log_starts`): asked one
        by one, the first batch after an assignment waited about 0.5 s per partition. The answers
        are kept until each partition's first batch, and dropped at the next assignment (``reset``).
        """
        start = self._looked_up.pop(tp, None)
        if start is not None:
            return start
        generation = self.app.consumer_generation_id
        assigned = self.app.consumer.assignment()
        tps = [tp, *sorted((t for t in assigned if t.topic == tp.topic and t != tp and t.partition not in self._next),
                           key=lambda t: t.partition)]
        committed, earliest = await asyncio.gather(asyncio.to_thread(self._committed_of, tps), self._log_starts(tps))
        faust = getattr(self.app.consumer, "_committed_offset", {})
        found = {}
        for t in tps:
            c = committed.get(t)
            if c is None:
                c = faust.get(t)
            found[t] = max(earliest.get(t) or 0, c or 0)
        # Kept for the other partitions only while the assignment they were read under holds: a
        # rebalance during the lookup ran reset(), and its answers may predate the new commits.
        if self.app.consumer_generation_id == generation:
            self._looked_up.update((t, off) for t, off in found.items() if t != tp)
        return found[tp]

    async def _log_starts(self, tps: list[Any]) -> dict[Any, int | None]:
        """The first offset each of ``tps`` still holds, asked through the worker's AdminClient;
        Faust's consumer is asked only for what the broker did not answer there.

        Faust's ``earliest_offsets`` shares its consumer's connection with the fetches, and the
        broker serves one request of a connection at a time: behind a fetch the broker holds
        (``fetch_max_wait_ms``, 1.5 s, while the partitions fetched have nothing new), a worker's
        first batch after an assignment waited 0.5-1.6 s for the answer.
        """
        starts = await asyncio.to_thread(self._log_starts_of, tps)
        missing = [t for t in tps if starts.get(t) is None]
        if missing:
            starts.update(await self.app.consumer.earliest_offsets(*missing))
        return starts

    def _drop_faust_gaps(self, tp: Any, expected: int) -> None:
        gaps = getattr(self.app.consumer, "_gap", None)
        tree = gaps.get(tp) if gaps is not None else None
        if tree:
            tree.chop(expected, _END)
